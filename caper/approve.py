"""Approvers: given what a command did, decide whether its run counts.

An approver has strictly less power than the agent: it reads evidence and
returns a verdict, nothing else. `decide(request) -> Decision` is the whole
interface. The trivial ones here are `allow` (commit everything: a safety net
that still records what happened) and `block` (preview: show what would
change, commit nothing, like `try -n`). The judging ones come later.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """Everything an approver may see. All of it is evidence, never instructions."""
    command: str
    task: str | None
    report: dict
    history: tuple[dict, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    decision: Literal["allow", "block"]
    reason: str
    confidence: float = 1.0
    approver: str = ""

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


APPROVERS = {"allow": AllowApprover, "block": BlockApprover}


def get_approver(name_or_approver: "str | Approver") -> "Approver":
    if not isinstance(name_or_approver, str):
        return name_or_approver
    from caper.errors import ConfigError
    try:
        return APPROVERS[name_or_approver]()
    except KeyError:
        raise ConfigError(f"unknown approver {name_or_approver!r}; "
                          f"known: {', '.join(sorted(APPROVERS))}") from None
