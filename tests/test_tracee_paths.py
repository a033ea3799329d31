"""The tracer resolves the command's unix socket names inside the sandbox.

The attacks of issue 13 §1, run as a blocked `caper run` would be: a name
that means a sandbox path to the command but, resolved in the tracer's own
root, a socket of the host. The command binds the name (making its own socket
there), then connects to it. Before, the tracer looked both up through
/proc/<tid>/root/<name> or /proc/<tid>/cwd/<name>, where an absolute symlink
or the magic link /proc/self/cwd leads into the tracer's world: it recorded
the host's socket as "bound inside" and connected the command to it. Each
attack runs as root and as uid 65534 (user namespace), against a listener the
test owns on the host; the listener must accept nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from caper.transaction import run
from helpers.rootless import NOBODY, need_rootless_venv, run_as_nobody

SYSTEM_PY = "/usr/bin/python3"   # readable by uid 65534, and inside every sandbox

# argv: NAME [SYMLINK TARGET]. Makes the symlink, the directory NAME is in
# (in the sandbox's own view) and a socket bound at NAME, then connects to
# NAME; prints {"bind": ..., "connect": ...} (OK or an errno name), and
# "own_got": what its own socket received when the connect went there.
ATTACK = r"""
import errno, json, os, socket, sys
name = sys.argv[1]
if len(sys.argv) > 3:
    os.symlink(sys.argv[3], sys.argv[2])
out = {}
os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
try:
    os.unlink(name)            # the host's socket, seen through the overlay
except OSError:
    pass
for step in ("bind", "connect"):
    s = socket.socket(socket.AF_UNIX)
    try:
        getattr(s, step)(name)
        out[step] = "OK"
        if step == "connect":
            s.sendall(b"LEAK")
            keep.settimeout(5)
            out["own_got"] = keep.accept()[0].recv(4).decode()
    except OSError as e:
        out[step] = errno.errorcode.get(e.errno, str(e.errno))
    if step == "bind" and out["bind"] == "OK":
        s.listen(1)
        keep = s
print(json.dumps(out))
"""


@pytest.fixture
def host_listener():
    """A host socket in a short directory (names stop at 107 bytes) of uid
    65534's: its rootless sandbox overlays the directory writable, so that
    the command can bind its own socket at the host socket's path."""
    d = tempfile.mkdtemp(prefix="sec-tracer-")
    os.chmod(d, 0o755)
    os.chown(d, NOBODY, NOBODY)
    path = os.path.join(d, "h.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o777)
    s.listen(8)
    s.settimeout(0.5)   # a connection is queued at once; the wait only bounds a miss
    yield s, path
    s.close()
    shutil.rmtree(d, ignore_errors=True)


def _accepted(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        return False
    conn.close()
    return True


def _attacks(host: str, tracer_cwd: str) -> dict[str, list[str]]:
    """argv of the attack for each route, given where the host socket is and
    the tracer's cwd."""
    return {
        # ln -s /host/dir d; bind("d/h.sock"): the tracee makes /host/dir in
        # its own view, the tracer reads d as the host's directory.
        "absolute-symlink": ["d/h.sock", "d", os.path.dirname(host)],
        # the same, through an absolute name whose middle is the symlink
        "absolute-name-through-symlink": [os.path.join("{ws}", "d", "h.sock"), "d",
                                          os.path.dirname(host)],
        # ln -s /proc/self/cwd c; bind("c/../../host"): to the tracer, c is its
        # own cwd (the gate's is /, and its socket is below it)
        "proc-self-cwd": ["c/" + os.path.relpath(host, tracer_cwd), "c", "/proc/self/cwd"],
        # a magic link straight in the name
        "proc-self-root": ["/proc/self/root" + host],
    }


def _argv(route: list[str], ws: str) -> str:
    args = [a.replace("{ws}", ws) for a in route]
    return " ".join([SYSTEM_PY, "attack.py", *(f"'{a}'" for a in args)])


ROUTES = ["absolute-symlink", "absolute-name-through-symlink", "proc-self-cwd", "proc-self-root"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_name_the_tracer_would_resolve_to_a_host_socket_never_reaches_it(tmp_path, host_listener,
                                                                         route):
    listener, host = host_listener
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "attack.py").write_text(ATTACK)
    out = run(_argv(_attacks(host, os.getcwd())[route], str(ws)), cwd=str(ws), approver="block",
              state_dir=str(tmp_path / "state"))
    assert not _accepted(listener), "the host listener accepted the sandbox's connection"
    got = json.loads(out.stdout.text())
    assert got["connect"] != "OK" or got["own_got"] == "LEAK", got   # refused, or its own
    assert not out.committed


@pytest.mark.parametrize("route", ROUTES)
def test_rootless_a_name_the_tracer_would_resolve_to_a_host_socket_never_reaches_it(host_listener,
                                                                                  route):
    need_rootless_venv()
    listener, host = host_listener
    ws, state = tempfile.mkdtemp(prefix="sec-tracer-ws-"), tempfile.mkdtemp(prefix="sec-tracer-st-")
    try:
        for p in (ws, state):
            os.chown(p, NOBODY, NOBODY)
        Path(ws, "attack.py").write_text(ATTACK)
        out = run_as_nobody(ws, _argv(_attacks(host, "/")[route], ws), "block", state)
        assert not _accepted(listener), "the host listener accepted the sandbox's connection"
        got = json.loads(out["stdout"])
        assert got["connect"] != "OK" or got["own_got"] == "LEAK", got   # refused, or its own
        assert not out["committed"]
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.parametrize("name", ["own.sock", "sub/own.sock", "d/own.sock", "d/../sub/own.sock",
                                  "{ws}/d/own.sock"])
def test_the_commands_own_sockets_work_by_any_name_inside(tmp_path, name):
    """Relative names, '..', and a symlink to a directory of the sandbox:
    resolved inside the sandbox, they name the command's own socket."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "attack.py").write_text(ATTACK)
    name = name.replace("{ws}", str(ws))
    out = run(f"ln -s sub d && cd . && {SYSTEM_PY} attack.py '{name}'", cwd=str(ws),
              approver="block", state_dir=str(tmp_path / "state"))
    assert json.loads(out.stdout.text()) == {"bind": "OK", "connect": "OK", "own_got": "LEAK"}


# The same names for a datagram: bind, then sendto and sendmsg to the name.
DGRAM_ATTACK = r"""
import errno, json, os, socket, sys
name = sys.argv[1]
if len(sys.argv) > 3:
    os.symlink(sys.argv[3], sys.argv[2])
os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
try:
    os.unlink(name)
except OSError:
    pass
own = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
out = {"bind": "OK"}
try:
    own.bind(name)
except OSError as e:
    out["bind"] = errno.errorcode.get(e.errno, str(e.errno))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for call in ("sendto", "sendmsg"):
    try:
        if call == "sendto":
            s.sendto(b"LEAK", name)
        else:
            s.sendmsg([b"LEAK"], [], 0, name)
        out[call] = "OK"
    except OSError as e:
        out[call] = errno.errorcode.get(e.errno, str(e.errno))
own.setblocking(False)
got = []
try:
    while True:
        got.append(own.recv(16).decode())
except OSError:
    pass
out["own_got"] = got
print(json.dumps(out))
"""


@pytest.mark.parametrize("route", ROUTES)
def test_a_datagram_to_a_name_the_tracer_would_resolve_to_a_host_socket_never_reaches_it(tmp_path,
                                                                                        route):
    d = tempfile.mkdtemp(prefix="sec-tracer-")
    host = os.path.join(d, "h.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(host)
    receiver.setblocking(False)
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "attack.py").write_text(DGRAM_ATTACK)
        out = run(_argv(_attacks(host, os.getcwd())[route], str(ws)), cwd=str(ws),
                  approver="block", state_dir=str(tmp_path / "state"))
        with pytest.raises(BlockingIOError):
            got = receiver.recv(16)
            pytest.fail(f"the host socket received {got!r}")
        sent = json.loads(out.stdout.text())
        for call in ("sendto", "sendmsg"):    # refused, or to the command's own socket
            assert sent[call] != "OK" or sent["own_got"].count("LEAK") == 2, sent
    finally:
        receiver.close()
        shutil.rmtree(d, ignore_errors=True)


def test_a_directory_swapped_while_the_tracer_looks_a_bind_up_unlocks_no_host_socket(tmp_path):
    """The tracer looks the socket a bind made up by name after the call; a
    thread swapping the directory on the way meanwhile made it record the
    host's socket of that name as bound (within tens of tries, caper
    trace), and connect the command to it. A socket older than the bind is
    not the one it made."""
    from caper.sandbox.trace import trace
    d = tempfile.mkdtemp(prefix="sec-tracer-")
    host = os.path.join(d, "h.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(host)
    listener.listen(64)
    listener.settimeout(0.5)
    time.sleep(1.1)     # the host's socket is from an earlier second than any bind
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        fixture = str(Path(__file__).parent / "fixtures" / "race_bind.py")
        _, result = trace([SYSTEM_PY, fixture, d, "3000", host], cwd=str(ws), timeout=120).run()
        assert not _accepted(listener), result.stdout.text()
        assert b"hits 0" in result.stdout.text(), result.stdout.text() + result.stderr.text()
    finally:
        listener.close()
        shutil.rmtree(d, ignore_errors=True)
