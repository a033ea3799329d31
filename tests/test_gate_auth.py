"""The gate authenticates its clients by more than the uid: a process acting
for a sandboxed command has caper's uid (the tracer is caper), so the gate
also wants the token it wrote in the state directory, which no sandbox can
read, and refuses a peer in another pid or mount namespace (any caper
sandbox). A blocked command tries every route to the gate it has."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from caper.front import gate
from helpers.gate import caper, start_gate, stop_gate


def _ask(state: Path, doc: dict, argv_prefix: tuple[str, ...] = ()) -> dict:
    """Send doc to the gate from a fresh process (under argv_prefix) and
    return its answer."""
    # A refused peer is answered at once, unread: the request may meet a
    # closed socket (EPIPE), the refusal is there to read either way.
    code = ("import contextlib, json, socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
            "s.connect(sys.argv[1])\nwith contextlib.suppress(BrokenPipeError):\n"
            "    s.sendall(sys.argv[2].encode() + b'\\n')\nprint(s.makefile().readline())")
    p = subprocess.run([*argv_prefix, sys.executable, "-c", code, str(state / gate.SOCKET),
                        json.dumps(doc)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _gate_up(env, tmp_path) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    state = start_gate(env, ws)
    assert (state / gate.TOKEN).stat().st_mode & 0o777 == 0o600
    return state, ws


def _request(ws: Path, target: Path, env: dict, **extra) -> dict:
    from caper.sandbox.inherit import Caller
    return {"command": f"touch {target}", "approver": "allow",
            "caller": Caller.here(cwd=str(ws), env=env).to_json(), "build": gate.build_id(), **extra}


def _argv_request(ws: Path, target: Path, env: dict, **extra) -> dict:
    """The native client's form of the same run (csrc/client.c)."""
    import base64
    from caper.sandbox.inherit import Caller
    b64 = lambda s: base64.b64encode(s.encode()).decode()
    caller = Caller.here(cwd=str(ws), env=env).to_json()
    caller.update(cwd_b64=b64(caller.pop("cwd")),
                  env_b64=[b64(f"{k}={v}") for k, v in caller.pop("env").items()])
    return {"kind": "argv", "argv_b64": [b64(a) for a in ("run", "--approver", "allow", "-c",
                                                          f"touch {target}")],
            "stdin_b64": "", "caller": caller, "build": gate.build_id(), **extra}


REQUESTS = {"run": _request, "argv": _argv_request}


@pytest.mark.parametrize("kind", list(REQUESTS))
@pytest.mark.parametrize("token", [None, "", "0" * 64])
def test_a_client_of_the_same_uid_without_the_token_is_refused(env, tmp_path, token, kind):
    state, ws = _gate_up(env, tmp_path)
    doc = REQUESTS[kind](ws, tmp_path / "pwned", env)
    if token is not None:
        doc["token"] = token
    answer = _ask(state, doc)
    assert answer["error"].startswith("refused:") and "token" in answer["error"]
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_peer_in_other_namespaces_is_declined_even_with_the_token(env, tmp_path, kind):
    if os.geteuid() != 0:
        pytest.skip("unshare of pid and mount namespaces needs root")
    state, ws = _gate_up(env, tmp_path)
    doc = REQUESTS[kind](ws, tmp_path / "pwned", env, token=(state / gate.TOKEN).read_text())
    answer = _ask(state, doc, ("unshare", "--pid", "--fork", "--mount"))
    # Declined, not run: its command would see the gate's files, not its own
    # (a caper sandbox is such a peer); its client runs it itself.
    assert "namespace" in answer["decline"] and "outcome" not in answer, answer
    assert not (tmp_path / "pwned").exists()
    assert "error" not in _ask(state, doc)      # the same request from here is served


# Inside the sandbox: try each route to the gate's socket, then send a run
# request (the build id the command could compute; the token it can find).
ROUTES = r"""
import json, os, socket, sys
state, doc = sys.argv[1], json.loads(sys.argv[2])
token = ""
for p in (state + "/gate.token", "/proc/self/root" + state + "/gate.token"):
    try:
        token = open(p).read()
    except OSError:
        pass
doc["token"] = token
os.symlink("/proc/self/cwd", "c")
os.symlink(state, "d")
os.makedirs("." + state, exist_ok=True)   # where c/<state> lands in the command's view
names = [state + "/gate.sock", "d/gate.sock", "c/" + os.path.relpath(state, "/") + "/gate.sock",
         "/proc/self/root" + state + "/gate.sock", "/proc/1/cwd/" + state.lstrip("/") + "/gate.sock"]
for name in names:
    try:                                      # make the name the command's own socket first
        socket.socket(socket.AF_UNIX).bind(name)
    except OSError:
        pass
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(name)
        s.sendall(json.dumps(doc).encode() + b"\n")
        s.settimeout(5)
        print(name, "ANSWER", s.recv(4096)[:200])
    except OSError as e:
        print(name, "FAILED", e)
"""


def test_a_blocked_command_cannot_submit_a_run_to_the_gate(env, tmp_path):
    # The gate is the tracer here: its cwd is / and the state directory's
    # name is short enough for a unix socket name.
    state = Path(tempfile.mkdtemp(prefix="sec-tracer-gate-"))
    env = {**env, "CAPER_STATE_DIR": str(state)}
    try:
        _, ws = _gate_up(env, tmp_path)
        (ws / "routes.py").write_text(ROUTES)
        target = tmp_path / "pwned"
        doc = _request(ws, target, env)
        p = caper(env, ws, "--json", "--approver", "block", "-c",
                  f"/usr/bin/python3 routes.py {state} '{json.dumps(doc)}'")
        out = json.loads(p.stdout)
        assert "gate" in out, "the run did not go through the gate"
        assert not target.exists(), out["stdout"]
        assert "ANSWER" not in out["stdout"], out["stdout"]
        assert out["stdout"].count("FAILED") == 5, out["stdout"]
    finally:
        stop_gate(state)
        import shutil
        shutil.rmtree(state, ignore_errors=True)
