"""A blocked run moves no host file's access time: caper reads host files
because of what the run did (the files it read, for keys; the old versions
of what it changed, for the report; databases), and a read that moved their
atimes would let the run write, bit by bit, what it read into the host, for
anyone to stat. Root and uid 65534."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import caper
from helpers.rootless import NOBODY, nobody_project, run_as_nobody

OLD = 1577836800           # 2020-01-01: older than any mtime, so relatime would move it
# Read a file, list a directory, change a text file and a database: every
# way the run makes caper read the host's version of a path.
COMMAND = ("cat read.txt > /dev/null; ls listed > /dev/null; echo more >> notes.txt; "
           f"{sys.executable} -c \"import sqlite3; c = sqlite3.connect('app.db'); "
           "c.execute('DELETE FROM t'); c.commit()\"")


def _workspace(ws: Path, owner: int | None = None) -> list[Path]:
    (ws / "listed").mkdir()
    (ws / "listed" / "x").write_text("x\n")
    (ws / "read.txt").write_text("read\n")
    (ws / "notes.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    con = sqlite3.connect(ws / "app.db")
    con.execute("CREATE TABLE t(x)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    con.commit()
    con.close()
    paths = [ws / "listed", ws / "read.txt", ws / "notes.txt", ws / "app.db"]
    for p in [ws, *paths, ws / "listed" / "x"]:
        if owner is not None:
            os.chown(p, owner, owner)
        os.utime(p, (OLD, os.stat(p).st_mtime), follow_symlinks=False)
    return paths


def _moved(paths: list[Path]) -> list[str]:
    return [p.name for p in paths if os.stat(p).st_atime != OLD]


def test_a_blocked_run_moves_no_host_access_time(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    paths = _workspace(ws)
    out = caper.run(COMMAND, cwd=str(ws), workspace=str(ws), approver="block",
                    state_dir=str(tmp_path / "state"))
    assert not out.committed and out.report.changes        # it ran and changed things
    assert _moved(paths) == []
    # Natively, the same command moves them: the check can fail.
    subprocess.run(["sh", "-c", COMMAND], cwd=ws, check=True)
    assert set(_moved(paths)) >= {"read.txt", "listed"}


def test_a_blocked_run_moves_no_host_access_time_rootless():
    with nobody_project("caper-atime-") as (ws, state):
        paths = _workspace(ws, owner=NOBODY)
        out = run_as_nobody(ws, COMMAND, "block", state)
        assert not out["committed"]
        assert _moved(paths) == []
