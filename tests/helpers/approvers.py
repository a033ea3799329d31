"""Approvers tests plug into a run."""
from __future__ import annotations

from caper.judge.base import Decision


class Unsure:
    """An approver that is unsure and names the file in its reason (as the
    policy and the LLM do)."""
    name = "test"

    def decide(self, request):
        paths = [c.path for c in request.report.changes] or ["the run"]   # none listed: too many
        return Decision("unsure", f"not sure about {paths[0]}", approver="test")
