"""caper's proxy at the edges of a connection: half-closes passed on faithfully (and
not at all once the run has read a credential), upstreams that never answer (no
thread or descriptor of the run outlives it), and IPv6 upstreams. Real sockets:
the upstreams are servers on the host's loopback, the run a real `caper.run`, in
a process of its own (as the gate serves runs) as root and as uid 65534."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from caper.sandbox.netproxy import _internal, _own
from helpers.rootless import NOBODY, ROOTLESS_VENV, as_nobody, need_rootless_venv, source_root

# One process that runs the command twice (the first warms what stays for the next
# runs: imports, the native core) and counts the proxy's threads and its sockets
# around the second run, as a long-lived gate would see them.
RUN_AND_COUNT = r"""
import gc, json, os, sys, threading
sys.path.insert(0, sys.argv[1])
import caper
a = json.loads(sys.argv[2])
def once():   # on_unsure ask: a credential read is judged after the run, not stopped at
    return caper.run(a["command"], cwd=a["ws"], workspace=a["ws"], approver="policy",
                     on_unsure="ask", state_dir=a["state"], allow_net=a["allow"], timeout=a["timeout"],
                     env={"PATH": "/usr/bin:/bin", "HOME": a["state"]})
def counts():       # the proxy's threads and this process's sockets (caper's cleanup
    fds = []        # of the run's state goes on in its own thread, with its own files)
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:
            pass      # listdir's own
    return [sorted(t.name for t in threading.enumerate() if t.name.startswith("caper-proxy")
                   or t.name == "caper-dns"), sum(f.startswith("socket:") for f in fds)]
def summary(out):      # the outcome holds its run's record open: taken, then dropped
    return {"exit": out.exit_code, "stdout": out.stdout.text().decode(),
            "proxied": [n.model_dump() for n in out.report.network
                        if n.call in ("proxy", "route")]}
summary(once())
gc.collect()
before = counts()
doc = summary(once())
gc.collect()
print(json.dumps(doc | {"before": before, "after": counts()}))
"""


@pytest.fixture(params=["root", "rootless"])
def runner(request):
    """run(command, allow, timeout) -> the run's JSON from RUN_AND_COUNT, in a
    workspace holding a .env, by root or by uid 65534."""
    rootless = request.param == "rootless"
    if rootless:
        need_rootless_venv()
    base = tempfile.mkdtemp(prefix="caper-net-edges-")
    ws, state = os.path.join(base, "ws"), os.path.join(base, "state")
    os.mkdir(ws)
    with open(os.path.join(ws, ".env"), "w") as f:
        f.write("API_TOKEN=tok-5e4d3c2b1a\n")
    if rootless:
        for p in (base, ws, os.path.join(ws, ".env")):
            os.chown(p, NOBODY, NOBODY)

    def run(command: str, allow: list[str], timeout: float = 60) -> dict:
        python = ROOTLESS_VENV if rootless else sys.executable
        args = json.dumps({"command": command.replace("PYTHON", python), "ws": ws,
                           "state": state, "allow": allow, "timeout": timeout})
        argv = (python, "-c", RUN_AND_COUNT, str(source_root()), args)
        p = as_nobody(*argv, timeout=300, cwd="/") if rootless else \
            subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/")
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout)

    run.ws = ws
    yield run
    shutil.rmtree(base, ignore_errors=True)


class Upstream:
    """A TCP server on 127.0.0.1 that hands each accepted connection to serve(conn)
    in a thread; what serve returns is appended to .seen."""

    def __init__(self, serve):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list = []
        self._serve = serve
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=lambda: self.seen.append(self._serve(conn)),
                             daemon=True).start()

    def close(self):
        self.sock.close()


def _tunnel(port: int, then: str) -> str:
    """A script that opens a CONNECT tunnel through caper's proxy to 127.0.0.1:port
    (as s) and then does what `then` says."""
    return ("import socket, sys, time\n"
            "s = socket.create_connection(('127.0.0.1', 3128))\n"
            f"s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\n\\r\\n')\n"
            "assert s.recv(100).startswith(b'HTTP/1.1 200')\n" + then)


def _tunnelled(runner, serve, then: str, timeout: float = 60) -> tuple[dict, list]:
    """Run a script that opens a tunnel to an Upstream(serve) and does `then`
    (PORT in it: the upstream's port): the run's JSON, and what the upstream
    saw of each connection."""
    up = Upstream(serve)
    try:
        script = os.path.join(runner.ws, "tunnel.py")
        with open(script, "w") as f:
            f.write(_tunnel(up.port, then.replace("PORT", str(up.port))))
        os.chmod(script, 0o644)
        return runner("PYTHON tunnel.py", [f"127.0.0.1:{up.port}"], timeout), up.seen
    finally:
        up.close()


def _read_to_eof(conn: socket.socket) -> bytes:
    got = b""
    while data := conn.recv(65536):
        got += data
    return got


def _count_then_answer(conn: socket.socket) -> int:
    """Read to the client's half-close, then answer how much came, and close."""
    with conn:
        n = len(_read_to_eof(conn))
        conn.sendall(b"got %d" % n)
        return n


def test_a_half_close_is_passed_on_both_ways(runner):
    """The client shuts down its sending side; the server, which answers only at
    that EOF, answers through the still open other direction, then closes it."""
    out, _ = _tunnelled(runner, _count_then_answer, "s.sendall(b'x' * 200000)\n"
                                                    "s.shutdown(socket.SHUT_WR)\n"
                                                    "got = b''\n"
                                                    "while d := s.recv(65536): got += d\n"
                                                    "print(got.decode())\n")
    assert out["exit"] == 0 and out["stdout"] == "got 200000\n", out
    [n] = out["proxied"]
    assert n["allowed"] and n["result"] == "ok" and n["sent"] == 200000 and n["received"] == 10


def _how_it_ended(conn: socket.socket) -> str:
    """Acknowledge the client's hello, then tell how its side ended: "fin" (a
    half-close or close passed on), "reset", or "data" (more bytes came)."""
    with conn:
        assert conn.recv(5) == b"hello"
        conn.sendall(b"ack")
        try:
            return "data" if conn.recv(65536) else "fin"
        except ConnectionResetError:
            return "reset"


def test_a_half_close_after_a_credential_read_is_not_passed_on(runner):
    """Round 5: once the run has read a credential its bytes are cut, but its
    half-close went through, at a moment the run chose: a bit out. Now the
    tunnel is cut at the read and its upstream reset, whatever the run did."""
    out, seen = _tunnelled(runner, _how_it_ended, "s.sendall(b'hello')\n"
                                                  "assert s.recv(3) == b'ack'\n"
                                                  "secret = open('.env').read()\n"
                                                  "s.shutdown(socket.SHUT_WR)\n"
                                                  "time.sleep(1)\n")
    [n] = out["proxied"]
    assert n["result"] == "cut" and ".env" in n["reason"], n
    assert seen == ["reset", "reset"]     # RUN_AND_COUNT's two runs


def _stream_until_cut(conn: socket.socket) -> tuple[str, float]:
    """Acknowledge the hello, then send without end: how the stream ended and
    how long after the hello (what the upstream learns of the run)."""
    import time
    with conn:
        assert conn.recv(5) == b"hello"
        conn.sendall(b"ack")
        t0 = time.monotonic()
        try:
            while True:
                conn.sendall(b"z" * 65536)
        except (ConnectionResetError, BrokenPipeError):
            return "reset", time.monotonic() - t0


def test_after_a_credential_read_the_upstream_learns_nothing_the_run_chooses(runner):
    """adv6c 01: with a credential read judged after the run (ask, an LLM),
    the run went on reading an allowed host's stream at a pace it chose, and
    the host saw that pace as TCP flow control; a cut tunnel's upstream was
    reset when the run ended, at a time it chose. Now the proxy reads the
    upstream at its own pace, and at the read every tunnel is cut and its
    upstream reset then: here long before the run's end."""
    out, seen = _tunnelled(runner, _stream_until_cut, "s.sendall(b'hello')\n"
                                                      "assert s.recv(3) == b'ack'\n"
                                                      "bits = open('.env').read().encode()[:2]\n"
                                                      "end = time.monotonic() + 4\n"
                                                      "while time.monotonic() < end:\n"
                                                      "    try:\n"
                                                      "        s.recv(1 << (bits[0] & 7))\n"
                                                      "    except OSError:\n"
                                                      "        break\n"
                                                      "    time.sleep(0.01)\n"
                                                      "time.sleep(max(0, end - time.monotonic()))\n")
    [n] = out["proxied"]
    assert n["result"] == "cut" and ".env" in n["reason"], n
    assert [how for how, _ in seen] == ["reset", "reset"], seen
    assert all(after < 2.5 for _, after in seen), seen     # the run went on for 4 s


def test_no_proxy_thread_or_descriptor_outlives_a_run_whose_upstream_never_answers(runner):
    """One tunnel pushes more than the socket buffers hold to a server that never
    reads (the proxy's write to it cannot finish), one request waits for an answer
    that never comes; the run times out. Before, the writer thread stayed blocked
    (a write without a deadline) and kept its sockets: a gate gained a thread and
    descriptors with every such run."""
    hold: list[socket.socket] = []

    def silent_holding(conn):
        hold.append(conn)            # never read: its receive buffer fills
        return "held"

    try:
        out, _ = _tunnelled(runner, silent_holding,
                            "g = socket.create_connection(('127.0.0.1', 3128))\n"
                            "g.sendall(b'GET http://127.0.0.1:PORT/ HTTP/1.1\\r\\n"
                            "Host: 127.0.0.1:PORT\\r\\n\\r\\n')\n"
                            "s.sendall(b'x' * (64 << 20))\n", timeout=8)
    finally:
        for c in hold:
            c.close()
    assert out["exit"] != 0 and len(out["proxied"]) == 2, out
    assert out["after"] == out["before"], (out["before"], out["after"])


def test_an_upstream_on_the_ipv6_loopback_is_reached_by_proxy_and_by_route(runner):
    """A localhost name is the loopback, IPv6's too (RFC 6761): a server bound on ::1
    only is reached by a proxied request and by a client that ignores the proxy
    variables (caper's DNS gives it the route's address)."""
    if not _own(__import__("ipaddress").ip_address("::1")):
        pytest.skip("this machine has no IPv6 loopback")

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"v6 ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class V6Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6

    server = V6Server(("::1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    get = (f"PYTHON -c \"import urllib.request; print(urllib.request.urlopen("
           f"'http://v6.localhost:{port}/', timeout=20).read().decode())\"")
    unset = "env -u http_proxy -u HTTP_PROXY -u all_proxy -u ALL_PROXY "
    try:
        out = runner(f"{get} && {unset}{get}", [f"v6.localhost:{port}"])
    finally:
        server.shutdown()
        server.server_close()
    assert out["exit"] == 0 and out["stdout"] == "v6 ok\nv6 ok\n", out
    assert sorted(n["call"] for n in out["proxied"]) == ["proxy", "route"]
    assert all(n["allowed"] and n["upstream"] == f"[::1]:{port}" for n in out["proxied"])


def test_ipv6_addresses_of_this_machine_and_its_link_are_internal():
    """Refusals for IPv6 destinations are the IPv4 ones': loopback, link-local,
    unspecified, mapped IPv4 internals, metadata services."""
    for a in ("::1", "fe80::1", "fe80::1%lo", "::", "ff02::1", "::ffff:127.0.0.1",
              "::ffff:169.254.169.254", "fd00:ec2::254"):
        assert _internal(a), a
    assert not _internal("2606:4700:4700::1111")
