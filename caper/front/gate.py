"""The resident gate: one caper process per user that runs `caper run`
requests, so a hook that calls `caper run` per command pays a small client
instead of Python's start-up and caper's imports (pydantic alone costs more
than the whole command).

    client (caper run)  --one JSON line-->  <state dir>/gate.sock  (caper serve)
                        <--one JSON line--

The client is this module's top half and imports only the standard library,
and of sockets only `_socket`: `socket` brings selectors and enum along, ~3 ms
of every hook's `caper run`. The native client (csrc/client.c, what the
hooks install where it is built) sends an "argv" request instead: its argv,
context and stdin; the gate makes that `caper run` or `caper hook` itself
(the CLI's `gate_argv`, handed to `serve` by the CLI, so this module
never imports the CLI) and answers with what to print.
`caper run` asks the gate first and starts it when it is not there; if the
gate cannot be reached or started it runs the command in its own process,
with the same result. The gate

- accepts only connections from its own uid (SO_PEERCRED), on a socket in
  the 0700 state directory, that sends the token the gate wrote at start
  in the state directory (0600; a sandbox sees none of the state
  directory): the uid alone would let anything acting for a sandboxed
  command with caper's uid drive the gate;
- serves only callers in its own mount, user and pid namespaces with its
  root (any other's command would see the gate's files, not the caller's,
  and a process inside a caper sandbox is never one of them): it declines
  the others, whose client then runs the command itself;
- runs each request with the caller's context (caper.sandbox.inherit: cwd,
  environment, umask, limits, groups, shell) and options, in a thread of
  its own, and declines a context it cannot give;
- is alone on its state directory: it holds `gate.life` locked for its life;
- rolls a run back instead of committing it when the caller has gone away
  (a hook killed by its agent must not leave a commit behind);
- exits when idle, and when the caper installation changed under it (a
  request from a newer caper makes it step aside).
"""
from __future__ import annotations

import binascii
import fcntl
import _socket
import json
import os
import sys
import time

SOCKET = "gate.sock"
TOKEN = "gate.token"
PROTOCOL = 1
START_TIMEOUT_S = 10.0
MAX_REQUEST = 16 << 20
IDLE_S = float(os.environ.get("CAPER_GATE_IDLE", 900))


def build_id() -> str:
    """Changes whenever caper's code does: the newest mtime of its files."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [package, os.path.join(os.path.dirname(package), "caper_native")]
    newest = 0
    while dirs:
        try:
            with os.scandir(dirs.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False) and e.name != "__pycache__":
                        dirs.append(e.path)
                    elif e.name.endswith((".py", ".so", ".toml")):
                        newest = max(newest, e.stat().st_mtime_ns)
        except OSError:
            pass
    return f"{PROTOCOL}-{newest}"


class GateUnavailable(Exception):
    """The gate could not be reached or started: run in this process instead."""


class ForeignGate(GateUnavailable):
    """What listens on the gate's socket is not the caller's own process."""


def _connect(path: str) -> _socket.socket:
    """A connection to the gate, once the peer is known to run as this
    uid (SO_PEERCRED, the server's credentials at listen()): nothing is
    sent to a socket someone else bound."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        s.connect(path)
        cred = s.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    except OSError:
        s.close()
        raise
    pid, uid = int.from_bytes(cred[0:4], sys.byteorder), int.from_bytes(cred[4:8], sys.byteorder)
    if uid != os.geteuid():
        s.close()
        raise ForeignGate(f"the gate socket {path} is served by uid {uid} (pid {pid}), not by "
                          f"you ({os.geteuid()}); nothing was sent to it")
    return s


def _start(state_dir: str) -> None:
    """Start the gate (one at a time: a lock), detached from this process."""
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        lock = os.open(os.path.join(state_dir, "gate.lock"),
                       os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:   # a read-only state dir (caper inside caper's sandbox)
        raise GateUnavailable(f"open {state_dir}/gate.lock: {e.strerror}") from e
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _connect(os.path.join(state_dir, SOCKET)).close()
            return                        # another client started it meanwhile
        except OSError:
            pass
        import subprocess   # only here: the client's usual path does not start a gate
        log = os.open(os.path.join(state_dir, "gate.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            from caper.launch import python_command  # the gate is this caper, in Python
            subprocess.Popen(python_command() + ["serve", "--state-dir", state_dir],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                             start_new_session=True, close_fds=True)
        finally:
            os.close(log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                _connect(os.path.join(state_dir, SOCKET)).close()
                return
            except OSError:
                time.sleep(0.01)
        raise GateUnavailable(f"the gate did not start within {START_TIMEOUT_S:g} s "
                              f"(see {state_dir}/gate.log)")
    finally:
        os.close(lock)


def request(state_dir: str, payload: dict, start: bool = True) -> dict:
    """Send one run request to the gate and wait for its answer."""
    path = os.path.join(state_dir, SOCKET)
    try:
        s = _connect(path)
    except OSError:
        if not start:
            raise GateUnavailable("no gate is running") from None
        _start(state_dir)
        try:
            s = _connect(path)
        except OSError as e:
            raise GateUnavailable(f"connect {path}: {e}") from e
    try:
        s.sendall(json.dumps({**payload, "build": build_id(), "token": _token(state_dir)}).encode()
                  + b"\n")
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    except OSError as e:
        raise GateUnavailable(f"the gate dropped the request: {e}") from e
    finally:
        s.close()
    if not buf.endswith(b"\n"):
        raise GateUnavailable("the gate closed the connection without an answer")
    answer = json.loads(buf)
    if answer.get("decline"):
        raise GateUnavailable(f"the gate declined: {answer['decline']}")
    if answer.get("stale"):
        if not start:
            raise GateUnavailable("the gate runs an older caper; it is exiting")
        _wait_gone(path)       # the old gate steps aside; start ours and ask again
        _start(state_dir)
        return request(state_dir, payload, start=False)
    return answer


def _token(state_dir: str) -> str:
    """The running gate's token ("" if unreadable: the gate then refuses)."""
    try:
        fd = os.open(os.path.join(state_dir, TOKEN), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def _write_token(state_dir: str) -> str:
    """A fresh token for this gate, written 0600 in place of any older one."""
    token = binascii.hexlify(os.urandom(32)).decode()
    tmp = os.path.join(state_dir, f"{TOKEN}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(state_dir, TOKEN))
    return token


def _wait_gone(path: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _connect(path).close()
        except OSError:
            return
        time.sleep(0.02)


def decode_output(answer: dict) -> tuple[bytes, bytes]:
    return binascii.a2b_base64(answer["stdout_b64"]), binascii.a2b_base64(answer["stderr_b64"])


# --- the server --------------------------------------------------------------------------------

LIFE_LOCK = "gate.life"
SO_PEERPIDFD = 77          # Linux 6.5; Python 3.11's socket module does not name it


def _hold_life_lock(state_dir: str, path: str) -> int | None:
    """The lock a gate holds for its whole life: one gate per state
    directory, and only its holder binds or unlinks the socket. A gate on
    its way out (idle) still holds it for a moment: wait for it, unless a
    gate answers on the socket meanwhile. Returns the lock's fd (kept open
    until exit), or None."""
    fd = os.open(os.path.join(state_dir, LIFE_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        try:
            _connect(path).close()
            break                          # a live gate serves
        except OSError:
            pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    os.close(fd)
    return None


def _elsewhere(conn, pid: int) -> str | None:
    """Why the caller does not live where the gate does (another mount, user
    or pid namespace, another root), or None. A command the gate runs sees
    the gate's filesystem: a caller elsewhere must run its command in its
    own process. Race-free: the peer's pidfd (SO_PEERPIDFD, else
    pidfd_open of its pid) is still alive after /proc/<pid> was opened, so
    that directory is the caller's, not a later process's with its pid."""
    import signal
    import socket
    import struct
    if pid <= 0:
        return "the caller is in another pid namespace"
    try:
        try:
            pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
        except OSError:          # before Linux 6.5: the pid, checked alive below
            pidfd = os.pidfd_open(pid)
    except OSError as e:
        return f"the caller's process cannot be checked (pidfd: {e.strerror})"
    try:
        proc = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            signal.pidfd_send_signal(pidfd, 0)
            for ns in ("mnt", "user", "pid"):
                theirs, mine = os.stat(f"ns/{ns}", dir_fd=proc), os.stat(f"/proc/self/ns/{ns}")
                if (theirs.st_dev, theirs.st_ino) != (mine.st_dev, mine.st_ino):
                    return f"the caller is in another {ns} namespace"
            theirs, mine = os.stat("root", dir_fd=proc), os.stat("/")
            if (theirs.st_dev, theirs.st_ino) != (mine.st_dev, mine.st_ino):
                return "the caller has another root directory (chroot)"
        finally:
            os.close(proc)
        signal.pidfd_send_signal(pidfd, 0)
    except OSError as e:
        return f"the caller's process cannot be checked ({e.strerror})"
    finally:
        os.close(pidfd)
    return None


def _still_wanted(conn) -> bool:
    """Whether the caller still waits for the answer: a socket readable with
    nothing to read is one whose caller closed its end."""
    import socket
    try:
        conn.setblocking(False)
        try:
            return conn.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        finally:
            conn.setblocking(True)
    except OSError:
        return False


def serve(state_dir: str, run_argv, idle_s: float = IDLE_S) -> int:
    """Serve the gate on `state_dir` until idle for `idle_s`; the native
    client's argv requests go to `run_argv` (caper.front.cli.gate_argv)."""
    import hmac
    import socket
    import socketserver
    import struct
    import threading

    from caper.errors import BadRequest, CaperError
    from caper.request import RunRequest
    from caper.transaction import run_request

    os.umask(0o077)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, SOCKET)
    mine = build_id()
    me = os.geteuid()
    state = {"active": 0, "last": time.monotonic()}
    guard = threading.Lock()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            conn = self.connection
            pid, uid, gid = struct.unpack("3i", conn.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != me:
                self._answer({"error": f"refused: uid {uid} is not the gate's owner ({me})"})
                return
            line = self.rfile.readline(MAX_REQUEST)   # first: the answer must meet an open socket
            elsewhere = _elsewhere(conn, pid)
            if elsewhere:
                self._answer({"decline": elsewhere})
                return
            with guard:
                state["active"] += 1
            try:
                try:
                    req = json.loads(line)
                except ValueError as e:
                    raise BadRequest(f"not one line of JSON: {e}") from e
                if not isinstance(req, dict) or not hmac.compare_digest(
                        str(req.get("token", "")).encode(), token.encode()):
                    self._answer({"error": f"refused: pid {pid} did not send the gate's token "
                                           f"({os.path.join(state_dir, TOKEN)})"})
                    return
                if req.get("build") != mine:
                    self._answer({"stale": True})
                    self.server.stale = True
                    return
                if req.get("kind") == "argv":
                    self._argv(req, conn, pid)
                    return
                self._answer(self._run(RunRequest.from_wire(req), conn))
            except (BadRequest, KeyError, TypeError) as e:   # the request's own fault: nothing ran
                self._answer({"error": f"bad request: {e}"})
            finally:
                with guard:
                    state["active"] -= 1
                    state["last"] = time.monotonic()

        def _argv(self, req: dict, conn: socket.socket, client: int) -> None:
            """The native client's request (csrc/client.c): its argv, context and
            stdin, base64; the answer is {"exit": N, "out": A, "err": B} and the
            A + B bytes it prints, or a decline (nothing ran: the client hands
            it to the Python CLI)."""
            b64 = binascii.a2b_base64
            argv = [os.fsdecode(b64(a)) for a in req["argv_b64"]]
            doc = dict(req["caller"])
            env = {}
            for entry in doc.pop("env_b64"):
                key, eq, value = os.fsdecode(b64(entry)).partition("=")
                if eq:
                    env.setdefault(key, value)    # getenv(3) takes the first
            doc.update(env=env, cwd=os.fsdecode(b64(doc.pop("cwd_b64"))))
            done = run_argv(argv, doc, b64(req.get("stdin_b64", "")), state_dir,
                             lambda: _still_wanted(conn), client)
            if isinstance(done, str):
                self._answer({"decline": done})
                return
            status, said = done
            try:
                self.wfile.write(f'{{"exit": {status}, "out": {len(said.out)}, '
                                 f'"err": {len(said.err)}}}\n'.encode() + said.out + said.err)
            except OSError:
                pass   # the caller went away

        def _run(self, req: RunRequest, conn: socket.socket) -> dict:
            why = req.caller.not_reproducible()
            if why:
                return {"decline": f"{why}: run it in the caller's process"}
            try:
                out = run_request(req, state_dir=state_dir,
                                  still_wanted=lambda: _still_wanted(conn))
            except CaperError as e:
                return {"error": f"caper failed: {e}"}
            except Exception as e:   # a bug inside the run: reported as caper's, fails closed
                return {"error": f"caper failed inside the run: {e!r}"}
            return {"outcome": out.to_json(),
                    "card": out.card(),
                    "stdout_b64": binascii.b2a_base64(out.stdout.text(), newline=False).decode(),
                    "stderr_b64": binascii.b2a_base64(out.stderr.text(), newline=False).decode(),
                    "gate_pid": os.getpid()}

        def _answer(self, doc: dict) -> None:
            try:
                self.wfile.write(json.dumps(doc, ensure_ascii=True).encode() + b"\n")
            except OSError:
                pass   # the caller went away

    class Server(socketserver.ThreadingUnixStreamServer):
        daemon_threads = True
        stale = False

    life = _hold_life_lock(state_dir, path)
    if life is None:
        print(f"caper serve: a gate already serves {state_dir}", file=sys.stderr)
        return 0
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    token = _write_token(state_dir)   # before the socket: a client that connects can read it
    server = Server(path, Handler)
    os.chmod(path, 0o600)
    ino = os.stat(path).st_ino

    def watch() -> None:
        while True:
            time.sleep(0.2)
            with guard:
                idle = state["active"] == 0 and time.monotonic() - state["last"] > idle_s
            if idle or server.stale:
                server.shutdown()
                return
    threading.Thread(target=watch, daemon=True).start()
    print(f"caper serve: pid {os.getpid()} on {path}, build {mine}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        try:
            if os.stat(path).st_ino == ino:   # not a newer gate's socket
                os.unlink(path)
        except OSError:
            pass
        os.close(life)                        # only now may the next gate bind
    return 0
