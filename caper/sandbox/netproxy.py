"""caper.sandbox.netproxy: the sandbox's only way out, an HTTP proxy caper serves.

A run's network namespace has only its own loopback. When the run allows hosts, the
sandbox's init listens on 127.0.0.1:PROXY_PORT there and hands the socket to caper
(csrc/ns.c), which serves it from the host side: CONNECT (HTTPS and anything tunnelled)
and plain HTTP forwarding, to allowlisted host names only. The command finds it through
HTTP(S)_PROXY / ALL_PROXY. Each connection is attributed, when accepted, to the process
that made it (the tracer's connect record of the peer socket's inode); one that cannot
be attributed is refused. Once any process of the run has read a credential, nothing
more leaves: new connections are refused and open tunnels cut before their next bytes
(processes hand data to each other through pipes, descriptors and files, which the
tracer does not follow). Every request, refused or not, becomes a ProxyRequest.
"""
from __future__ import annotations

import os
import re
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from caper.errors import ConfigError
from caper.sandbox.aliases import Aliases
from caper.sandbox.events import Event, Family, Info, Kind

PROXY_PORT = 3128
# The registries' host names (never addresses: the user allows names).
PRESETS: dict[str, tuple[str, ...]] = {
    "pypi": ("pypi.org:443", "files.pythonhosted.org:443"),
    "npm": ("registry.npmjs.org:443", "registry.yarnpkg.com:443"),
    "crates": ("crates.io:443", "index.crates.io:443", "static.crates.io:443"),
    "goproxy": ("proxy.golang.org:443", "sum.golang.org:443", "storage.googleapis.com:443"),
    "github": ("github.com:443", "codeload.github.com:443", "objects.githubusercontent.com:443",
               "gitlab.com:443"),
}
HEAD_MAX = 64 * 1024          # bytes of a request line and headers
ATTRIBUTE_S = 5.0             # how long a connection waits for the tracer's connect record
CONNECT_TIMEOUT_S = 15.0      # connecting upstream
IDLE_S = 120.0                # a tunnel with no bytes either way for this long is closed
MAX_CONNECTIONS = 64          # served at once; more are refused
CHUNK = 64 * 1024
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_RULE = re.compile(rf"(\*\.)?({_LABEL}(?:\.{_LABEL})*)(?::([0-9]{{1,5}}))?")


class ProxyEnd(Protocol):
    """What the sandbox needs of a proxy (caper.sandbox.trace)."""
    fd: int
    port: int

    def observe(self, event: Event) -> None: ...

    def follow(self, emitted: Callable[[], int]) -> None:
        """emitted(): the seq of the last event the tracer has emitted."""


@dataclass(frozen=True, slots=True)
class AllowRule:
    host: str                 # lower case; "*.example.com" matches its subdomains
    port: int | None = None   # None: any port

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host

    def __str__(self) -> str:
        return self.host + (f":{self.port}" if self.port is not None else "")


@dataclass(frozen=True, slots=True)
class Allowlist:
    rules: tuple[AllowRule, ...] = ()

    @classmethod
    def parse(cls, items: Iterable[str]) -> "Allowlist":
        """HOST[:PORT] entries (a leading "*." for subdomains) and preset names
        (PRESETS); a ConfigError names the first bad entry."""
        rules: list[AllowRule] = []
        for item in items:
            text = item.strip().lower() if isinstance(item, str) else item
            if text in PRESETS:
                rules += [cls.parse([r]).rules[0] for r in PRESETS[text]]
                continue
            m = _RULE.fullmatch(text) if isinstance(text, str) else None
            port = int(m.group(3)) if m and m.group(3) else None
            if not m or (port is not None and not 0 < port < 65536):
                raise ConfigError(f"--allow-net {item!r}: not HOST[:PORT], *.DOMAIN[:PORT] or a "
                                  f"preset ({', '.join(PRESETS)})")
            rules.append(AllowRule((m.group(1) or "") + m.group(2), port))
        return cls(tuple(dict.fromkeys(rules)))

    def __add__(self, other: "Allowlist") -> "Allowlist":
        return Allowlist(tuple(dict.fromkeys(self.rules + other.rules)))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def allows(self, host: str, port: int) -> bool:
        return any(r.matches(host, port) for r in self.rules)

    def names(self) -> list[str]:
        return [str(r) for r in self.rules]


@dataclass(slots=True)
class ProxyRequest:
    """One connection to the proxy: what it asked for and what became of it."""
    scheme: str                    # https (a CONNECT tunnel) | http (a forwarded request)
    host: str | None = None
    port: int | None = None
    method: str | None = None      # plain HTTP only (a tunnel's are encrypted)
    body: bool = False             # plain HTTP: the request declared a body (a GET's too)
    path: str | None = None
    sni: str | None = None         # the TLS server name a tunnel's client sent
    opaque: bool = False           # a tunnel whose first bytes were no TLS record
    allowed: bool = False
    reason: str | None = None      # why refused or cut
    result: str = "refused"        # ok | refused | cut | error: ...
    sent: int = 0                  # bytes from the sandbox towards the host
    received: int = 0
    duration_ms: float = 0.0
    pid: int | None = None         # the process that connected (events' pid), and
    seq: int | None = None         # its connect event


class _Knowledge:
    """The tracer's events as they arrive: who connected through which socket,
    and which credentials the run has read."""

    def __init__(self, is_credential: Callable[[str], bool], port: int):
        self._kind = lambda path: "credential" if is_credential(path) else None
        self._aliases = Aliases()
        self._port = port
        self._sockets: dict[int, tuple[int, int]] = {}    # socket inode -> (pid, seq)
        self._credentials: dict[str, None] = {}           # read so far, in order
        self._seen = 0                                    # seq of the last event observed
        self.emitted: Callable[[], int] = lambda: 0       # the tracer's last seq (Trace)
        self.changed = threading.Condition()

    def observe(self, e: Event) -> None:
        with self.changed:
            self._seen = max(self._seen, e.seq)
            if e.kind == Kind.OPEN and e.ok and e.path and e.flags & 3 != os.O_WRONLY:
                cred = self._aliases.credential(self._kind, e.real, e.path)
                if cred:
                    self._credentials[cred[0]] = None
            elif e.kind in (Kind.LINK, Kind.RENAME) and e.ok and e.path and e.path2:
                # A credential by another name (or a directory holding one,
                # which the aliases resolve at the open): reading that name
                # reads it. A source that changed after the tracer's check
                # may have been one.
                for names in Aliases.sources(e):
                    cred = self._aliases.credential(self._kind, *names)
                    if cred:
                        self._credentials[cred[0]] = None
                if e.info & Info.SOURCE_CHANGED:
                    self._credentials[e.path2] = None
                self._aliases.take(e)
            elif e.kind == Kind.CONNECT and e.arg1 and e.flags == Family.INET and \
                    e.path == "127.0.0.1" and e.arg0 == self._port:
                self._sockets[e.arg1] = (e.pid, e.seq)
            self.changed.notify_all()

    def who(self, inode: int, timeout: float) -> tuple[int, int] | None:
        """The (pid, seq) of the connect that made socket inode, waiting for its
        record to arrive; used once (an inode is reused after close)."""
        with self.changed:
            self.changed.wait_for(lambda: inode in self._sockets, timeout)
            return self._sockets.pop(inode, None)

    def credentials(self, timeout: float) -> list[str] | None:
        """The credentials the run has read by now, once every event the tracer
        has emitted is observed: bytes that reached the proxy were written
        after any read they could carry, and that read's event is emitted
        before its process ran on. None when the events did not catch up."""
        target = self.emitted()
        with self.changed:
            if not self.changed.wait_for(lambda: self._seen >= target, timeout):
                return None
            return list(self._credentials)


class Proxy:
    """The proxy of one run. Give it (as ProxyEnd) to caper.sandbox.trace.Trace,
    start() it before the trace, close() it after; .requests is the record."""

    def __init__(self, allow: Allowlist, *, is_credential: Callable[[str], bool],
                 port: int = PROXY_PORT):
        if not allow:
            raise ConfigError("a proxy without allowed hosts would refuse everything: run "
                              "without one")
        self.allow = allow
        self.port = port
        self._know = _Knowledge(is_credential, port)
        # fd goes to the sandbox's init, which sends the listener back on it.
        self._ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._theirs = theirs
        self.fd = theirs.fileno()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._tcp_lock = threading.Lock()
        self._tcp_fd = -1
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._active = 0
        self.requests: list[ProxyRequest] = []
        self._thread: threading.Thread | None = None

    def env(self) -> dict[str, str]:
        """The variables that send the command's HTTP clients here."""
        url = f"http://127.0.0.1:{self.port}"
        env = {k: url for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
        env["NO_PROXY"] = ""
        return env | {k.lower(): v for k, v in env.items()}

    def observe(self, event: Event) -> None:
        self._know.observe(event)

    def follow(self, emitted: Callable[[], int]) -> None:
        self._know.emitted = emitted

    def start(self) -> "Proxy":
        self._thread = threading.Thread(target=self._serve, name="caper-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> list[ProxyRequest]:
        """Stop serving (the sandbox is gone); wait briefly for open connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for t in list(self._threads):
            t.join(10)
        for s in (self._ours, self._theirs, self._listener):
            if s is not None:
                s.close()
        if self._tcp_fd >= 0:
            os.close(self._tcp_fd)
            self._tcp_fd = -1
        with self._lock:
            return list(self.requests)

    # -- serving --------------------------------------------------------------------------
    def _receive_listener(self) -> bool:
        while not self._stop.is_set():
            self._ours.settimeout(0.2)
            try:
                _, fds, _, _ = socket.recv_fds(self._ours, 1, 2)
            except TimeoutError:
                continue
            if len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                return False
            self._listener = socket.socket(fileno=fds[0])
            self._tcp_fd = fds[1]
            return True
        return False

    def _serve(self) -> None:
        if not self._receive_listener():
            return
        assert self._listener is not None
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                busy = self._active >= MAX_CONNECTIONS
                self._active += not busy
            if busy:      # refused, not queued: a flood must not hold the run
                conn.close()
                with self._lock:
                    self.requests.append(ProxyRequest(
                        scheme="http", reason=f"more than {MAX_CONNECTIONS} connections at once"))
                continue
            t = threading.Thread(target=self._one, args=(conn, peer[1]), daemon=True,
                                 name="caper-proxy-conn")
            self._threads.append(t)
            t.start()

    def _peer_inode(self, peer_port: int) -> int:
        """The inode of the sandbox's socket on 127.0.0.1:peer_port connected to
        the proxy, from the netns's /proc/net/tcp; 0 when not found."""
        want_local, want_remote = f"0100007F:{peer_port:04X}", f"0100007F:{self.port:04X}"
        with self._tcp_lock:
            os.lseek(self._tcp_fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(self._tcp_fd, 1 << 16):
                chunks.append(chunk)
        for line in b"".join(chunks).decode(errors="replace").splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[1] == want_local and f[2] == want_remote:
                return int(f[9])
        return 0

    def _one(self, conn: socket.socket, peer_port: int) -> None:
        t0 = time.monotonic()
        rec = ProxyRequest(scheme="http")
        upstream = None
        try:
            conn.settimeout(30)
            inode = self._peer_inode(peer_port)
            who = self._know.who(inode, ATTRIBUTE_S) if inode else None
            if who:
                rec.pid, rec.seq = who
            head, rest = _read_head(conn)
            refusal = _parse(head, rec) or self._refusal(rec)
            if refusal:
                rec.reason = refusal
                _answer(conn, 403, refusal)
                return
            try:
                upstream = socket.create_connection((rec.host, rec.port), CONNECT_TIMEOUT_S)
            except OSError as e:
                rec.result = f"error: connect({rec.host}:{rec.port}): {e.strerror or e}"
                _answer(conn, 502, rec.result)
                return
            rec.allowed = True
            if rec.scheme == "https":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = rest
            else:
                first = _forwarded(head, rec) + rest
            rec.result = "ok"
            self._relay(conn, upstream, first, rec)
        except Exception as e:  # noqa: BLE001 - one connection's failure closes it, never the run
            if rec.result == "ok":
                rec.result = f"error: {e!r}"
            elif not rec.reason:
                rec.reason = f"the request could not be read: {e!r}"
        finally:
            rec.duration_ms = round((time.monotonic() - t0) * 1000, 1)
            for s in (conn, upstream):
                if s is not None:
                    s.close()
            with self._lock:
                self.requests.append(rec)
                self._active -= 1

    def _refusal(self, rec: ProxyRequest) -> str | None:
        if rec.pid is None:
            return "caper cannot tell which process made this connection"
        cut = self._leak(rec)
        if cut:
            return cut
        if not self.allow.allows(rec.host, rec.port):
            return f"{rec.host}:{rec.port} is not allowed (allowed: {', '.join(self.allow.names())})"
        return None

    def _leak(self, rec: ProxyRequest) -> str | None:
        """Why nothing more may leave: the run read a credential (any process:
        pipes, descriptors and files carry it between them), or caper could
        not confirm that it did not."""
        creds = self._know.credentials(ATTRIBUTE_S)
        if creds is None:
            return "caper could not confirm what the run had read by then"
        if creds:
            return f"the run read {', '.join(creds[:3])}: once a credential is read, nothing " \
                   "more leaves"
        return None

    def _relay(self, conn: socket.socket, upstream: socket.socket, first: bytes,
               rec: ProxyRequest) -> None:
        """Copy both ways until both sides are done; every chunk from the
        sandbox is checked against what its process has read by then."""
        pending, hello = first, rec.scheme == "https"
        sel = selectors.DefaultSelector()
        for s in (conn, upstream):
            s.setblocking(False)
        sel.register(conn, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, conn)
        open_, last = 2, time.monotonic()
        try:
            while open_:
                if pending:
                    if hello:   # a tunnel's first bytes: a TLS ClientHello names its server
                        rec.sni, rec.opaque, hello = _sni(pending), pending[:1] != b"\x16", False
                    cut = self._cut(rec, pending)
                    if cut:
                        rec.result, rec.reason = "cut", cut
                        return
                    upstream.setblocking(True)
                    upstream.sendall(pending)
                    upstream.setblocking(False)
                    rec.sent += len(pending)
                    pending = b""
                ready = sel.select(1.0)
                if self._stop.is_set():
                    return        # the sandbox is gone: nothing more is its
                if not ready:
                    if time.monotonic() - last > IDLE_S:
                        rec.result, rec.reason = "cut", f"idle for {IDLE_S:.0f} s"
                        return
                    continue
                last = time.monotonic()
                for key, _ in ready:
                    src, dst = key.fileobj, key.data
                    try:
                        data = src.recv(CHUNK)
                    except BlockingIOError:
                        continue
                    except ConnectionResetError:
                        data = b""
                    if not data:
                        sel.unregister(src)
                        open_ -= 1
                        try:
                            dst.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                        continue
                    if src is conn:
                        pending = data
                    else:
                        dst.setblocking(True)
                        dst.sendall(data)
                        dst.setblocking(False)
                        rec.received += len(data)
        finally:
            sel.close()

    def _cut(self, rec: ProxyRequest, data: bytes) -> str | None:
        leak = self._leak(rec)
        if leak:
            return leak + " (cut before sending more)"
        if rec.sni and rec.sni != rec.host and not self.allow.allows(rec.sni, rec.port or 443):
            return f"the tunnel to {rec.host} asked TLS for {rec.sni}, which is not allowed"
        return None


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEAD_MAX:
            raise ValueError(f"request head over {HEAD_MAX} bytes")
        data = conn.recv(CHUNK)
        if not data:
            break
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _parse(head: bytes, rec: ProxyRequest) -> str | None:
    """Fill in rec from the request line; a refusal when it is not one caper
    forwards."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return f"not an HTTP proxy request: {line[:80]!r}"
    method, target = parts[0], parts[1]
    if method == "CONNECT":
        rec.scheme = "https"
        host, _, port = target.rpartition(":")
    else:
        rec.method = method
        m = re.fullmatch(r"http://([^/:?#]+)(?::([0-9]{1,5}))?([/?][^ ]*)?", target, re.I)
        if not m:
            return f"{method} {target[:80]!r}: only absolute http:// URLs are forwarded"
        host, port, path = m.group(1), m.group(2) or "80", m.group(3) or "/"
        rec.path = path[:512]
        rec.body = bool(re.search(rb"\r\n(?:content-length[ \t]*:[ \t]*0*[1-9]|"
                                  rb"transfer-encoding[ \t]*:)", head, re.I))
    host = host.lower().rstrip(".")
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        rec.host = host[:255] or None
        return f"not a host name and port: {target[:80]!r}"
    rec.host, rec.port = host, int(port)
    return None


_HOP_HEADERS = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


def _forwarded(head: bytes, rec: ProxyRequest) -> bytes:
    """The request as the origin server takes it: the path only, one request per
    connection (the next one could name another host)."""
    lines = head.split(b"\r\n")
    version = lines[0].rsplit(b" ", 1)[1]
    # The whole path (rec.path, the record's, is clipped): from the request line.
    target = lines[0].split(b" ")[1]
    path = re.sub(rb"^[hH][tT][tT][pP]://[^/?#]*", b"", target) or b"/"
    out = [rec.method.encode("latin-1") + b" " + path + b" " + version]
    out += [h for h in lines[1:] if h.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
    out.append(b"Connection: close")
    return b"\r\n".join(out) + b"\r\n\r\n"


def _answer(conn: socket.socket, status: int, reason: str) -> None:
    body = f"caper: {reason}\n".encode()
    title = {403: "Forbidden", 502: "Bad Gateway"}[status]
    try:
        conn.sendall(f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    except OSError:
        pass


def _sni(hello: bytes) -> str | None:
    """The server name of a TLS ClientHello, if this chunk holds one whole."""
    try:
        if hello[0] != 0x16 or hello[5] != 0x01:
            return None
        i = 5 + 4 + 2 + 32                                 # handshake header, version, random
        i += 1 + hello[i]                                  # session id
        i += 2 + int.from_bytes(hello[i:i + 2], "big")     # cipher suites
        i += 1 + hello[i]                                  # compression methods
        end = i + 2 + int.from_bytes(hello[i:i + 2], "big")
        i += 2
        while i + 4 <= end:
            kind, n = int.from_bytes(hello[i:i + 2], "big"), int.from_bytes(hello[i + 2:i + 4], "big")
            if kind == 0:                                  # server_name: list, type, length, name
                name_len = int.from_bytes(hello[i + 7:i + 9], "big")
                return hello[i + 9:i + 9 + name_len].decode("ascii").lower()
            i += 4 + n
    except (IndexError, UnicodeDecodeError):
        return None
    return None
