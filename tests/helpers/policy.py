"""The policy tests' project: the host trees their runs start from, the run
through caper with the policy approver, and a Report made by hand."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from caper.config import Config
from caper.judge import ApprovalRequest
from caper.judge.policy import PolicyApprover
from caper.report.build import (FileChange, GitLoss, OutputSummary, Processes, Report, RunEnd,
                                Stream)
from caper.transaction import run
from helpers.trees import git

WS, HOME = "/w/proj", "/home/u"


def policy_project(root: Path) -> Path:
    """root/proj (a git project: sources, a Makefile, a tool script, an
    ignored .env and build dir, a SQLite database) and root/home."""
    w = root / "proj"
    (w / "src").mkdir(parents=True)
    for i in range(4):
        (w / "src" / f"m{i}.c").write_text("".join(f"int f{i}_{j}(void) {{ return {j}; }}\n"
                                                   for j in range(8)))
    (w / "Makefile").write_text("build/app: src/m0.c\n\t@mkdir -p build\n\tcc -c -o build/app "
                                "src/m0.c\nclean:\n\trm -rf build\ndistclean:\n\trm -rf build src .git\n")
    (w / "README.md").write_text("# project\n")
    (w / "tool.sh").write_text("#!/bin/sh\n")
    (w / "tool.sh").chmod(0o755)
    (w / ".gitignore").write_text("build/\n.env\nreports/\n")
    (w / ".env").write_text("API_TOKEN=tok-3e4f5a6b7c8d9e0f\n")
    con = sqlite3.connect(w / "app.db")
    con.executescript("CREATE TABLE users(id); CREATE TABLE audit(id);"
                      + "INSERT INTO users VALUES (1);" * 20 + "INSERT INTO audit VALUES (1);" * 20)
    con.commit()
    con.close()
    git(w, "init", "-q")
    git(w, "add", "-A")
    git(w, "commit", "-qm", "init")
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_text("export A=1\n")
    return root


def gate(env: Path, command: str, task: str | None = None, tool: str | None = None, **kw):
    """Run `command` (after writing tool.sh) through caper with the policy approver."""
    ws = env / "proj"
    if tool is not None:
        (ws / "tool.sh").write_text("#!/bin/sh\n" + tool)
    e = {**os.environ, "HOME": str(env / "home")}
    return run(command, task=task, cwd=ws, approver=kw.pop("approver", "policy"), env=e,
               state_dir=str(env / "state"), config=kw.pop("config", Config()), **kw)


def report(*changes: FileChange, git: GitLoss | None = None, network=(), ws=WS) -> Report:
    return Report(command="x", workspace=ws, backend="overlay", end=RunEnd(how="exited", exit_code=0),
                  counts={}, changes=list(changes), git=git, network=list(network),
                  output=OutputSummary(stdout=Stream(bytes=0), stderr=Stream(bytes=0)),
                  processes=Processes(started=1))


def verdict(r: Report, command: str = "./tool.sh", task: str | None = "fix the bug",
            ws: str = WS, home: str = HOME) -> str:
    """The policy's decision on a Report made by hand, as `caper run` asks it."""
    d = PolicyApprover().decide(ApprovalRequest(command, task, r, cwd=ws, workspace=ws, home=home))
    return d.decision


def fc(path: str, op: str = "created", where: str = "untracked", **kw) -> FileChange:
    return FileChange(path=path, op=op, type=kw.pop("type", "file"), where=where, **kw)
