"""The Python API for agents that embed caper (SWE-agent, OpenHands-style
security analyzers, home-made loops).

    from caper import Gate

    gate = Gate("/path/to/project", session="my-agent-1")
    result = gate.run("make clean && make", task="clean the build artifacts and recompile")
    if result.committed:
        print(result.output)
    else:
        print("blocked:", result.reason)
        print(result.report.card())          # what the command would have done

    result = await gate.arun("pytest -q")    # the same, from async code

A Gate is one agent session on one workspace: the approver sees the
session's history and the circuit breaker counts its blocks. Runs on one
workspace take turns (a lock); `arun` runs in a worker thread, so an event
loop keeps going while the sandbox runs.
"""
from __future__ import annotations

import asyncio
import os
import uuid
from typing import Mapping, Sequence

from caper.transaction import DEFAULT_TIMEOUT_S, RunOutcome, run


class Gate:
    def __init__(self, workspace: str | None = None, *, approver="auto",
                 session: str | None = None, backend: str = "auto",
                 timeout: float = DEFAULT_TIMEOUT_S, config=None,
                 env: Mapping[str, str] | None = None, state_dir: str | None = None,
                 max_memory: int | None = None, allow_net: Sequence[str] = ()):
        self.workspace = os.path.realpath(workspace) if workspace else None
        self.approver = approver
        self.session = session or f"api-{uuid.uuid4().hex[:12]}"
        self.backend, self.timeout = backend, timeout
        self.config, self.env, self.state_dir = config, env, state_dir
        self.max_memory = max_memory   # None: config.toml's, else caper's default
        self.allow_net = tuple(allow_net)  # hosts caper's proxy lets runs reach

    def run(self, command: str | Sequence[str], *, task: str | None = None,
            cwd: str | None = None, timeout: float | None = None,
            workspace: str | None = None) -> RunOutcome:
        """Run the command once in the sandbox; commit it if approved.
        workspace: this call's, instead of the gate's."""
        return run(command, task=task, approver=self.approver,
                   workspace=workspace or self.workspace,
                   backend=self.backend, timeout=timeout or self.timeout,
                   cwd=cwd or self.workspace, env=self.env, state_dir=self.state_dir,
                   config=self.config, session=self.session, max_memory=self.max_memory,
                   allow_net=self.allow_net)

    async def arun(self, command: str | Sequence[str], **kw) -> RunOutcome:
        return await asyncio.to_thread(self.run, command, **kw)
