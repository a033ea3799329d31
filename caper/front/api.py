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
from typing import Sequence

from caper.request import RunRequest
from caper.transaction import RunOutcome, run_request


class Gate:
    def __init__(self, workspace: str | None = None, *, session: str | None = None,
                 config=None, state_dir: str | None = None, **options):
        """options: the defaults of this gate's runs, any of caper.request.OPTIONS
        (approver, backend, timeout, env, max_memory, on_unsure, ...). The
        workspace is also the runs' default cwd."""
        self.workspace = os.path.realpath(workspace) if workspace else None
        self.session = session or f"api-{uuid.uuid4().hex[:12]}"
        self.config, self.state_dir = config, state_dir
        self.options = {"workspace": self.workspace, "cwd": self.workspace,
                        "session": self.session, **options}
        RunRequest("true", **self.options)     # a bad option fails here, not at the first run

    def run(self, command: str | Sequence[str], *, task_from_agent: bool = False,
            **options) -> RunOutcome:
        """Run the command once in the sandbox; commit it if approved.
        options: this call's, instead of the gate's (task, cwd, timeout,
        workspace, ...; None: the gate's). task_from_agent: the task is the
        agent's own statement (MCP's `task` argument), not its user's words:
        evidence for the approver, never licence (as a task read from a
        transcript)."""
        given = {name: value for name, value in options.items() if value is not None}
        if task_from_agent:
            given["task_from_transcript"] = True
        return run_request(RunRequest(command, **{**self.options, **given}),
                           state_dir=self.state_dir, config=self.config)

    async def arun(self, command: str | Sequence[str], **kw) -> RunOutcome:
        return await asyncio.to_thread(self.run, command, **kw)
