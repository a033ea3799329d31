"""Approvers: given what a command did, decide whether its run counts.

- `allow`: commit everything (a safety net that still records what happened).
- `block`: preview: show what would change, commit nothing (like `try -n`).
- `policy`: the offline judge of observed effects (caper/judge/policy.py); it may
  be *unsure*.
- `llm`: an LLM judge (caper/judge/llm.py), configured in config.toml.
- `auto` (the default): policy where it is sure; the LLM, if configured, for
  the rest; else `on_unsure` (block, allow, or ask a human where the host can).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Mapping

from caper.config import Config
from caper.errors import ConfigError
from caper.judge.base import ApprovalRequest, Approver, Decision, resolve_unsure
from caper.judge.llm import LlmApprover
from caper.judge.policy import PolicyApprover
from caper.request import APPROVERS

__all__ = ["APPROVERS", "AllowApprover", "ApprovalRequest", "Approver", "AutoApprover",
           "BlockApprover", "Decision", "blocks_every_credential_read", "get_approver",
           "resolve_unsure"]


@dataclass(frozen=True)
class AllowApprover:
    name: str = "allow"

    def decide(self, request: ApprovalRequest) -> Decision:
        return Decision("allow", "the allow approver commits every run", approver=self.name)


@dataclass(frozen=True)
class BlockApprover:
    name: str = "block"

    def decide(self, request: ApprovalRequest) -> Decision:
        return Decision("block", "preview only: the block approver commits nothing",
                        approver=self.name)


class AutoApprover:
    """policy decides where it is sure; the LLM (if configured) the rest;
    else on_unsure."""
    name = "auto"

    def __init__(self, policy: Approver, llm: Approver | None, on_unsure: str = "block"):
        self.policy, self.llm, self.on_unsure = policy, llm, on_unsure

    def decide(self, request: ApprovalRequest) -> Decision:
        t = time.perf_counter()
        first = self.policy.decide(request)
        steps = (f"policy:{first.decision}:{(time.perf_counter() - t) * 1000:.1f}ms",)
        if first.decision != "unsure":
            return replace(first, steps=steps)
        if self.llm is not None:
            # The LLM sees every change the policy was unsure about, listed
            # even where the budget had aggregated it.
            request = replace(request, report=request.report.pinned(first.flagged),
                              unsure=first.reason, task_names=first.task_names)
            t = time.perf_counter()
            second = self.llm.decide(request)
            steps += (f"llm:{second.decision}:{(time.perf_counter() - t) * 1000:.1f}ms",)
            return replace(second, steps=steps, flagged=first.flagged)
        return replace(resolve_unsure(first, self.on_unsure), steps=steps)


def get_approver(name_or_approver: str | Approver, config: Config | None = None,
                 env: Mapping[str, str] | None = None) -> Approver:
    """env: the caller's environment (the LLM's CAPER_LLM_* settings)."""
    if not isinstance(name_or_approver, str):
        return name_or_approver
    name = name_or_approver
    if name == "allow":
        return AllowApprover()
    if name == "block":
        return BlockApprover()
    if name not in APPROVERS:
        raise ConfigError(f"unknown approver {name!r}; known: {', '.join(APPROVERS)}")
    config = config or Config()
    if name == "policy":
        return PolicyApprover(config.policy)
    llm = LlmApprover.from_config(config.llm, None if env is None else dict(env))
    if name == "llm":
        if llm is None:
            raise ConfigError("--approver llm: no LLM is configured (set [llm] base_url and "
                              "model in config.toml, or CAPER_LLM_BASE_URL and CAPER_LLM_MODEL)")
        return llm
    return AutoApprover(PolicyApprover(config.policy), llm, config.on_unsure)


def blocks_every_credential_read(judge: Approver, on_unsure: str) -> bool:
    """Whether judge, with on_unsure applied to its verdict as the run's is
    (caper.transaction._decide), blocks every run that read a credential
    whatever else it did: then the run is stopped at that read (the tracer's
    stop_at), and nothing the command does after it can carry the value out.

    | judge                    | on_unsure     | a credential read     |
    |--------------------------|---------------|-----------------------|
    | block                    | any           | blocked: stop         |
    | allow                    | any           | committed             |
    | llm, or auto with an LLM | any           | the LLM decides       |
    | policy, auto without LLM | block         | unsure -> block: stop |
    | policy, auto without LLM | allow, ask    | allowed, or a human   |
    | any other (the API's)    | any           | unknown               |

    The policy's verdict on a credential read is at least unsure
    (_Judge.transformed), and no finding turns unsure into allow. A file of
    settings only is no credential read to the policy: the stop's check
    skips those (caper.transaction._credential_stop)."""
    if isinstance(judge, BlockApprover):
        return True
    if isinstance(judge, AutoApprover):
        return judge.llm is None and isinstance(judge.policy, PolicyApprover) and \
            judge.on_unsure == "block" and on_unsure == "block"
    return isinstance(judge, PolicyApprover) and on_unsure == "block"
