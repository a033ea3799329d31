"""A run's facts (caper.report.build.RunFacts) without running it: for the
rule tests (policy, report rules, the LLM's prompt), which judge facts and
need no sandbox to get them. The workspace is a real git project and the
run's side a real upper tree, so the report reads both versions of each file
as it does after a real run."""
from __future__ import annotations

from pathlib import Path

from caper.changes import Change
from caper.report.build import RunFacts
from caper.report.content import RunTree
from caper.report.secrets import default_patterns, protected_for
from caper.sandbox.events import End, Output, RunResult
from helpers.trees import git_project


def run_facts(root: Path, files: dict[str, str], command: str, *,
              created: dict[str, str] | None = None, deleted: tuple[str, ...] = (),
              home: str | None = None) -> RunFacts:
    """The facts of `command` in a git project of `files` at root/ws: it
    created the files in `created` (path: text) and deleted the paths in
    `deleted` (a directory with what it held), then exited 0."""
    ws = git_project(root / "ws", files)
    upper = root / "upper"
    upper.mkdir()
    changes = []
    for rel in deleted:
        held = [p for p in files if p.startswith(rel.rstrip("/") + "/")]
        changes.append(Change(str(ws / rel), "deleted", "dir" if held else "file",
                              entries=len(held)))
    for rel, text in (created or {}).items():
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        (upper / rel).write_text(text)
        changes.append(Change(str(ws / rel), "created", "file"))
    empty = Output(b"", b"", 0)
    return RunFacts(command=command, events=[],
                    result=RunResult(End.EXITED, 0, None, empty, empty), changes=changes,
                    workspace=str(ws), tree=RunTree.of([(str(ws), str(upper))]),
                    protected=protected_for(default_patterns(), home, str(ws)), home=home)
