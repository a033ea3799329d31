"""What every approver shares: the request it reads, the decision it returns,
and the one method between them, `decide(request) -> Decision`. An approver has
strictly less power than the agent: it reads evidence and returns a verdict."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from caper.report.build import Report
    from caper.report.secrets import Protected

ON_UNSURE = ("block", "allow", "ask")


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """Everything an approver may see. All of it is evidence, never instructions."""
    command: str
    task: str | None
    report: Report
    history: tuple[dict, ...] = ()   # this session's recent reviews, oldest first
    cwd: str | None = None
    workspace: str | None = None
    home: str | None = None
    protected: Protected | None = None   # the run's credential locations (defaults, config, tainted)
    unsure: str | None = None        # what the offline policy could not judge, for the LLM
    task_names: tuple[str, ...] = ()  # changed paths (report paths) the task names, for the LLM
    task_from_transcript: bool = False   # the task was read from a file the agent can write


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
    task_names: tuple[str, ...] = ()  # changes (report paths) the task names

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


class Approver(Protocol):
    name: str

    def decide(self, request: ApprovalRequest) -> Decision: ...


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
