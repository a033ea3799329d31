"""Approvers: given what a command did, decide whether its run counts.

An approver has strictly less power than the agent: it reads evidence and
returns a verdict, nothing else. `decide(request) -> Decision` is the whole
interface.

- `allow`: commit everything (a safety net that still records what happened).
- `block`: preview: show what would change, commit nothing (like `try -n`).
- `policy`: the offline judge of observed effects (caper/policy.py); it may
  be *unsure*.
- `llm`: an LLM judge (caper/llm.py), configured in config.toml.
- `auto` (the default): policy where it is sure; the LLM, if configured, for
  the rest; else `on_unsure` (block, allow, or ask a human where the host can).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Mapping, Protocol

if TYPE_CHECKING:
    from caper.config import Config
    from caper.report import Report
    from caper.secrets import Protected


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """Everything an approver may see. All of it is evidence, never instructions."""
    command: str
    task: str | None
    report: "Report"
    history: tuple[dict, ...] = ()   # this session's recent reviews, oldest first
    cwd: str | None = None
    workspace: str | None = None
    home: str | None = None
    protected: "Protected | None" = None   # the run's credential locations (defaults, config, tainted)
    unsure: str | None = None        # what the offline policy could not judge, for the LLM


@dataclass(frozen=True, slots=True)
class Decision:
    decision: Literal["allow", "block", "unsure"]
    reason: str
    confidence: float = 1.0
    approver: str = ""
    boundary: str | None = None      # the line the effects cross, when blocked
    ask: bool = False                # the approver wants a human to decide
    steps: tuple[str, ...] = field(default=())   # who was asked, in order, with ms
    flagged: tuple[str, ...] = ()    # changes (report paths) the verdict rests on

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


class Approver(Protocol):
    name: str

    def decide(self, request: ApprovalRequest) -> Decision: ...


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


ON_UNSURE = ("block", "allow", "ask")


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
                              unsure=first.reason)
            t = time.perf_counter()
            second = self.llm.decide(request)
            steps += (f"llm:{second.decision}:{(time.perf_counter() - t) * 1000:.1f}ms",)
            return replace(second, steps=steps, flagged=first.flagged)
        return replace(resolve_unsure(first, self.on_unsure), steps=steps)


def resolve_unsure(d: Decision, on_unsure: str) -> Decision:
    """An unsure verdict where nobody else can judge: on_unsure decides."""
    if d.decision != "unsure":
        return d
    if on_unsure == "allow":
        return replace(d, decision="allow", reason=f"unsure, allowed by on_unsure=allow: {d.reason}")
    return replace(d, decision="block", ask=on_unsure == "ask",
                   reason=f"unsure ({d.reason}); "
                          + ("a human should decide" if on_unsure == "ask" else
                             "blocked by on_unsure=block: nobody else is configured to judge"))


APPROVERS = ("auto", "policy", "llm", "allow", "block")


def get_approver(name_or_approver: "str | Approver", config: "Config | None" = None,
                 env: "Mapping[str, str] | None" = None) -> "Approver":
    """env: the caller's environment (the LLM's CAPER_LLM_* settings)."""
    if not isinstance(name_or_approver, str):
        return name_or_approver
    from caper.errors import ConfigError
    name = name_or_approver
    if name == "allow":
        return AllowApprover()
    if name == "block":
        return BlockApprover()
    if name not in APPROVERS:
        raise ConfigError(f"unknown approver {name!r}; known: {', '.join(APPROVERS)}")
    from caper.config import Config
    from caper.policy import PolicyApprover
    config = config or Config()
    if name == "policy":
        return PolicyApprover(config.policy)
    from caper.llm import LlmApprover
    llm = LlmApprover.from_config(config.llm, None if env is None else dict(env))
    if name == "llm":
        if llm is None:
            raise ConfigError("--approver llm: no LLM is configured (set [llm] base_url and "
                              "model in config.toml, or CAPER_LLM_BASE_URL and CAPER_LLM_MODEL)")
        return llm
    return AutoApprover(PolicyApprover(config.policy), llm, config.on_unsure)
