"""kill -9 of caper before the commit: during the command's run, while the
report is built, while the approver thinks. Each ends with the host exactly
as before, no process of the sandbox left, and, after `caper recover`, no
scratch left behind. (Kills during the commit itself: tests/test_commit.py,
at every step.)"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.trees import tree

ROOT = Path(__file__).resolve().parent.parent

SLEEPER = "import time; time.sleep(60)"

# A caper.run in a child process that writes `marker` when it reaches the
# stage under test and then waits there to be killed.
CHILD = r"""
import os, sys, time
import caper.transaction
from caper.judge import Decision
from caper.config import Config
ws, state, stage, marker, sleeper = sys.argv[1:6]

def arrive():
    open(marker, "w").close()
    time.sleep(60)

real_build = caper.transaction.build
def slow_build(facts):
    if stage == "report":
        arrive()
    return real_build(facts)
caper.transaction.build = slow_build

class SlowApprover:
    name = "slow"
    def decide(self, request):
        if stage == "approver":
            arrive()
        return Decision("allow", "fine")

# In the run stage the marker is a word of the sleeping process's command
# line (a file it wrote would land in the overlay, not on the host).
command = ("touch made; echo x >> README; rm -rf src; "
           f"exec {sys.executable} -c '{sleeper}' {marker}") \
    if stage == "run" else "touch made; echo x >> README; rm -rf src"
caper.transaction.run(command, cwd=ws, approver=SlowApprover(), state_dir=state, config=Config(),
                      env={**os.environ, "HOME": os.path.dirname(ws)})
"""


def sandbox_pids(marker: str) -> list[int]:
    """The sandboxed sleeper: python -c SLEEPER MARKER, matched by its last
    two words exactly. caper's command line holds both words too, and so does
    every child caper forks until that child execs: a looser match once
    caught such a passing child and lost it a moment later."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().rstrip(b"\0").split(b"\0")
                if argv[-2:] == [SLEEPER.encode(), marker.encode()]:
                    out.append(int(pid))
            except OSError:
                pass
    return out


@pytest.mark.parametrize("stage", ["run", "report", "approver"])
def test_kill_9_before_the_commit_changes_nothing_and_recover_cleans_up(tmp_path, stage):
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.c").write_text("int a;\n")
    (ws / "README").write_text("hello\n")
    state = tmp_path / "state"
    before = tree(ws)
    marker = str(tmp_path / f"reached-{stage}")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ws), str(state), stage, marker, SLEEPER],
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    arrived = (lambda: sandbox_pids(marker)) if stage == "run" else \
        (lambda: os.path.exists(marker))
    deadline = time.monotonic() + 60
    while not arrived() and time.monotonic() < deadline:
        assert child.poll() is None, "caper ended before the stage under test"
        time.sleep(0.02)
    assert arrived()
    runs = [p for p in (state / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1                                  # the run's scratch, alive
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10
    while sandbox_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_pids(marker) == []                     # the sandbox died with caper
    assert tree(ws) == before
    p = subprocess.run([sys.executable, "-m", "caper", "recover", "--state-dir", str(state)],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert p.returncode == 0 and "removed the scratch of a run that died" in p.stdout
    assert [p.name for p in (state / "runs").iterdir()] == []
    assert tree(ws) == before


def test_a_live_run_is_not_collected(tmp_path):
    """collect_dead_runs spares a run whose owner still holds its lock."""
    from caper.view.overlay import OverlaySnapshot, collect_dead_runs
    snap = OverlaySnapshot.create(str(tmp_path / "state"), userxattr=os.geteuid() != 0)
    try:
        assert collect_dead_runs(str(tmp_path / "state")) == []
        assert os.path.isdir(snap.scratch)
    finally:
        snap.discard()
    assert not os.path.exists(snap.scratch) and not os.path.exists(snap.scratch + ".lock")


def test_security_md_names_only_tests_that_exist():
    """SECURITY.md backs each claim with a test: every test it names is real."""
    import re
    text = (ROOT / "SECURITY.md").read_text()
    names = set(re.findall(r"`(?:tests/[\w/]+\.py::)?(test_\w+)`", text))
    files = re.findall(r"`((?:tests|bench)/[\w/]+\.py)", text)
    source = "".join(p.read_text() for p in (ROOT / "tests").glob("*.py"))
    assert len(names) > 40
    assert [n for n in sorted(names) if f"def {n}(" not in source] == []
    assert [f for f in files if not (ROOT / f).exists()] == []


# --- a full disk during the commit, a damaged state directory -----------------------------------

from caper.config import Config  # noqa: E402
from caper.view.overlay import settle  # noqa: E402
from caper.transaction import run  # noqa: E402
from caper.state import state_dir  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the test mounts a small tmpfs")


@needs_root
def test_a_full_disk_during_the_commit_changes_nothing(tmp_path):
    """The run fits (its upper layer is on caper's state filesystem), the
    commit does not (the workspace's filesystem is 1 MiB): refused, undone."""
    ws = tmp_path / "small"
    ws.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ws)], check=True)
    try:
        (ws / "keep").write_text("precious\n")
        (ws / "old").write_bytes(b"o" * 1000)
        before = tree(ws)
        out = run("rm old; echo changed > keep; head -c 3000000 /dev/zero > big", cwd=ws,
                  workspace=ws, approver="allow", config=Config(),
                  state_dir=str(tmp_path / "state"))
        # Refused before staging (the copy's room is checked first), or undone
        # at the ENOSPC (tests/test_commit.py fills the disk at every step).
        assert not out.committed
        assert "nothing was committed" in out.reason or "No space left on device" in out.reason
        assert tree(ws) == before
        assert [n for n in os.listdir(ws) if n not in ("keep", "old")] == []   # no staging left
    finally:
        settle()        # the sandbox's init, still exiting, holds the tmpfs until reaped
        subprocess.run(["umount", str(ws)], check=True)


@pytest.mark.parametrize("planted", ["garbage", "forged", "under-a-replaced-key"])
def test_a_journal_caper_did_not_write_is_set_aside_and_touches_nothing(tmp_path, planted):
    """Round 4: an agent's file tools can write the state directory. A planted
    journal saying "applied" with the user's project as a layer's upper made
    the next run's recovery empty the project. Journals are written whole by
    rename, so one that does not parse or whose MAC does not verify was not
    written by caper: it is set aside, nothing it names is touched, the run
    goes on and says so. Also when the same file tool first replaced the
    record key with 32 bytes of its own and MAC'd the journal under them
    (the key pinned in the keyring is the key: caper.state.record_key)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep").write_text("precious\n")
    victim = tmp_path / "project"
    victim.mkdir()
    (victim / "work.py").write_text("print('mine')\n")
    state = tmp_path / "state"
    (state / "journal").mkdir(parents=True)
    forged = {"version": 1, "phase": "applied", "units": [], "metas": [], "times": [],
              "layers": [{"mount_point": "/", "dev": os.stat("/").st_dev, "upper": str(victim)}],
              "mac": "0" * 64}
    if planted == "under-a-replaced-key":
        state_dir(str(state))                       # caper's first use: the key is made
        (state / "tasks" / "key").write_bytes(b"J" * 32)
        data = {k: v for k, v in forged.items() if k != "mac"} | {"id": "0123456789ab"}
        body = json.dumps(["journal", "journal", "0123456789ab", data], sort_keys=True,
                          separators=(",", ":"))
        forged = {**data, "mac": hmac.new(b"J" * 32, body.encode(), hashlib.sha256).hexdigest()}
    (state / "journal" / "0123456789ab.json").write_text(
        "{ not json" if planted == "garbage" else json.dumps(forged))
    out = run("echo changed > keep", cwd=ws, workspace=ws, approver="allow", config=Config(),
              state_dir=str(state))
    assert out.committed and (ws / "keep").read_text() == "changed\n"
    assert (victim / "work.py").read_text() == "print('mine')\n"
    assert any("0123456789ab" in n and "not a record caper wrote" in n for n in out.notes), out.notes
    assert (state / "journal" / "0123456789ab.rejected").exists()
    p = subprocess.run([sys.executable, "-m", "caper", "recover", "--state-dir", str(state)],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert p.returncode == 0 and "FAILED" not in p.stdout, p.stdout
    assert run("true", cwd=ws, workspace=ws, approver="allow", config=Config(),
               state_dir=str(state)).committed


def test_a_deleted_state_directory_is_made_again(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    for _ in range(2):
        out = run("echo x >> f", cwd=ws, workspace=ws, approver="allow", config=Config(),
                  state_dir=str(state))
        assert out.committed
        subprocess.run(["rm", "-rf", str(state)], check=True)
    assert (ws / "f").read_text() == "x\nx\n"


def test_a_damaged_session_database_fails_closed(tmp_path):
    from caper.errors import CaperError
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    (state / "sessions.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(CaperError, match="session database"):
        run("touch made", cwd=ws, workspace=ws, approver="allow", config=Config(),
            state_dir=str(state), session="s1")
    assert not (ws / "made").exists()


@needs_root
@pytest.mark.parametrize("what, command", [
    # Both can fill the tmpfs between two of the guard's looks (every
    # DISK_POLL_MS) and exit (dash exits when `: > f` fails): its last look,
    # after the command ended, still ends the run as disk_limit.
    ("bytes", "for i in $(seq 200); do head -c 1000000 /dev/zero > f$i; done; echo never"),
    ("inodes", "mkdir many && cd many && i=0; while :; do : > f$i; i=$((i+1)); done"),
])
def test_a_command_that_fills_the_upper_layer_is_stopped_and_its_scratch_reclaimed(
        tmp_path, what, command):
    """The upper layers grow on caper's state filesystem (here a 64 MiB,
    4,000-inode tmpfs): a command writing without end is killed before it
    fills it, the run is blocked with the reason, and the space comes back."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=4000,mode=0700", "tmpfs",
                    str(state)], check=True)
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        out = run(command, cwd=ws, workspace=ws, approver="allow", config=Config(),
                  state_dir=str(state), timeout=60)
        assert not out.committed and out.report.end.how == "disk_limit"
        assert "fell below" in out.reason and "run-did-not-finish" in out.report.uncertain
        assert list(ws.iterdir()) == []
        settle()                       # the scratch goes after the answer
        v = os.statvfs(state)
        assert v.f_bavail * v.f_frsize > 60 << 20 and v.f_favail > 3900   # reclaimed
    finally:
        settle()        # the sandbox's init, still exiting, holds the tmpfs until reaped
        subprocess.run(["umount", str(state)], check=True)


def test_an_infinite_loop_that_ignores_sigterm_ends_at_the_timeout(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    t = time.monotonic()
    out = run("trap '' TERM INT HUP; touch started; while :; do :; done", cwd=ws, workspace=ws,
              approver="allow", config=Config(), state_dir=str(tmp_path / "state"), timeout=0.5)
    assert time.monotonic() - t < 10
    assert not out.committed and out.report.end.how == "timeout"
    assert "did not complete: timeout" in out.reason and list(ws.iterdir()) == []
