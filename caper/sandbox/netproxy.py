"""caper.sandbox.netproxy: the sandbox's only way out, an HTTP proxy caper serves.

A run's network namespace has only its own loopback. When the run allows hosts, the
sandbox's init binds caper's sockets there and hands them to caper (csrc/ns.c), which
serves them from the host side: the proxy on 127.0.0.1:PROXY_PORT (CONNECT, for HTTPS and
anything tunnelled, and plain HTTP forwarding), found through HTTP(S)_PROXY / ALL_PROXY;
the DNS (caper.sandbox.netdns), which answers an allowed name with an address of the
sandbox's own where caper listens; and those listeners, the transparent route of tools
that ignore proxy variables, which learn the name from the address dialled and check it
against the TLS server name or HTTP Host the client sends. To allowlisted host names only;
caper resolves them on the host and refuses a name that resolves to an address of this
machine or its link unless the rule names that address. Each connection is attributed,
when accepted, to the process that made it (the tracer's connect record of the peer
socket's inode); one that cannot be attributed is refused. Once any process of the run
has read a credential, nothing more leaves: new connections are refused and open tunnels
cut at once, their upstreams reset (processes hand data to each other through pipes,
descriptors and files, which the tracer does not follow); and what an upstream sees of a
tunnel (its bytes, its pace, its end) never follows the run after such a read. Every request, refused or not,
becomes a ProxyRequest, every DNS query a DnsQuery.
"""
from __future__ import annotations

import ipaddress
import os
import re
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from caper.errors import ConfigError
from caper.sandbox import netdns
from caper.sandbox.aliases import Aliases
from caper.sandbox.allowlist import LABEL, Allowlist
from caper.sandbox.events import Event, Family, Kind
from caper.sandbox.netdns import DnsQuery, Route

PROXY_PORT = 3128
# The registries' host names (never addresses: the user allows names).
HEAD_MAX = 64 * 1024          # bytes of a request line and headers
ATTRIBUTE_S = 5.0             # how long a connection waits for the tracer's connect record
CONNECT_TIMEOUT_S = 15.0      # connecting upstream
FIRST_BYTES_S = 2.0           # a routed connection's client speaks first within this, or
                              # it is a protocol where the server does (ssh, smtp)
MAX_QUERIES = 4096            # distinct DNS queries recorded; more are refused
IDLE_S = 120.0                # a tunnel with no bytes either way for this long is closed
MAX_CONNECTIONS = 64          # served at once; more are refused
CHUNK = 64 * 1024
RELAY_BUFFER = 4 << 20        # bytes from the upstream a tunnel holds for a slow sandbox
_HOST = re.compile(rf"{LABEL}(?:\.{LABEL})*")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A socket init binds in the sandbox's network for caper."""
    address: str
    port: int
    datagram: bool = False         # caper's DNS
    route: Route | None = None     # a transparent route's listener


class ProxyEnd(Protocol):
    """What the sandbox needs of a proxy (caper.sandbox.trace)."""
    fd: int
    endpoints: tuple[Endpoint, ...]

    def observe(self, event: Event) -> None: ...

    def follow(self, emitted: Callable[[], int]) -> None:
        """emitted(): the seq of the last event the tracer has emitted."""


@dataclass(slots=True)
class ProxyRequest:
    """One connection to the proxy: what it asked for and what became of it."""
    scheme: str                    # https (a CONNECT tunnel) | http (a forwarded request);
                                   # routed: tls | http | tcp (what the first bytes are)
    via: str = "proxy"             # proxy | route (a connect to the address caper's DNS gave)
    host: str | None = None
    port: int | None = None
    method: str | None = None      # plain HTTP only (a tunnel's are encrypted)
    body: bool = False             # plain HTTP: the request declared a body (a GET's too)
    path: str | None = None
    sni: str | None = None         # the TLS server name a tunnel's client sent
    opaque: bool = False           # a tunnel whose first bytes were no TLS record
    upstream: str | None = None    # the address caper connected to (ADDR:PORT)
    allowed: bool = False
    reason: str | None = None      # why refused or cut
    result: str = "refused"        # ok | refused | cut | error: ...
    sent: int = 0                  # bytes from the sandbox towards the host
    received: int = 0
    duration_ms: float = 0.0
    pid: int | None = None         # the process that connected (events' pid), and
    seq: int | None = None         # its connect event


class CredentialPlaces(Protocol):
    """Which paths are credentials (caper.report.secrets.Protected)."""

    def kind(self, path: str) -> str | None: ...

    def held_below(self, directory: str) -> tuple[str, str] | None: ...


class _Knowledge:
    """The tracer's events as they arrive: who connected through which socket,
    and which credentials the run has read."""

    def __init__(self, places: "CredentialPlaces", served: set[tuple[str, int]]):
        self._kind = places.kind
        self._holds = places.held_below
        self._aliases = Aliases()
        self._served = served                             # (address, port) caper binds
        self._sockets: dict[int, tuple[int, int]] = {}    # socket inode -> (pid, seq)
        self._credentials: dict[str, None] = {}           # read so far, in order
        self._seen = 0                                    # seq of the last event observed
        self.emitted: Callable[[], int] = lambda: 0       # the tracer's last seq (Trace)
        self.first_credential: Callable[[], object] = lambda: None
        self.changed = threading.Condition()

    def observe(self, e: Event) -> None:
        with self.changed:
            had = bool(self._credentials)
            self._observe(e)
            if self._credentials and not had:
                self.first_credential()
            self.changed.notify_all()

    def _observe(self, e: Event) -> None:
        self._seen = max(self._seen, e.seq)
        if e.kind == Kind.OPEN and e.ok and e.path and e.flags & 3 != os.O_WRONLY:
            cred = self._aliases.credential(self._kind, e.real, e.path)
            if cred:
                self._credentials[cred[0]] = None
        elif e.kind in (Kind.LINK, Kind.RENAME) and e.ok and e.path and e.path2:
            # A credential by another name (or a directory holding one,
            # which the aliases resolve at the open): reading that name
            # reads it. The tracer made the call from the names reported.
            for names in Aliases.sources(e):
                cred = self._aliases.credential(self._kind, *names) or next(
                    filter(None, map(self._holds, filter(None, names))), None)
                if cred:
                    self._credentials[cred[0]] = None
            self._aliases.take(e)
        elif e.kind == Kind.CONNECT and e.arg1 and e.flags == Family.INET and \
                (e.path, e.arg0) in self._served:
            self._sockets[e.arg1] = (e.pid, e.seq)

    def who(self, inode: int, timeout: float) -> tuple[int, int] | None:
        """The (pid, seq) of the connect that made socket inode, waiting for its
        record to arrive; used once (an inode is reused after close)."""
        with self.changed:
            self.changed.wait_for(lambda: inode in self._sockets, timeout)
            return self._sockets.pop(inode, None)

    def asker(self, inode: int, timeout: float) -> tuple[int, int] | None:
        """The same for a datagram socket, which asks again (a resolver's A and
        AAAA): its connect was emitted before its first send; kept, as a new
        socket with the inode would be connected, and recorded, before asking."""
        target = self.emitted()
        with self.changed:
            self.changed.wait_for(lambda: self._seen >= target, timeout)
            return self._sockets.get(inode)

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


@dataclass(frozen=True, slots=True)
class NetRecord:
    """What a run's proxy saw: its requests and DNS queries, and the (address,
    port)s it served inside the sandbox (the tracer's connects there are these)."""
    requests: tuple[ProxyRequest, ...] = ()
    queries: tuple[DnsQuery, ...] = ()
    served: frozenset[tuple[str, int]] = frozenset()


class Proxy:
    """The proxy of one run. Give it (as ProxyEnd) to caper.sandbox.trace.Trace,
    start() it before the trace, close() it after: the NetRecord."""

    def __init__(self, allow: Allowlist, *, credentials: "CredentialPlaces",
                 port: int = PROXY_PORT, resolv_conf: str | None = None,
                 timeout: float | None = None):
        if not allow:
            raise ConfigError("a proxy without allowed hosts would refuse everything: run "
                              "without one")
        self.allow = allow
        self.port = port
        self.routes = netdns.routes(allow)
        self.endpoints = ((Endpoint("127.0.0.1", port),)
                          + tuple(Endpoint(a, netdns.DNS_PORT, datagram=True)
                                  for a in netdns.nameservers(resolv_conf or netdns.RESOLV_CONF))
                          + tuple(Endpoint(r.address, p, route=r)
                                  for r in self.routes for p in r.ports))
        self._served = frozenset((e.address, e.port) for e in self.endpoints)
        self._know = _Knowledge(credentials, set(self._served))
        # fd goes to the sandbox's init, which sends the sockets back on it.
        self._ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._theirs = theirs
        self.fd = theirs.fileno()
        self._stop = threading.Event()
        self._got = threading.Event()          # the sockets arrived (or never will)
        self._lock = threading.Lock()
        self._table_lock = threading.Lock()
        self._tables = (-1, -1)                # the sandbox's /proc/net/tcp and udp
        self._sockets: list[tuple[socket.socket, Endpoint]] = []
        self._threads: list[threading.Thread] = []
        self._active = 0
        self.requests: list[ProxyRequest] = []
        self._queries: dict[tuple, DnsQuery] = {}
        self._serving: list[threading.Thread] = []
        # Every socket a connection's thread holds, so that close() can wake
        # (shut down) whatever one of them waits on: a silent upstream holds nothing.
        self._open: set[socket.socket] = set()
        # Readable from the run's first credential read on: it wakes every
        # tunnel to cut itself then (_relay).
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._know.first_credential = lambda: os.write(self._wake_w, b"!")
        self._timeout = timeout
        self._deadline = float("inf")

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The variables that send the command's HTTP clients here, over base (the
        command's environment). And glibc's resolver asks its A and AAAA one after
        the other: from a thread (curl's resolver) the tracer answers sendmmsg, which
        it does not send for a task sharing its descriptors, with ENOSYS, and glibc
        then gives up (EAI_AGAIN) instead of sending them one by one."""
        url = f"http://127.0.0.1:{self.port}"
        env = {k: url for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
        env["NO_PROXY"] = ""
        options = base.get("RES_OPTIONS", "").split()
        return env | {k.lower(): v for k, v in env.items()} | {
            "RES_OPTIONS": " ".join(options + ["single-request"] * ("single-request" not in options))}

    def observe(self, event: Event) -> None:
        self._know.observe(event)

    def follow(self, emitted: Callable[[], int]) -> None:
        self._know.emitted = emitted

    def start(self) -> "Proxy":
        if self._timeout is not None:
            self._deadline = time.monotonic() + self._timeout
        for target, name in ((self._serve, "caper-proxy"), (self._serve_dns, "caper-dns")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._serving.append(t)
        return self

    def close(self) -> NetRecord:
        """Stop serving (the sandbox is gone): every connection's sockets are shut
        down, which ends whatever its thread waits on, and its thread joined."""
        self._stop.set()
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass      # not connected (yet): its connect() is bounded
        for t in self._serving + list(self._threads):
            t.join(CONNECT_TIMEOUT_S)
        os.close(self._wake_r)
        os.close(self._wake_w)
        for s in [self._ours, self._theirs] + [s for s, _ in self._sockets]:
            s.close()
        for fd in self._tables:
            if fd >= 0:
                os.close(fd)
        self._tables = (-1, -1)
        with self._lock:
            return NetRecord(tuple(self.requests), tuple(self._queries.values()), self._served)

    def _left(self, most: float) -> float:
        """A blocking call's timeout: most, or what is left of the run's time when
        less (a little above zero, so that the call fails rather than blocks)."""
        return max(0.01, min(most, self._deadline - time.monotonic()))

    def _track(self, s: socket.socket) -> socket.socket:
        with self._lock:
            if self._stop.is_set():
                s.close()
                raise ConnectionAbortedError("the run has ended")
            self._open.add(s)
        return s

    def _untrack(self, s: socket.socket) -> None:
        with self._lock:
            self._open.discard(s)

    # -- serving --------------------------------------------------------------------------
    def _receive_sockets(self) -> None:
        want = len(self.endpoints) + 2
        try:
            while not self._stop.is_set():
                self._ours.settimeout(0.2)
                try:
                    _, fds, _, _ = socket.recv_fds(self._ours, 1, want)
                except TimeoutError:
                    continue
                if len(fds) != want:
                    for fd in fds:
                        os.close(fd)
                    return
                self._sockets = [(socket.socket(fileno=fd), e)
                                 for fd, e in zip(fds, self.endpoints)]
                self._tables = (fds[-2], fds[-1])
                return
        finally:
            self._got.set()

    def _listening(self, datagram: bool) -> selectors.BaseSelector | None:
        if not datagram:
            self._receive_sockets()
        self._got.wait()
        if not self._sockets:
            return None
        sel = selectors.DefaultSelector()
        for s, e in self._sockets:
            if e.datagram == datagram:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, e)
        return sel

    def _serve(self) -> None:
        sel = self._listening(datagram=False)
        if sel is not None:
            with sel:       # the gate serves many runs: its descriptors go with each
                self._accept(sel)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        while not self._stop.is_set():
            for key, _ in sel.select(0.2):
                try:
                    conn, peer = key.fileobj.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return
                route = key.data.route
                with self._lock:
                    busy = self._active >= MAX_CONNECTIONS
                    self._active += not busy
                if busy:      # refused, not queued: a flood must not hold the run
                    conn.close()
                    with self._lock:
                        self.requests.append(ProxyRequest(
                            scheme="http" if route is None else "tcp",
                            via="proxy" if route is None else "route",
                            reason=f"more than {MAX_CONNECTIONS} connections at once"))
                    continue
                t = threading.Thread(target=self._one, args=(conn, peer, route), daemon=True,
                                     name="caper-proxy-conn")
                self._threads.append(t)
                t.start()

    def _serve_dns(self) -> None:
        sel = self._listening(datagram=True)
        if sel is not None:
            with sel:
                self._queries_from(sel)

    def _queries_from(self, sel: selectors.BaseSelector) -> None:
        while not self._stop.is_set():
            for key, _ in sel.select(0.2):
                try:
                    msg, peer = key.fileobj.recvfrom(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return
                answer = self._answer_dns(msg, peer, key.data)
                if answer:
                    try:
                        key.fileobj.sendto(answer, peer)
                    except OSError:
                        pass     # the asker is gone: its record stays

    def _answer_dns(self, msg: bytes, peer: tuple[str, int], at: Endpoint) -> bytes | None:
        try:
            q = netdns.parse(msg)
        except ValueError:
            return netdns.error_reply(msg, netdns.FORMERR)
        if q.flags & 0x7800:
            return netdns.error_reply(msg, netdns.NOTIMP)
        inode = self._peer_inode(1, peer, (at.address, at.port))
        who = self._know.asker(inode, ATTRIBUTE_S) if inode else None
        route = netdns.route_for(self.routes, q.name) if q.qclass == 1 else None
        address = route.address if route and q.qtype == 1 else None
        answer = address or ("no records" if route else "NXDOMAIN")
        key = (q.name, q.type_name, answer, who)
        with self._lock:
            known = self._queries.get(key)
            if known:
                known.count += 1
            elif len(self._queries) < MAX_QUERIES:
                self._queries[key] = DnsQuery(q.name, q.type_name, answer, route is not None,
                                              pid=who[0] if who else None,
                                              seq=who[1] if who else None)
            else:        # unrecorded, so unanswered
                over = ("?", "?", "NXDOMAIN", None)
                self._queries.setdefault(over, DnsQuery(
                    f"(more than {MAX_QUERIES} distinct queries)", "?", "NXDOMAIN", False,
                    count=0)).count += 1
                return netdns.reply(q, netdns.NXDOMAIN)
        return netdns.reply(q, netdns.NOERROR if route else netdns.NXDOMAIN, address)

    def _peer_inode(self, table: int, peer: tuple[str, int], local: tuple[str, int]) -> int:
        """The inode of the sandbox's socket bound at peer and connected (or, for
        a datagram socket, not connected) to local, from the netns's /proc/net/tcp
        (table 0) or udp (1); 0 when not found."""
        want_local, want_remote = _hex(*peer), _hex(*local)
        with self._table_lock:
            fd = self._tables[table]
            if fd < 0:
                return 0
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        for line in b"".join(chunks).decode(errors="replace").splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[1] == want_local and (f[2] == want_remote or
                                                      table and f[2] == "00000000:0000"):
                return int(f[9])
        return 0

    def _one(self, conn: socket.socket, peer: tuple[str, int], route: Route | None) -> None:
        t0 = time.monotonic()
        rec = ProxyRequest(scheme="http") if route is None else \
            ProxyRequest(scheme="tcp", via="route", host=route.host, port=conn.getsockname()[1])
        upstream = None
        try:
            self._track(conn).settimeout(self._left(30))
            inode = self._peer_inode(0, peer, conn.getsockname())
            who = self._know.who(inode, ATTRIBUTE_S) if inode else None
            if who:
                rec.pid, rec.seq = who
            first = self._asked(conn, rec) if route is None else self._routed(conn, route, rec)
            if first is None:
                return
            upstream = self._upstream(conn, rec)
            if upstream is None:
                return
            rec.allowed, rec.result = True, "ok"
            if rec.via == "proxy" and rec.scheme == "https":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
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
                    self._untrack(s)
            conn.close()
            with self._lock:
                self.requests.append(rec)
                self._active -= 1
            if upstream is not None and rec.result == "cut":
                _reset(upstream)      # now: when the run ends is not passed on
            elif upstream is not None:
                upstream.close()

    def _asked(self, conn: socket.socket, rec: ProxyRequest) -> bytes | None:
        """A proxy request: what to send upstream first, or None when refused."""
        head, rest = _read_head(conn)
        refusal = _parse(head, rec) or self._refusal(rec)
        if refusal:
            rec.reason = refusal
            _answer(conn, 403, refusal)
            return None
        return rest if rec.scheme == "https" else _forwarded(head, rec) + rest

    def _routed(self, conn: socket.socket, route: Route, rec: ProxyRequest) -> bytes | None:
        """A connection to a route's address: the name is the route's, and the
        client's TLS server name or HTTP Host, when it sends one, must be it
        (or, for a wildcard, under it)."""
        first = _first_bytes(conn)
        said, head, rest = None, b"", b""
        if first[:1] == b"\x16":
            rec.scheme, rec.sni = "tls", _sni(first)
            said = rec.sni
        elif _HTTP_START.match(first):
            rec.scheme = "http"
            head, sep, rest = first.partition(b"\r\n\r\n")
            said = _origin_request(head, rec) if sep else None
            if said is None:
                rec.reason = "not an HTTP request: " + repr(first[:80])
                _answer(conn, 403, rec.reason)
                return None
            said = said or None      # no Host (HTTP/1.0): the address's name
        what = "TLS server name" if rec.scheme == "tls" else "HTTP Host"
        refusal = None
        if route.host.startswith("*.") and not said:
            refusal = f"a connection to the address of {route.host} names no host (no TLS " \
                      "server name or HTTP Host)"
        elif said and netdns.route_for((route,), said) is None:
            refusal = f"it connected to the address caper's DNS gave {route.host}, but its " \
                      f"{what} is {said}"
        rec.host = said if said and not refusal else route.host
        refusal = refusal or self._refusal(rec)
        if refusal:
            rec.reason = refusal
            if rec.scheme == "http":
                _answer(conn, 403, refusal)
            return None
        return _forwarded(head, rec) + rest if rec.scheme == "http" else first

    def _upstream(self, conn: socket.socket, rec: ProxyRequest) -> socket.socket | None:
        """The connection to rec's host, resolved here on the host side; None
        (recorded, and answered where the client speaks HTTP) when refused or failed."""
        speaks_http = rec.via == "proxy" or rec.scheme == "http"
        try:
            addrs = _resolve(rec.host, rec.port)
        except OSError as e:
            rec.result = f"error: resolve({rec.host}): {e.strerror or e}"
            if speaks_http:
                _answer(conn, 502, rec.result)
            return None
        named = netdns.literal(rec.host) or _localhost(rec.host)
        usable = addrs if named else [a for a in addrs if not _internal(a)]
        if not usable:
            rec.reason = f"{rec.host} resolves to {addrs[0]}, an address of this machine or " \
                         "its link: only a rule naming that address reaches it"
            if speaks_http:
                _answer(conn, 403, rec.reason)
            return None
        last: OSError | None = None
        for a in usable:
            s = self._track(socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET,
                                          socket.SOCK_STREAM))
            try:
                s.settimeout(self._left(CONNECT_TIMEOUT_S))
                s.connect((a, rec.port))
            except OSError as e:
                self._untrack(s)
                s.close()
                last = e
                if self._stop.is_set():
                    break
                continue
            rec.upstream = f"[{a}]:{rec.port}" if ":" in a else f"{a}:{rec.port}"
            return s
        rec.result = f"error: connect({rec.host}:{rec.port}): {last.strerror or last}"
        if speaks_http:
            _answer(conn, 502, rec.result)
        return None

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
        """Copy both ways until both sides are done. Every chunk from the
        sandbox, and its half-close, is checked against what the run has read
        by then. What the upstream sees never depends on the run after a
        credential read: the proxy reads the upstream at its own pace into a
        buffer (the sandbox's reading does not reach it as TCP flow control),
        stops reading only when that buffer is full and starts again only
        while the run has read none; at the first credential read of the run
        (RELAY_WAKE) every tunnel is cut then, and its upstream reset then,
        not when the run ends. Every write upstream waits at most IDLE_S, and
        no longer than the run."""
        pending, hello = first, rec.scheme == "https"
        to_sandbox = bytearray()
        sel = selectors.DefaultSelector()
        for s in (conn, upstream):
            s.setblocking(False)
        sel.register(self._wake_r, selectors.EVENT_READ)
        reading = {conn: True, upstream: True}      # its side has not ended
        upstream_ended = False
        last = time.monotonic()

        def watch() -> None:
            for s, want in ((conn, (selectors.EVENT_READ if reading[conn] else 0)
                             | (selectors.EVENT_WRITE if to_sandbox else 0)),
                            (upstream, selectors.EVENT_READ
                             if reading[upstream] and len(to_sandbox) < RELAY_BUFFER else 0)):
                if s in sel.get_map():
                    if want:
                        sel.modify(s, want)
                    else:
                        sel.unregister(s)
                elif want:
                    sel.register(s, want)
        try:
            while reading[conn] or reading[upstream] or to_sandbox:
                if pending:
                    if hello:   # a tunnel's first bytes: a TLS ClientHello names its server
                        rec.sni, rec.opaque, hello = _sni(pending), pending[:1] != b"\x16", False
                    cut = self._cut(rec, pending)
                    if cut:
                        rec.result, rec.reason = "cut", cut
                        return
                    upstream.settimeout(self._left(IDLE_S))
                    upstream.sendall(pending)
                    upstream.setblocking(False)
                    rec.sent += len(pending)
                    pending = b""
                full = len(to_sandbox) >= RELAY_BUFFER
                watch()
                ready = sel.select(1.0)
                if self._stop.is_set():
                    return        # the sandbox is gone: nothing more is its
                if time.monotonic() >= self._deadline:
                    rec.result, rec.reason = "cut", "the run's time is up"
                    return
                if any(key.fileobj == self._wake_r for key, _ in ready):
                    leak = self._leak(rec)
                    if leak:
                        rec.result, rec.reason = "cut", leak + " (cut then)"
                        return
                if not ready:
                    if time.monotonic() - last > IDLE_S:
                        rec.result, rec.reason = "cut", f"idle for {IDLE_S:.0f} s"
                        return
                    continue
                last = time.monotonic()
                for key, events in ready:
                    src = key.fileobj
                    if src is conn and events & selectors.EVENT_WRITE:
                        try:
                            sent = conn.send(to_sandbox)
                        except BlockingIOError:
                            sent = 0
                        except (BrokenPipeError, ConnectionResetError):
                            return    # the client is gone (a TLS client's close): done
                        del to_sandbox[:sent]
                        if full and len(to_sandbox) < RELAY_BUFFER:
                            # Reading the upstream again follows the run's reading.
                            leak = self._leak(rec)
                            if leak:
                                rec.result, rec.reason = "cut", leak + " (cut then)"
                                return
                        if not to_sandbox and upstream_ended:
                            _shut(conn)
                    if not events & selectors.EVENT_READ or src == self._wake_r:
                        continue
                    try:
                        data = src.recv(CHUNK)
                    except BlockingIOError:
                        continue
                    except ConnectionResetError:
                        data = b""
                    if data and src is conn:
                        pending = data
                    elif data:
                        to_sandbox += data
                        rec.received += len(data)
                    elif src is conn:
                        leak = self._leak(rec)
                        if leak:
                            rec.result, rec.reason = "cut", leak + " (its close is not " \
                                "passed on)"
                            return
                        reading[conn] = False
                        _shut(upstream)
                    else:
                        reading[upstream], upstream_ended = False, True
                        if not to_sandbox:
                            _shut(conn)
        finally:
            sel.close()

    def _cut(self, rec: ProxyRequest, data: bytes) -> str | None:
        leak = self._leak(rec)
        if leak:
            return leak + " (cut before sending more)"
        if rec.sni and rec.sni != rec.host and not self.allow.allows(rec.sni, rec.port or 443):
            return f"the tunnel to {rec.host} asked TLS for {rec.sni}, which is not allowed"
        return None


def _shut(s: socket.socket) -> None:
    """Pass on an end of stream (the other side's half-close)."""
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _reset(s: socket.socket) -> None:
    """Close s abortively (RST): how a cut tunnel's upstream ends, whatever the
    run did on its side after the cut."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


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


_HTTP_START = re.compile(rb"[A-Z]{3,10} ")


def _first_bytes(conn: socket.socket) -> bytes:
    """What a routed connection's client sends first: a whole TLS record (the
    ClientHello) or HTTP request head, as far as HEAD_MAX; b"" when it waits
    for the server to speak."""
    conn.settimeout(FIRST_BYTES_S)
    try:
        buf = conn.recv(CHUNK)
    except TimeoutError:
        return b""
    finally:
        conn.settimeout(30)
    while buf and len(buf) <= HEAD_MAX:
        if buf[:1] == b"\x16":
            if len(buf) >= 5 and len(buf) >= 5 + int.from_bytes(buf[3:5], "big"):
                break
        elif not _HTTP_START.match(buf) or b"\r\n\r\n" in buf:
            break
        data = conn.recv(CHUNK)
        if not data:
            break
        buf += data
    return buf


def _origin_request(head: bytes, rec: ProxyRequest) -> str | None:
    """Fill in rec's method and path from an origin server's request head (a
    routed connection's); its Host's name ("" without one), or None when it is
    not a request (or its Host not a name)."""
    lines = head.split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    rec.method, rec.path = parts[0], parts[1][:512]
    for h in lines[1:]:
        name, _, value = h.partition(b":")
        if name.strip().lower() == b"host":
            host = value.strip().decode("latin-1").lower()
            host = host.rpartition(":")[0] if re.fullmatch(r".*:[0-9]{1,5}", host) else host
            return host.rstrip(".") if _HOST.fullmatch(host.rstrip(".")) else None
    return ""


def _hex(address: str, port: int) -> str:
    """ADDR:PORT as /proc/net/tcp writes it (the address's bytes in host order)."""
    return f"{socket.inet_aton(address)[::-1].hex().upper()}:{port:04X}"


def _localhost(host: str) -> bool:
    """A name that is this machine's loopback by definition (RFC 6761 6.3)."""
    return host == "localhost" or host.endswith(".localhost")


def _resolve(host: str, port: int) -> list[str]:
    """The addresses of host, as this machine resolves it (a localhost name: the
    loopback, 127.0.0.1 and, where this machine has IPv6, ::1, as RFC 6761 asks)."""
    if _localhost(host):
        return ["127.0.0.1"] + ["::1"] * _own(ipaddress.ip_address("::1"))
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(a[4][0] for a in found))


# Clouds' metadata and configuration services off the link-local range (AWS's
# IPv6 ones, Alibaba's, Azure's wire server, Oracle's).
METADATA_ADDRESSES = frozenset({"fd00:ec2::254", "fd00:ec2::23", "100.100.100.200",
                                "168.63.129.16", "192.0.0.192"})


def _internal(address: str) -> bool:
    """An address of this machine or its link (loopback, link-local such as a cloud's
    metadata service, unspecified, multicast, reserved, one of this machine's own
    interfaces, a known metadata service): a name that resolves there is not the
    host the user allowed by name."""
    ip = ipaddress.ip_address(address.split("%")[0])
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast or \
        ip.is_reserved or str(ip) in METADATA_ADDRESSES or _own(ip)


def _own(ip) -> bool:
    """ip is assigned to an interface of this machine (the kernel binds only those)."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


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
    if rec.method is not None:
        # The origin serves by Host: another name there is another site of
        # the allowed front end (a CDN's), one the user did not allow.
        named = re.findall(rb"\r\nhost[ \t]*:[ \t]*([^\r\n]*)", head, re.I)
        for h in named:
            name = h.decode("latin-1").strip().lower().rstrip(".")
            name = name[1:name.index("]")] if name.startswith("[") and "]" in name else \
                name.rsplit(":", 1)[0] if name.count(":") == 1 else name
            if name != host:
                return f"the request's Host header names {name[:80]!r}, not {host!r}"
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
