"""The resident gate: `caper run` starts it on demand and talks to it over a
unix socket; the results are those of a run in the CLI's own process. It
serves only its owner, uses the caller's environment and cwd, rolls back a
run whose caller went away, steps aside for a newer caper, and exits idle."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from caper.front import gate
from helpers.gate import alive, caper, gate_pid, stop_gate

ROOT = Path(__file__).resolve().parent.parent


def test_cli_through_the_gate_behaves_like_the_cli_alone(env, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    p = caper(env, ws, "--approver", "allow", "-c", "printf 'a\\000\\377'; echo err >&2; "
                                                     "touch made; exit 7")
    assert p.returncode == 7 and p.stdout == b"a\x00\xff"
    assert b"err\n" in p.stderr and b'created file "made"' in p.stderr
    assert (ws / "made").exists()
    state = Path(env["CAPER_STATE_DIR"])
    assert (state / gate.SOCKET).exists() and alive(gate_pid(state))
    j = caper(env, ws, "--json", "--approver", "block", "-c", "rm made")
    doc = json.loads(j.stdout)
    assert j.returncode == 125 and doc["gate"] == gate_pid(state) and not doc["committed"]
    assert doc["report"]["changes"][0] == {**doc["report"]["changes"][0], "path": "made",
                                           "op": "deleted"}
    alone = subprocess.run([sys.executable, "-m", "caper", "run", "--no-gate", "--json",
                            "--approver", "block", "-c", "rm made"], cwd=ws, env=env,
                           capture_output=True)
    other = json.loads(alone.stdout)
    unpid = lambda cs: [{k: v for k, v in c.items() if k != "by"} for c in cs]
    assert "gate" not in other
    assert unpid(other["report"]["changes"]) == unpid(doc["report"]["changes"])


def test_the_gate_uses_the_callers_environment_and_cwd(env, tmp_path):
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    p = caper({**env, "MYVAR": "from-the-caller"}, ws / "sub", "--approver", "allow", "-c",
              "echo $MYVAR > here; pwd")
    assert p.returncode == 0 and p.stdout.decode().strip() == str(ws / "sub")
    assert (ws / "sub" / "here").read_text() == "from-the-caller\n"


def _raw(state: Path, doc: dict) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(state / gate.SOCKET))
    s.sendall(json.dumps({**doc, "build": gate.build_id(),
                          "token": (state / gate.TOKEN).read_text()}).encode() + b"\n")
    return s


def test_a_run_whose_caller_went_away_is_rolled_back(env, gate_ws):
    ws = gate_ws
    state = Path(env["CAPER_STATE_DIR"])
    from caper.sandbox.inherit import Caller
    s = _raw(state, {"command": "sleep 1; touch late", "approver": "allow",
                     "caller": Caller.here(cwd=str(ws), env=env).to_json()})
    s.close()                                   # the hook was killed
    time.sleep(2.5)
    assert not (ws / "late").exists()
    p = caper(env, ws, "--approver", "allow", "-c", "touch fine")     # the gate still serves
    assert p.returncode == 0 and (ws / "fine").exists()


def _answer(s: socket.socket) -> dict:
    with s, s.makefile("rb") as f:
        return json.loads(f.readline())


def test_a_bad_request_is_told_from_a_failure_inside_the_run(env, gate_ws, tmp_path):
    """A malformed option is the request's fault (caper.request.RunRequest),
    named and nothing run; a failure in the run is caper's."""
    ws = gate_ws
    state = Path(env["CAPER_STATE_DIR"])
    from caper.sandbox.inherit import Caller
    good = {"command": "touch made", "approver": "allow",
            "caller": Caller.here(cwd=str(ws), env=env).to_json()}
    for bad, what in ((dict(backend="zfs"), "unknown backend 'zfs'"),
                      (dict(timeout="10"), "timeout must be a positive number"),
                      (dict(allow_nett=False), "unknown field(s): allow_nett"),
                      (dict(caller={"cwd": "relative"}), "caller:")):
        answer = _answer(_raw(state, {**good, **bad}))
        assert answer["error"].startswith("bad request: ") and what in answer["error"], answer
    assert not (ws / "made").exists()
    gone = Caller.here(cwd=str(tmp_path / "gone"), env=env).to_json()
    answer = _answer(_raw(state, {**good, "caller": gone}))
    assert answer["error"].startswith("caper failed: working directory does not exist"), answer
    assert "outcome" in _answer(_raw(state, good)) and (ws / "made").exists()


def test_doctor_runs_its_sandboxed_true_through_the_gate(env, monkeypatch):
    from caper.front import doctor
    for name in ("CAPER_STATE_DIR", "CAPER_GATE_IDLE", "HOME"):
        monkeypatch.setenv(name, env[name])
    [check] = doctor.check_gate()
    assert check.status == doctor.OK and "through the gate (pid" in check.what, check.what


def _wait_for_process(cmdline: bytes) -> None:
    from helpers.hostprocs import pids_with_cmdline
    for _ in range(3000):                       # bounded: 30 s on a loaded machine
        if pids_with_cmdline(cmdline):
            return
        time.sleep(0.01)
    pytest.fail(f"no process {cmdline!r} appeared")


def test_a_long_run_does_not_hold_another_workspaces_lock(env, tmp_path):
    """Runs are threads of the gate, and each sandbox's init is a fork of it:
    init inherited every descriptor the gate had open, other runs' workspace
    flocks included, and held them until its own sandbox ended. A run in
    workspace A that started while a run held workspace B's lock kept B
    locked after that run was done: the next run in B waited for A. Init now
    closes all but its own pipes right after the clone."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert caper(env, b, "--approver", "block", "-c", "true").returncode == 125   # gate up
    tag = str(os.getpid())
    run = lambda ws, cmd: subprocess.Popen([sys.executable, "-m", "caper", "run", "--approver",
                                            "block", "-c", cmd], cwd=ws, env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    b_first = run(b, f"sleep 8.{tag}")           # holds B's workspace lock while it runs
    long_a = None
    try:
        _wait_for_process(f"sleep\0{'8.' + tag}".encode())
        long_a = run(a, f"sleep 60.{tag}")
        _wait_for_process(f"sleep\0{'60.' + tag}".encode())
        # A's sandbox was made while the first B run held its lock (else the test proves nothing).
        assert b_first.poll() is None, "the first run in B ended before A's sandbox started"
        assert b_first.wait(timeout=60) == 125
        assert caper(env, b, "--approver", "block", "-c", "true").returncode == 125
        assert long_a.poll() is None, "the next run in B waited for A's sandbox to end"
    finally:
        for p in (b_first, long_a):
            if p and p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid (setpriv)")
def test_only_the_owner_may_use_the_gate(env, tmp_path):
    # The state dir is 0700 in real use; here the way is opened on purpose
    # (outside pytest's 0700 tmp root) to show the uid check behind it.
    state = Path(tempfile.mkdtemp(prefix="caper-gate-owner-"))
    env = {**env, "CAPER_STATE_DIR": str(state)}
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        assert caper(env, ws, "--approver", "allow", "-c", "true").returncode == 0
        state.chmod(0o755)
        (state / gate.SOCKET).chmod(0o666)
        # The gate answers a stranger at once, unread: the request may meet
        # a closed socket (EPIPE), the refusal is there to read either way.
        probe = ("import socket, sys, contextlib; s = socket.socket(socket.AF_UNIX); "
                 "s.connect(sys.argv[1])\nwith contextlib.suppress(BrokenPipeError): "
                 "s.sendall(b'{}\\n')\nprint(s.recv(4096).decode())")
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              "/usr/bin/python3", "-c", probe, str(state / gate.SOCKET)],
                             capture_output=True, text=True, timeout=30)
        assert "refused: uid 65534" in out.stdout, out.stderr
    finally:
        stop_gate(state)
        shutil.rmtree(state, ignore_errors=True)


def test_a_newer_caper_makes_the_gate_step_aside(env, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    assert caper(env, ws, "--approver", "allow", "-c", "true").returncode == 0
    state = Path(env["CAPER_STATE_DIR"])
    old = gate_pid(state)
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(state / gate.SOCKET))
    s.sendall(json.dumps({"build": "0-other", "token": (state / gate.TOKEN).read_text()}).encode()
              + b"\n")
    assert json.loads(s.makefile().readline()) == {"stale": True}
    s.close()
    deadline = time.monotonic() + 5
    while alive(old) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(old)
    p = caper(env, ws, "--json", "--approver", "allow", "-c", "true")   # a new gate starts
    assert json.loads(p.stdout)["gate"] != old


def test_the_gate_exits_when_idle(env, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    assert caper({**env, "CAPER_GATE_IDLE": "0.5"}, ws, "--approver", "allow", "-c",
                 "true").returncode == 0
    state = Path(env["CAPER_STATE_DIR"])
    pid = gate_pid(state)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid) and not (state / gate.SOCKET).exists()
