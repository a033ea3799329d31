"""The native client (caper_native/caper-client, csrc/client.c): `caper run`
and `caper hook` made in the gate for the cost of an exec. Through the gate
it behaves as the Python CLI does (output, status, the caller's cwd and
environment, the user's permission rules); what the gate does not take, and
everything when no gate runs, it hands to the Python CLI whole (argv, stdin);
a gate that fails after the request was sent is a block, never a retry."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from caper import launch
from caper.front import hooks

from test_gate import _alive, _gate_pid, env  # noqa: F401  (the fixture)

CLIENT = Path(launch.CLIENT)
pytestmark = pytest.mark.skipif(hooks.caper_command() != [str(CLIENT)],
                                reason="caper-client is not built for this Python "
                                       "(python3 caper_native/build.py)")


def client(env, cwd, *args, stdin: bytes | None = None):
    return subprocess.run([str(CLIENT), *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True)


def hook_input(ws: Path, command: str) -> bytes:
    return json.dumps({"session_id": "s-client", "transcript_path": "/nonexistent",
                       "cwd": str(ws), "permission_mode": "default",
                       "hook_event_name": "PreToolUse", "tool_name": "Bash",
                       "tool_input": {"command": command}, "tool_use_id": "t1"}).encode()


@pytest.fixture
def ws(tmp_path):
    d = tmp_path / "ws"
    d.mkdir()
    return d


def start_gate(env, ws) -> int:
    p = client(env, ws, "run", "--approver", "allow", "-q", "-c", "true")   # Python starts it
    assert p.returncode == 0, p.stderr
    return _gate_pid(Path(env["CAPER_STATE_DIR"]))


def test_run_through_the_gate_is_the_clis_run(env, ws):
    gate_pid = start_gate(env, ws)
    sub = ws / "sub"
    sub.mkdir()
    p = client({**env, "CLIENT_PROBE": "x\u00e9"}, sub, "run", "--approver", "allow", "-c",
               "printf 'a\\000\\377'; echo \"$CLIENT_PROBE $(pwd)\" >&2; touch made; exit 7")
    assert p.returncode == 7 and p.stdout == b"a\x00\xff"
    assert f"x\u00e9 {sub}\n".encode() in p.stderr and b'created file "made"' in p.stderr   # workspace: the cwd
    assert (sub / "made").exists()
    j = client(env, ws, "run", "--json", "--approver", "block", "-c", "rm sub/made")
    doc = json.loads(j.stdout)
    assert j.returncode == 125 and doc["committed"] is False and doc["gate"] == gate_pid
    assert (sub / "made").exists()
    assert _alive(gate_pid)


def test_without_a_gate_the_python_cli_runs_it(env, ws):
    p = client({**env, "CAPER_NO_GATE": "1"}, ws, "run", "--json", "--approver", "allow",
               "-c", "echo hi > f")
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["committed"] and "gate" not in doc
    assert (ws / "f").read_text() == "hi\n"
    assert _gate_pid(Path(env["CAPER_STATE_DIR"])) is None


def test_what_the_gate_declines_goes_to_the_python_cli_with_its_stdin(env, ws):
    start_gate(env, ws)
    p = client(env, ws, "run", "--stdin", "--approver", "allow", "-q", "-c", "cat",
               stdin=b"given\n")
    assert p.returncode == 0 and p.stdout == b"given\n", p.stderr
    v = client(env, ws, "--version")
    assert v.returncode == 0 and v.stdout.startswith(b"caper ")


def test_hook_through_the_gate_rewrites_to_the_client_and_keeps_the_users_rules(env, ws):
    start_gate(env, ws)
    p = client(env, ws, "hook", "claude-code", stdin=hook_input(ws, "ls"))
    out = json.loads(p.stdout)["hookSpecificOutput"]
    assert p.returncode == 0 and out["permissionDecision"] == "allow"
    wrapped = shlex.split(out["updatedInput"]["command"])
    assert wrapped[:2] == [str(CLIENT), "run"] and wrapped[-2:] == ["-c", "ls"]
    r = subprocess.run(["bash", "-c", out["updatedInput"]["command"]], cwd=ws, env=env,
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    # The rules are the caller's (its HOME), not the gate's.
    home = Path(env["HOME"]) / "other-home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["Bash(rm:*)"]}}))
    d = client({**env, "HOME": str(home)}, ws, "hook", "claude-code",
               stdin=hook_input(ws, "rm -rf x"))
    out = json.loads(d.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny" and "Bash(rm:*)" in out["permissionDecisionReason"]


def test_hook_without_a_gate_is_answered_by_the_python_hook(env, ws):
    p = client(env, ws, "hook", "claude-code", stdin=hook_input(ws, "ls"))
    out = json.loads(p.stdout)["hookSpecificOutput"]
    assert p.returncode == 0 and out["permissionDecision"] == "allow"
    assert _gate_pid(Path(env["CAPER_STATE_DIR"])) is None
    bad = client(env, ws, "hook", "claude-code", stdin=b"not json")
    assert json.loads(bad.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


def broken_gate(state: Path, answer: bytes | None, got: list) -> socket.socket:
    """A socket of the caller's uid where the gate's is, with a token, that
    takes each request (into got) and answers `answer` (None: never)."""
    state.mkdir(mode=0o700)
    (state / "gate.token").write_text("ab" * 32)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(state / "gate.sock"))
    srv.listen(4)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c, c.makefile("rb") as f:
                got.append(f.readline())
                if answer is None:
                    c.recv(1)            # until the client goes
                else:
                    c.sendall(answer)
    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.mark.parametrize("answer", [b"", b"garbage\n", b'{"exit": 0, "out": 99, "err": 0}\nab'])
def test_a_gate_that_fails_after_the_request_blocks(env, ws, answer):
    """A gate that takes the request and answers nothing, nonsense or a cut
    answer: the run is reported as not known (125), the hook blocks (2), and
    neither is retried in Python (no gate starts)."""
    state, got = Path(env["CAPER_STATE_DIR"]), []
    srv = broken_gate(state, answer, got)
    try:
        r = client(env, ws, "run", "--approver", "allow", "-c", "touch ran")
        h = client(env, ws, "hook", "claude-code", stdin=hook_input(ws, "ls"))
    finally:
        srv.close()
    assert r.returncode == 125 and b"caper: blocked" in r.stderr and r.stdout == b""
    assert h.returncode == 2 and h.stdout == b""
    assert not (ws / "ran").exists() and not (state / "gate.log").exists()
    assert [json.loads(line)["kind"] for line in got] == ["argv", "argv"]


def test_a_hook_whose_gate_never_answers_blocks_at_its_deadline(env, ws):
    """Half the hook's timeout, as the Python hook: an agent runs a
    cancelled hook's call ungated."""
    srv = broken_gate(Path(env["CAPER_STATE_DIR"]), None, [])
    try:
        h = client(env, ws, "hook", "claude-code", "--timeout", "2", stdin=hook_input(ws, "ls"))
    finally:
        srv.close()
    assert h.returncode == 2 and h.stdout == b"" and b"did not finish" in h.stderr


def test_an_unprivileged_user_runs_through_their_own_gate():
    """uid 65534: the client reaches the gate that user started (its own
    socket, token and namespaces), and the run happens there, in a user
    namespace sandbox."""
    from test_rootless import ROOTLESS_VENV, _as_nobody, need_rootless_venv, source_root
    need_rootless_venv()
    base = Path(tempfile.mkdtemp(prefix="caper-rootless-client-"))   # not under root's 0700 tmp
    ws = base / "ws"
    ws.mkdir()
    os.chown(base, 65534, 65534)
    os.chown(ws, 65534, 65534)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "CAPER_STATE_DIR": str(base / "state"),
           "PYTHONPATH": str(source_root())}
    gate = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             ROOTLESS_VENV, "-P", "-m", "caper", "serve", "--idle", "60"],
                            env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        gate.stderr.readline()           # "caper serve: pid ... on <socket>": it listens
        p = _as_nobody(str(source_root() / "caper_native" / "caper-client"), "run", "--json",
                       "--approver", "allow", "-c", "id -u > who", cwd=str(ws), env=env,
                       timeout=120)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["committed"], doc
        assert doc["gate"] == gate.pid
        assert (ws / "who").read_text() == "65534\n"
    finally:
        gate.terminate()
        gate.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
