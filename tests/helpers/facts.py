"""A run's facts (caper.report.build.RunFacts) without running it: for the
rule tests (policy, report rules, the LLM's prompt), which judge facts and
need no sandbox to get them. The host trees are real (a git project, a
home), the run's side is a real upper tree per host tree, as the overlay's
layers are, and the changes come from caper's own diff of the two
(plan_changes, as after a real run), so the report reads both versions of
each file as it does after a real run. Deletions and the events (programs,
reads, connects) are written by hand."""
from __future__ import annotations

import os
import shutil
import socket
import sqlite3
from pathlib import Path

from caper.changes import Change, Layer
from caper.commit.plan import plan_changes
from caper.config import Config
from caper.judge import ApprovalRequest, Decision
from caper.judge.base import resolve_unsure
from caper.judge.policy import PolicyApprover
from caper.report.build import Report, RunFacts, build
from caper.report.content import RunTree
from caper.report.secrets import default_patterns, protected_for
from caper.sandbox.events import End, Event, Family, Kind, Output, RunResult
from helpers.trees import git_project

_CLONE = 0x4100   # the clone flags of a forked shell child, as the tracer records them


class Recording:
    """A run told by hand over real host trees: `program` starts a process,
    `read` and `connect` are its calls; `write`, `chmod`, `chown`, `symlink`,
    `sql` and `copy_up` change the run's side of a path, `delete` removes one."""

    def __init__(self, scratch: Path, workspace: Path, home: Path | None = None):
        self.workspace, self.home = workspace, home
        self.layers = [Layer(str(host), str(scratch / f"upper{i}"), os.geteuid() != 0)
                       for i, host in enumerate(p for p in (workspace, home) if p)]
        for layer in self.layers:
            os.makedirs(layer.upper)
        self.events: list[Event] = []
        self.deleted: list[Change] = []
        self._pid = 100

    def host(self, path: str) -> str:
        """The host path of path: ~/x is in the home, a relative path in the workspace."""
        if path.startswith("~/"):
            return os.path.join(str(self.home), path[2:])
        return os.path.join(str(self.workspace), path)

    def _upper(self, host: str) -> tuple[Layer, str]:
        for layer in sorted(self.layers, key=lambda x: len(x.mount_point), reverse=True):
            if host == layer.mount_point or host.startswith(layer.mount_point + "/"):
                return layer, os.path.relpath(host, layer.mount_point)
        raise ValueError(f"{host}: in no tree of this recording")

    def copy_up(self, path: str) -> Path:
        """The run's version of path, copied from the host's (a directory
        without its entries; the directories above it with their mode and
        owner) as the overlay does on a write."""
        host = self.host(path)
        layer, rel = self._upper(host)
        up, lower = Path(layer.upper), Path(layer.mount_point)
        parts = Path(rel).parts
        for i, part in enumerate(parts):
            up, lower = up / part, lower / part
            if os.path.lexists(up):
                continue
            if lower.is_dir() and not lower.is_symlink():
                up.mkdir()
                st = lower.stat()
                os.chown(up, st.st_uid, st.st_gid)
                up.chmod(st.st_mode & 0o7777)
            elif i < len(parts) - 1:
                up.mkdir()                      # a new directory above a new path
            elif os.path.lexists(lower):
                shutil.copy2(lower, up, follow_symlinks=False)
                st = os.lstat(lower)
                os.chown(up, st.st_uid, st.st_gid, follow_symlinks=False)
        return up

    def write(self, path: str, text: str, append: bool = False) -> None:
        with open(self.copy_up(path), "a" if append else "w") as f:
            f.write(text)

    def chmod(self, path: str, mode: int) -> None:
        self.copy_up(path).chmod(mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self.copy_up(path), uid, gid)

    def symlink(self, path: str, target: str) -> None:
        """A new symlink at path (none there before) pointing to target."""
        os.symlink(target, self.copy_up(path))

    def sql(self, path: str, script: str) -> None:
        """Run script on the run's version of the SQLite database at path."""
        con = sqlite3.connect(self.copy_up(path))
        con.executescript(script)
        con.commit()
        con.close()

    def delete(self, path: str) -> None:
        host = self.host(path)
        if os.path.isdir(host) and not os.path.islink(host):
            entries = sum(len(ds) + len(fs) for _, ds, fs in os.walk(host))
            self.deleted.append(Change(host, "deleted", "dir", entries=entries))
        else:
            self.deleted.append(Change(host, "deleted", "file"))

    def _event(self, kind: Kind, pid: int, **kw) -> None:
        self.events.append(Event(kind, len(self.events) + 1, pid, kw.pop("ppid", 0),
                                 len(self.events) * 1000, kw.pop("result", 0), **kw))

    def program(self, *argv: str, parent: int | None = None) -> int:
        """A process that runs argv (its parent's child, or the run's first)."""
        self._pid += 1
        self._event(Kind.PROC_START, self._pid, ppid=parent or 0, syscall=None, arg0=_CLONE)
        self._event(Kind.EXEC, self._pid, ppid=parent or 0, syscall="execve", path=argv[0],
                    argv=list(argv))
        return self._pid

    def wrote(self, pid: int, path: str) -> None:
        """pid opened path for writing (what makes it the change's writer)."""
        host = self.host(path)
        self._event(Kind.OPEN, pid, result=3, syscall="openat",
                    flags=os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, path=host, real=host)

    def read(self, pid: int, path: str) -> None:
        host = self.host(path)
        self._event(Kind.OPEN, pid, result=3, syscall="openat", flags=os.O_RDONLY | os.O_CLOEXEC,
                    path=host, real=host)

    def connect(self, pid: int, address: str, port: int = 0) -> None:
        """A connect that failed, as it does in the sandbox: a unix socket
        (address a path) is not there, an inet address is unreachable."""
        unix = address.startswith("/")
        self._event(Kind.CONNECT, pid, result=-(2 if unix else 101), syscall="connect",
                    flags=Family.UNIX if unix else Family.INET,
                    mode=socket.SOCK_STREAM if unix else socket.SOCK_STREAM | 6 << 8,
                    arg0=port, path=address)

    def facts(self, command: str, stdout: bytes = b"") -> RunFacts:
        """The run's facts: it ran `command` and exited 0, printing stdout."""
        home = str(self.home) if self.home else None
        ws = str(self.workspace)
        return RunFacts(command=command, events=self.events,
                        result=RunResult(End.EXITED, 0, None, Output(stdout, b"", len(stdout)),
                                         Output(b"", b"", 0)),
                        changes=plan_changes(self.layers) + self.deleted, workspace=ws,
                        tree=RunTree.of([(x.mount_point, x.upper) for x in self.layers]),
                        protected=protected_for(default_patterns(), home, ws), home=home)


def judged(facts: RunFacts, task: str | None, raw: bool = False) -> tuple[Decision, Report]:
    """The offline policy's decision on the facts' report, as `caper run`
    asks it with the default config (the run's credential locations; unsure
    is a block unless raw), and the report."""
    report = build(facts)
    d = PolicyApprover().decide(ApprovalRequest(
        facts.command, task, report, cwd=facts.workspace, workspace=facts.workspace,
        home=facts.home, protected=facts.protected))
    return d if raw else resolve_unsure(d, Config().on_unsure), report


def run_facts(root: Path, files: dict[str, str], command: str, *,
              created: dict[str, str] | None = None, deleted: tuple[str, ...] = (),
              home: str | None = None) -> RunFacts:
    """The facts of `command` in a git project of `files` at root/ws: it
    created the files in `created` (path: text) and deleted the paths in
    `deleted` (a directory with what it held), then exited 0."""
    rec = Recording(root, git_project(root / "ws", files))
    for rel in deleted:
        rec.delete(rel)
    for rel, text in (created or {}).items():
        rec.write(rel, text)
    facts = rec.facts(command)
    facts.home = home
    facts.protected = protected_for(default_patterns(), home, facts.workspace)
    return facts
