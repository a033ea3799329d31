"""A run inherits its caller's process context (caper.sandbox.inherit), through the
gate as without it: umask, resource limits, nice value, groups, environment
and locale, cwd, the shell of a command string. A caller in another mount
namespace is not served by the gate (its command runs in its own process,
against its own view of the files). One gate per state directory, however
many clients start at once."""
from __future__ import annotations

import json
import contextlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.gate import alive, stop_gate
from helpers.rootless import NOBODY, ROOTLESS_VENV, need_rootless_venv, source_root

PROBE = ("umask; ulimit -n; ulimit -s; ulimit -c; nice; id -g; id -G; pwd; "
         "echo \"$LANG $INHERIT_PROBE\"; touch f; mkdir d; stat -c '%n %a' f d; rm -r f d")
# The caller's context differs from the gate's in every item: the gate was
# started with the defaults (and sets umask 077 for itself).
CONTEXT = "umask 002; ulimit -n 512; ulimit -s 4096; ulimit -c 0; export LANG=C.UTF-8 INHERIT_PROBE=p"


def _caller(env, cwd: Path, script: str, wrap: list[str] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, "/bin/sh", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _caper_run(extra: str = "") -> str:
    return (f"{shlex.quote(sys.executable)} -m caper run --json --approver allow {extra} "
            f"-c {shlex.quote(PROBE)}")


def _stdout(p: subprocess.CompletedProcess) -> str:
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    assert doc["committed"], doc["reason"]
    return doc["stdout"]


def _three_ways(env, ws: Path, wrap: list[str] = ()) -> tuple[str, str, str]:
    """The probe natively, through the gate, and in the caller's process."""
    native = _caller(env, ws, f"{CONTEXT}; {PROBE}", wrap)
    assert native.returncode == 0, native.stderr
    gated = _caller(env, ws, f"{CONTEXT}; exec {_caper_run()}", wrap)
    alone = _caller({**env, "CAPER_NO_GATE": "1"}, ws, f"{CONTEXT}; exec {_caper_run()}", wrap)
    assert "gate" in json.loads(gated.stdout), gated.stderr
    return native.stdout, _stdout(gated), _stdout(alone)


def test_a_run_inherits_the_callers_context_through_the_gate_and_without(env, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    # The gate first, from a context unlike the caller's.
    assert subprocess.run([sys.executable, "-m", "caper", "run", "--approver", "allow", "-c",
                           "true"], cwd=ws, env=env, capture_output=True).returncode == 0
    native, gated, alone = _three_ways(env, ws, ["nice", "-n", "3"])
    assert gated == alone == native
    lines = native.splitlines()
    assert lines[:5] == ["0002", "512", "4096", "0", "3"] and "f 664" in lines and "d 775" in lines  # not 0600


def test_the_callers_groups_are_the_commands_groups(env, gate_ws):
    """Root's gate gives the command the caller's gid and supplementary groups."""
    ws = gate_ws
    if os.geteuid() != 0:
        pytest.skip("only root can give a process other groups")
    native, gated, alone = _three_ways(env, ws, ["setpriv", "--regid=100", "--groups=4,20"])
    assert gated == alone == native
    assert "100\n" in native and "4 20" in native


def test_a_hook_shaped_call_runs_bash_as_the_agents_tool_would(env, tmp_path):
    """The hooks hand caper the agent's bash text: `source` and [[ ]] work,
    as in the agent's own Bash tool; caper run -c alone keeps /bin/sh."""
    from caper.front import hooks
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "activate").write_text("export VENV=on\n")
    text = "source ./activate && [[ $VENV == on ]] && echo ok"
    native = subprocess.run(["bash", "-c", text], cwd=ws, env=env, capture_output=True, text=True)
    assert native.stdout == "ok\n"
    from caper.front.tasks import new_call
    from caper.state import state_dir
    state = state_dir(env["CAPER_STATE_DIR"])
    for e in (env, {**env, "CAPER_NO_GATE": "1"}):
        def wrapped_of(call):
            return hooks.wrap(text, "sess-1", call)
        wrapped = wrapped_of(new_call(state, "sess-1", text, None, "none", str(ws), wrapped_of))
        assert hooks.is_wrapped(wrapped, "sess-1", state) == text
        p = subprocess.run(["bash", "-c", wrapped.replace(" run ", " run --approver allow ", 1)],
                           cwd=ws, env=e, capture_output=True, text=True, timeout=120)
        assert (p.returncode, p.stdout) == (0, native.stdout), p.stderr
    p = subprocess.run([sys.executable, "-m", "caper", "run", "--approver", "allow", "-c",
                        "[ -n \"$BASH_VERSION\" ] && echo bash || echo sh"], cwd=ws, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.stdout == "sh\n", p.stderr                 # the documented default


def test_a_caller_in_another_mount_namespace_is_not_served_by_the_gate(env, tmp_path):
    """With a directory bind-mounted over the workspace in the caller's own
    mount namespace, the gate would have read and written the host's
    directory; the caller's command runs in the caller's process instead."""
    if os.geteuid() != 0:
        pytest.skip("needs root for unshare -m and a bind mount")
    ws, other = tmp_path / "ws", tmp_path / "other"
    ws.mkdir()
    other.mkdir()
    (ws / "which").write_text("host\n")
    (other / "which").write_text("caller's\n")
    assert subprocess.run([sys.executable, "-m", "caper", "run", "--approver", "allow", "-c",
                           "true"], cwd=ws, env=env, capture_output=True).returncode == 0
    run = (f"{shlex.quote(sys.executable)} -m caper run --json --approver allow "
           f"-c 'cat which; echo out > made'")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                        f"mount --bind {other} {ws} && cd {ws} && {run} && cat made"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout.splitlines()[0])
    assert doc["stdout"] == "caller's\n" and "gate" not in doc
    assert "another mnt namespace" in p.stderr
    assert p.stdout.splitlines()[1] == "out"                # where the caller sees it
    assert not (ws / "made").exists() and (other / "made").exists()


def test_many_clients_at_once_against_no_gate_start_exactly_one(env, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    state = Path(env["CAPER_STATE_DIR"])
    clients = [subprocess.Popen([sys.executable, "-m", "caper", "run", "--json", "--approver",
                                 "allow", "-c", f"echo {i}"], cwd=ws, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(8)]
    gates = set()
    for i, c in enumerate(clients):
        out, err = c.communicate(timeout=300)
        doc = json.loads(out)
        assert doc["stdout"] == f"{i}\n", err
        gates.add(doc.get("gate"))
    assert len(gates) == 1 and None not in gates, gates
    serving = [p for p in os.listdir("/proc") if p.isdigit() and _is_gate_of(int(p), state)]
    assert serving == [str(gates.pop())]
    # A second `caper serve` by hand steps back at once.
    p = subprocess.run([sys.executable, "-m", "caper", "serve", "--state-dir", str(state)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "already serves" in p.stderr


def test_many_gates_started_at_once_leave_exactly_one_serving(env, tmp_path):
    """Each found no socket, unlinked the other's and bound its own: two
    gates served one state directory. The life lock admits one."""
    state = Path(env["CAPER_STATE_DIR"])
    state.mkdir(mode=0o700)
    serves = [subprocess.Popen([sys.executable, "-m", "caper", "serve", "--state-dir",
                                str(state)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        losers = []
        deadline = time.monotonic() + 120
        while len(losers) < 3 and time.monotonic() < deadline:
            losers = [s for s in serves if s.poll() is not None]
            time.sleep(0.1)
        assert len(losers) == 3 and all(s.returncode == 0 for s in losers)
        winner = next(s for s in serves if s.poll() is None)
        assert [p for p in os.listdir("/proc") if p.isdigit()
                and _is_gate_of(int(p), state)] == [str(winner.pid)]
        ws = tmp_path / "ws"
        ws.mkdir()
        p = subprocess.run([sys.executable, "-m", "caper", "run", "--json", "--approver",
                            "allow", "-c", "true"], cwd=ws, env=env, capture_output=True)
        assert json.loads(p.stdout)["gate"] == winner.pid
    finally:
        for s in serves:
            if s.poll() is None:
                s.terminate()
                s.wait(timeout=30)


def _is_gate_of(pid: int, state: Path) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"serve" in argv and os.fsencode(state) in argv and alive(pid)


def test_a_rootless_run_inherits_the_callers_context_through_the_gate_and_without():
    """The same, as uid 65534: the user's own gate, a user namespace sandbox."""
    import shutil
    import tempfile
    need_rootless_venv()
    base = Path(tempfile.mkdtemp(prefix="caper-inherit-"))
    try:
        os.chmod(base, 0o755)
        ws = base / "ws"
        ws.mkdir()
        for d in (base, ws):
            os.chown(d, NOBODY, NOBODY)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "CAPER_STATE_DIR": str(base / "state"),
               "PYTHONPATH": str(source_root()), "CAPER_GATE_IDLE": "30"}
        nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        run = (f"{ROOTLESS_VENV} -m caper run --json --approver allow -c {shlex.quote(PROBE)}")
        assert _caller(env, ws, run, nobody).returncode == 0          # the gate, started plain
        native = _caller(env, ws, f"{CONTEXT}; {PROBE}", nobody)
        gated = _caller(env, ws, f"{CONTEXT}; exec {run}", nobody)
        alone = _caller({**env, "CAPER_NO_GATE": "1"}, ws, f"{CONTEXT}; exec {run}", nobody)
        assert "gate" in json.loads(gated.stdout), gated.stderr
        assert _stdout(gated) == _stdout(alone) == native.stdout
        assert "f 664" in native.stdout.splitlines()
    finally:
        stop_gate(base / "state")
        shutil.rmtree(base, ignore_errors=True)


def test_the_callers_stdin_reaches_the_command_only_where_given(env, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for e in (env, {**env, "CAPER_NO_GATE": "1"}):
        given = subprocess.run([sys.executable, "-m", "caper", "run", "-q", "--stdin",
                                "--approver", "allow", "-c", "cat > got; wc -l < got"],
                               cwd=ws, env=e, input="a\nb\n", capture_output=True, text=True)
        assert given.stdout.strip() == "2" and (ws / "got").read_text() == "a\nb\n", given.stderr
        unset = subprocess.run([sys.executable, "-m", "caper", "run", "-q", "--approver", "allow",
                                "-c", "cat; echo end"], cwd=ws, env=e, input="a\n",
                               capture_output=True, text=True)
        assert unset.stdout == "end\n", unset.stderr      # /dev/null, as documented


def test_a_file_or_fifo_given_as_stdin_is_read_never_reached(env, tmp_path):
    """Round 8: `--stdin < FILE` gave the command the host's own file, open:
    a blocked run chmod'ed, chowned and rewrote it. Anything but an anonymous
    pipe reaches the command as a pipe caper fills with its bytes."""
    ws = tmp_path / "ws"
    ws.mkdir()
    source = tmp_path / "input.txt"
    source.write_text("a\nb\n")
    source.chmod(0o444)
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo, 0o600)
    attack = ("cat > /dev/null; python3 -c 'import os; os.fchmod(0, 0o777)'; "
              "echo PLANTED > /proc/self/fd/0; : > /dev/stdin")
    for path in (source, fifo):
        before = os.stat(path)
        with open(path) if path == source else _fifo_fed(fifo, b"a\nb\n") as stdin:
            p = subprocess.run([sys.executable, "-m", "caper", "run", "-q", "--stdin",
                                "--approver", "block", "-c", attack], cwd=ws,
                               env={**env, "CAPER_NO_GATE": "1"}, stdin=stdin,
                               capture_output=True, text=True, timeout=120)
        after = os.stat(path)
        assert p.returncode == 125, p.stderr
        # (a FIFO's times move with the writes that feed it)
        assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid), path
        assert path == fifo or after.st_ctime_ns == before.st_ctime_ns
    assert source.read_text() == "a\nb\n"
    with open(source) as stdin:
        got = subprocess.run([sys.executable, "-m", "caper", "run", "-q", "--stdin", "--approver",
                              "allow", "-c", "wc -l"], cwd=ws, env={**env, "CAPER_NO_GATE": "1"},
                             stdin=stdin, capture_output=True, text=True, timeout=120)
    assert got.stdout.strip() == "2", got.stderr


@contextlib.contextmanager
def _fifo_fed(fifo, data: bytes):
    """fifo open for reading, a writer giving it data and closing."""
    import threading
    writer = threading.Thread(target=lambda: fifo.write_bytes(data))
    writer.start()
    f = open(fifo, "rb")
    try:
        yield f
    finally:
        f.close()
        writer.join()


def test_a_terminal_is_never_handed_to_the_command_as_stdin(env, tmp_path):
    """adv3a 05: fd 0 would be the host tty, open read-write: a blocked run
    wrote an OSC 52 clipboard escape to it and turned its echo off."""
    import pty
    import termios
    ws = tmp_path / "ws"
    ws.mkdir()
    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "caper", "run", "-q", "--stdin", "--approver",
                            "block", "-c", r"printf '\033]52;c;eA==\007' >&0; stty -echo <&0"],
                           cwd=ws, env={**env, "CAPER_NO_GATE": "1"}, stdin=slave,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 125 and "stdin is a terminal" in p.stderr, p.stderr
        assert termios.tcgetattr(slave)[3] & termios.ECHO
        os.set_blocking(master, False)
        try:
            got = os.read(master, 4096)
        except BlockingIOError:
            got = b""
        assert b"\x1b]52" not in got
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("unshare, why", [(["-p", "-f"], "another pid namespace"),
                                          (["-U", "-r"], "another user namespace")])
def test_a_caller_in_another_pid_or_user_namespace_is_not_served_by_the_gate(env, gate_ws, unshare,
                                                                            why):
    ws = gate_ws
    if os.geteuid() != 0:
        pytest.skip("needs root for unshare")
    p = subprocess.run(["unshare", *unshare, sys.executable, "-m", "caper", "run", "--json",
                        "--approver", "allow", "-c", "true"], cwd=ws, env=env,
                       capture_output=True, text=True, timeout=120)
    assert f"the gate declined: the caller is in {why}" in p.stderr, p.stderr


def test_an_anonymous_pipe_given_as_stdin_is_relayed_too(env, tmp_path):
    """adv10a 04: fd 0 as the caller's own pipe let a blocked run open its
    write end (/proc/self/fd/0) and leave bytes there for the caller's next
    reader, or set O_NONBLOCK on the shared description. The command gets a
    pipe only caper writes."""
    import fcntl
    ws = tmp_path / "ws"
    ws.mkdir()
    r, w = os.pipe()
    attack = ("head -c 2 > /dev/null; echo PLANTED > /proc/self/fd/0; "
              "python3 -c 'import fcntl, os; fcntl.fcntl(0, fcntl.F_SETFL, os.O_NONBLOCK)'")
    os.write(w, b"a\n")
    p = subprocess.Popen([sys.executable, "-m", "caper", "run", "-q", "--stdin", "--approver",
                          "block", "-c", attack], cwd=ws, env={**env, "CAPER_NO_GATE": "1"},
                         stdin=r, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 125, err
    assert not fcntl.fcntl(r, fcntl.F_GETFL) & os.O_NONBLOCK
    os.write(w, b"next\n")
    os.close(w)
    rest = b""
    while chunk := os.read(r, 4096):
        rest += chunk
    os.close(r)
    assert b"PLANTED" not in rest and rest.endswith(b"next\n"), rest
