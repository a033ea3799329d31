"""Isolation: nothing a sandboxed command does may reach the host.

Every test runs a real command under caper (real namespaces, real sockets,
real processes, no mocks) and checks two things: the boundary held (the host
listener accepted nothing, the host process is alive, the call failed), and
the attempt was reported as the event the approver will see.

The C programs in tests/fixtures/ print one "name=RESULT" line per call they
try (RESULT is OK, an errno name, or a raw return value).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from caper.sandbox.events import End, Event, Family, Info, Kind, Refusal
from caper.sandbox.trace import trace
from helpers.hostprocs import pids_with_cmdline
from helpers.rootless import NOBODY, need_rootless_venv, nobody_project, run_as_nobody

PY = sys.executable  # not the pyenv shim: a shell script that forks a lot


# A sandbox without a user namespace: only root may make its namespaces.
PLAIN = pytest.param(False, marks=pytest.mark.skipif(
    os.geteuid() != 0, reason="a sandbox without a user namespace needs root"))


def sandbox(command, cwd, timeout=30, **kw):
    events, result = trace(command, cwd=str(cwd), timeout=timeout, **kw).run()
    return events, result


def stdout(result) -> str:
    return result.stdout.text().decode(errors="replace")


def stderr(result) -> str:
    return result.stderr.text().decode(errors="replace")


def report_lines(result) -> dict[str, str]:
    """The fixtures' "name=RESULT" lines as a dict."""
    out = {}
    for line in stdout(result).splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def of_kind(events, *kinds) -> list[Event]:
    return [e for e in events if e.kind in kinds]


def refusals(events) -> list[Event]:
    return of_kind(events, Kind.REFUSED)


def refused_names(events) -> set[str]:
    return {e.syscall for e in refusals(events)}


def assert_nothing_accepted(listener: socket.socket) -> None:
    """The run is over: a connection that got through would be queued already."""
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        conn, peer = listener.accept()
        conn.close()
        pytest.fail(f"host listener accepted a connection from the sandbox ({peer!r})")


def assert_nothing_received(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return
    pytest.fail(f"host socket received {data!r} from the sandbox")


def has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


FAMILIES = [
    pytest.param(socket.AF_INET, "127.0.0.1", Family.INET, id="ipv4"),
    pytest.param(socket.AF_INET6, "::1", Family.INET6, id="ipv6",
                 marks=pytest.mark.skipif(not has_ipv6_loopback(), reason="host has no ::1")),
]

# Runs inside the sandbox: try one network operation, print OK or the errno name.
CONNECT = """
import errno, socket, sys
fam, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.socket(fam, socket.SOCK_STREAM)  # blocking: the event carries the final result
try:
    s.connect((host, port) if fam != socket.AF_UNIX else host)
    print("OK")
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
"""
SENDTO = """
import errno, socket, sys
fam, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.socket(fam, socket.SOCK_DGRAM)
try:
    print(s.sendto(b"LEAK", (host, port) if fam != socket.AF_UNIX else host))
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
"""


# ---- network: the host's loopback and addresses are out of reach ------------------

@pytest.mark.parametrize("fam,host,family", FAMILIES)
def test_tcp_connect_to_host_loopback_listener_is_refused_and_reported(tmp_path, fam, host,
                                                                       family):
    with socket.socket(fam, socket.SOCK_STREAM) as listener:
        listener.bind((host, 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        events, result = sandbox([PY, "-c", CONNECT, str(int(fam)), host, str(port)], tmp_path)
        assert_nothing_accepted(listener)
    # The sandbox has its own, empty loopback: nobody listens on that port there.
    assert stdout(result).split() == ["ECONNREFUSED"], stderr(result)
    connects = [e for e in of_kind(events, Kind.CONNECT) if e.port == port]
    assert len(connects) == 1, [e.to_dict() for e in of_kind(events, Kind.CONNECT)]
    ev = connects[0]
    assert ev.family == family
    assert ev.path == host
    assert ev.error == "ECONNREFUSED"
    assert not ev.refused  # the namespace stopped it, not the tracer


@pytest.mark.parametrize("fam,host,family", FAMILIES)
def test_udp_sendto_host_loopback_socket_receives_nothing_and_is_reported(tmp_path, fam, host,
                                                                          family):
    with socket.socket(fam, socket.SOCK_DGRAM) as receiver:
        receiver.bind((host, 0))
        port = receiver.getsockname()[1]
        events, result = sandbox([PY, "-c", SENDTO, str(int(fam)), host, str(port)], tmp_path)
        assert_nothing_received(receiver)
    sends = [e for e in of_kind(events, Kind.SENDTO) if e.port == port]
    assert len(sends) == 1, [e.to_dict() for e in of_kind(events, Kind.SENDTO)]
    ev = sends[0]
    assert ev.family == family
    assert ev.path == host
    assert ev.syscall == "sendto"
    # UDP has no handshake: the datagram "succeeds" onto the sandbox's own
    # loopback, where nothing listens. What matters is that the host got nothing.
    assert ev.result is not None
    assert stdout(result).split() == [str(ev.result) if ev.ok else ev.error]


def test_dns_lookups_reach_no_resolver_and_are_reported(tmp_path):
    """The system resolver, as any program uses it: the host's nameservers
    (/etc/resolv.conf, seen through the snapshot) are unreachable from the
    sandbox's network, the lookup fails, and each query shows in the report."""
    try:
        with open("/etc/resolv.conf") as f:
            servers = re.findall(r"^\s*nameserver\s+(\S+)", f.read(), re.M)
    except OSError:
        servers = []
    servers = [s for s in servers if not s.startswith(("127.", "::1"))]
    if not servers:
        pytest.skip("no non-loopback nameserver in /etc/resolv.conf")
    code = """
import socket
import stat
try:
    print(socket.getaddrinfo("caper-dns-test.example.com", 80))
except socket.gaierror as e:
    print("FAILED", e.errno)
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    assert stdout(result).startswith("FAILED"), stdout(result)
    queries = [e for e in of_kind(events, Kind.CONNECT, Kind.SENDTO) if e.port == 53]
    assert queries and {e.path for e in queries} <= set(servers)
    assert not any(e.ok and e.kind == Kind.CONNECT for e in queries)
    assert all(e.error in ("ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED") for e in queries if not e.ok)


def host_global_ipv4() -> str | None:
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                             capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    return m.group(1) if m else None


def test_tcp_connect_to_host_external_address_is_unreachable(tmp_path):
    addr = host_global_ipv4()
    if addr is None:
        pytest.skip("host has no global IPv4 address")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        events, result = sandbox([PY, "-c", CONNECT, str(int(socket.AF_INET)), addr, str(port)],
                                 tmp_path)
        assert_nothing_accepted(listener)
    assert stdout(result).split() == ["ENETUNREACH"], stderr(result)
    [ev] = [e for e in of_kind(events, Kind.CONNECT) if e.port == port]
    assert (ev.path, ev.family, ev.error) == (addr, Family.INET, "ENETUNREACH")


def test_sandbox_loopback_works_for_its_own_servers(tmp_path):
    """lo is up inside: a server the command starts itself is reachable."""
    code = """
import socket
import stat
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
c = socket.create_connection(srv.getsockname())
conn, _ = srv.accept(); c.sendall(b"ping"); print(conn.recv(4).decode())
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    assert stdout(result).split() == ["ping"], stderr(result)
    [ev] = [e for e in of_kind(events, Kind.CONNECT) if e.family == Family.INET]
    assert ev.path == "127.0.0.1" and ev.ok and not ev.refused


def test_abstract_unix_socket_of_host_is_unreachable(tmp_path):
    """Abstract names live in the network namespace: the host's are not there."""
    name = f"caper-isolation-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind("\0" + name)
        listener.listen(8)
        code = ("import errno, socket\ns = socket.socket(socket.AF_UNIX)\n"
                f"try:\n    s.connect('\\0{name}'); print('OK')\n"
                "except OSError as e:\n    print(errno.errorcode[e.errno])\n")
        events, result = sandbox([PY, "-c", code], tmp_path)
        assert_nothing_accepted(listener)
    assert stdout(result).split() == ["ECONNREFUSED"], stderr(result)
    [ev] = of_kind(events, Kind.CONNECT)
    assert ev.family == Family.ABSTRACT
    assert ev.path == "@" + name
    assert ev.error == "ECONNREFUSED"


# ---- unix sockets on the filesystem: the Docker-socket pattern --------------------

@pytest.fixture
def host_unix_listener(tmp_path):
    path = tmp_path / "docker.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(8)
    yield s, str(path)
    s.close()


@pytest.mark.parametrize("how", ["absolute", "relative", "host_symlink"])
def test_connect_to_host_unix_socket_is_refused_and_reported(tmp_path, host_unix_listener, how):
    listener, path = host_unix_listener
    if how == "absolute":
        target, cwd = path, tmp_path
    elif how == "relative":
        target, cwd = "docker.sock", tmp_path
    else:  # a symlink the host made, pointing at its socket
        (tmp_path / "link.sock").symlink_to(path)
        target, cwd = str(tmp_path / "link.sock"), tmp_path
    events, result = sandbox([PY, "-c", CONNECT, str(int(socket.AF_UNIX)), target, "0"], cwd)
    assert_nothing_accepted(listener)
    assert stdout(result).split() == ["EACCES"], stderr(result)
    [ev] = of_kind(events, Kind.CONNECT)
    assert ev.family == Family.UNIX
    assert ev.path == os.path.join(str(tmp_path), os.path.basename(target))
    assert ev.refused
    assert ev.error == "EACCES"


def _datagrams_to_host(tmp_path, cfixture):
    """Run the unix_dgram fixture against a host datagram socket; return the
    events, the result, what the host socket received and its path."""
    host = str(tmp_path / "host-dgram.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(host)
        events, result = sandbox([cfixture("unix_dgram"), str(tmp_path / "own.sock"), host],
                                 tmp_path)
        got = []
        receiver.setblocking(False)
        try:
            while True:
                got.append(receiver.recv(100))
        except BlockingIOError:
            pass
    return events, result, got, host


def test_datagram_to_host_unix_socket_is_refused_for_sendto_and_sendmsg(tmp_path, cfixture):
    events, result, got, host = _datagrams_to_host(tmp_path, cfixture)
    r = report_lines(result)
    assert r["bind_own"] == "OK" and r["sendto_own"] == "OK"
    assert r["sendto_host"] == "EACCES"
    assert r["sendmsg_host"] == "EACCES"
    assert r["sendmsg_cmsg_long"] == r["sendmsg_cmsg_short"] == "EINVAL"   # as natively
    assert b"LEAK-sendto" not in got and b"LEAK-sendmsg" not in got
    refused = {e.syscall for e in of_kind(events, Kind.SENDTO) if e.path == host and e.refused}
    assert {"sendto", "sendmsg"} <= refused


def test_sendmmsg_cannot_smuggle_a_datagram_to_a_host_unix_socket(tmp_path, cfixture):
    events, result, got, host = _datagrams_to_host(tmp_path, cfixture)
    assert report_lines(result)["bind_own"] == "OK"
    assert b"LEAK-sendmmsg" not in got, "the host socket received the sandbox's datagram"
    assert any(e.syscall == "sendmmsg" and e.path == host for e in of_kind(events, Kind.SENDTO))


def test_unix_socket_bound_inside_the_sandbox_works(tmp_path):
    code = """
import os, socket
path = os.path.join(os.getcwd(), "own.sock")
srv = socket.socket(socket.AF_UNIX); srv.bind(path); srv.listen(1)
c = socket.socket(socket.AF_UNIX); c.connect(path)
conn, _ = srv.accept(); c.sendall(b"OK"); print(conn.recv(2).decode())
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    assert stdout(result).split() == ["OK"], stderr(result)
    path = str(tmp_path / "own.sock")
    [bind] = [e for e in of_kind(events, Kind.BIND) if e.path == path]
    [conn] = [e for e in of_kind(events, Kind.CONNECT) if e.path == path]
    assert bind.ok and conn.ok and not conn.refused


def test_bound_path_swapped_for_symlink_to_host_socket_is_still_refused(tmp_path,
                                                                      host_unix_listener):
    listener, host = host_unix_listener
    code = f"""
import errno, os, socket
own = {str(tmp_path / 'own.sock')!r}
s = socket.socket(socket.AF_UNIX); s.bind(own); s.close()
os.unlink(own); os.symlink({host!r}, own)
c = socket.socket(socket.AF_UNIX)
try:
    c.connect(own); print("CONNECTED")
except OSError as e:
    print(errno.errorcode[e.errno])
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    assert_nothing_accepted(listener)
    assert stdout(result).split() == ["EACCES"]
    [ev] = of_kind(events, Kind.CONNECT)
    assert ev.refused


def test_bind_inside_chroot_does_not_unlock_the_host_path(tmp_path, host_unix_listener):
    """A chrooted process binds the host socket's path: really jail/<path>."""
    listener, host = host_unix_listener
    jail = tmp_path / "jail"
    (jail / str(tmp_path).lstrip("/")).mkdir(parents=True)
    code = f"""
import errno, os, socket
pid = os.fork()
if pid == 0:
    os.chroot({str(jail)!r})
    socket.socket(socket.AF_UNIX).bind({host!r})   # really jail/<host path>
    os._exit(0)
os.waitpid(pid, 0)
c = socket.socket(socket.AF_UNIX)
try:
    c.connect({host!r}); print("CONNECTED")
except OSError as e:
    print(errno.errorcode[e.errno])
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    assert_nothing_accepted(listener)
    assert stdout(result).split() == ["EACCES"]


@pytest.fixture
def short_tmp():
    """A short directory: unix socket paths stop at 107 bytes."""
    d = tempfile.mkdtemp(prefix="cpr")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("how", ["dotdot", "absolute_symlink"])
def test_connect_from_chroot_resolves_like_the_kernel(short_tmp, how):
    """The sandbox binds its own socket at P outside a jail and chroots into a
    directory holding the host's socket. A name that means P to the tracer
    but the host socket to the kernel must still be refused. (The tracer
    resolves through /proc/<tid>/root, where '..' and absolute symlinks would
    leave a chroot: so caper drops CAP_SYS_CHROOT, and chroot itself fails.)"""
    jail = short_tmp / "jail"
    if how == "dotdot":
        # kernel: jail/docker.sock (host)  tracer: jail/../docker.sock (own)
        jail.mkdir()
        host, own, name = jail / "docker.sock", short_tmp / "docker.sock", "/../docker.sock"
    else:
        # kernel: jail/<own> (host)  tracer: the symlink's target in its own root (own)
        own = short_tmp / "own.sock"
        host = jail / str(own).lstrip("/")
        host.parent.mkdir(parents=True)
        (jail / "link.sock").symlink_to(own)
        name = "/link.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(host))
        listener.listen(8)
        code = f"""
import errno, os, socket
socket.socket(socket.AF_UNIX).bind({str(own)!r})
try:
    os.chroot({str(jail)!r})
except PermissionError:
    print("CHROOT_EPERM")
c = socket.socket(socket.AF_UNIX)
try:
    c.connect({name!r}); print("CONNECTED")
except OSError as e:
    print(errno.errorcode[e.errno])
"""
        events, result = sandbox([PY, "-c", code], short_tmp)
        assert_nothing_accepted(listener)
    assert stdout(result).split() in (["CHROOT_EPERM", "EACCES"], ["CHROOT_EPERM", "ENOENT"],
                                      ["EACCES"])


def test_connect_address_swapped_by_another_thread_does_not_reach_host(tmp_path, cfixture,
                                                                      host_unix_listener):
    listener, host = host_unix_listener
    own = str(tmp_path / "own.sock")
    events, result = sandbox([cfixture("race_address", "-pthread"), "connect", own, host, "20000"],
                             tmp_path)
    r = report_lines(result)
    assert r["bind_own"] == "OK"
    assert_nothing_accepted(listener)
    assert r["host_connected"] == "never"
    assert all(e.path == own for e in of_kind(events, Kind.CONNECT) if e.ok)


@pytest.mark.parametrize("call", ["sendto", "sendmsg"])
def test_datagram_address_swapped_by_another_thread_does_not_reach_host(tmp_path, cfixture, call):
    """The tracer sends the datagram itself, to the inode it checked: before,
    a swap between the check and the kernel's own read reached the host
    socket in ~600 tries."""
    host = str(tmp_path / "host-dgram.sock")
    own = str(tmp_path / "own.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(host)
        events, result = sandbox([cfixture("race_address", "-pthread"), call, own, host, "5000"],
                                 tmp_path)
        receiver.setblocking(False)
        with pytest.raises(BlockingIOError):
            got = receiver.recv(100)
            pytest.fail(f"the host socket received {got!r}")
    r = report_lines(result)
    assert r["bind_own"] == "OK" and int(r["sent"]) > 0
    # Each datagram went to OWN, or, where the swap landed before the
    # tracer's copy of the address (1 in ~10,000 on a loaded machine), was
    # refused as one to the host's socket.
    sends = [e for e in of_kind(events, Kind.SENDTO) if e.syscall == call]
    assert sends and all((e.path == own and e.ok) or (e.path == host and e.error == "EACCES")
                         for e in sends), [(e.path, e.error) for e in sends]


@pytest.mark.parametrize("mode", ["family", "msgname", "fdswap"])
def test_what_the_kernel_would_read_again_cannot_be_changed_to_reach_host(tmp_path, cfixture,
                                                                          mode):
    """A second thread flips what the tracer checked before the kernel reads it
    again: connect's sun_family (AF_INET <-> AF_UNIX), sendmsg's msg_name
    (NULL <-> the host socket) on a unix datagram socket, or the descriptor
    itself (dup2: an inet socket <-> a unix one). The tracer connects and
    sends itself, on the socket it pinned, from its copy: before, each of
    these reached the host socket within a few thousand tries."""
    host = str(tmp_path / "host.sock")
    kind = socket.SOCK_STREAM if mode == "family" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_UNIX, kind) as receiver:
        receiver.bind(host)
        if kind == socket.SOCK_STREAM:
            receiver.listen(64)
        # Unpinned, the flipping thread runs beside the tracer (pinned to
        # caper's CPU it wins far less often).
        events, result = sandbox([cfixture("race_socket", "-pthread"), mode, host, "5000"],
                                 tmp_path, share_cpu=False)
        receiver.setblocking(False)
        with pytest.raises(BlockingIOError):
            got = receiver.accept() if kind == socket.SOCK_STREAM else receiver.recv(100)
            pytest.fail(f"the host socket received {got!r}")
    r = report_lines(result)
    assert r["calls"] == "5000" and r["ok"] == "0", r


def test_socket_families_no_network_namespace_holds_are_refused(tmp_path):
    """AF_VSOCK (which no network namespace isolates: the hypervisor's side is
    one connect away) and other families the sandbox's namespace does not
    hold cannot be created; unix, inet, inet6 and netlink can."""
    code = """
import errno, socket
for fam in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, 40, 38, 17):
    try:
        socket.socket(fam, socket.SOCK_DGRAM if fam != 17 else socket.SOCK_RAW).close()
        print(fam, "OK")
    except OSError as e:
        print(fam, errno.errorcode[e.errno])
try:
    socket.socketpair(40, socket.SOCK_STREAM)
    print("pair OK")
except OSError as e:
    print("pair", errno.errorcode[e.errno])
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    got = dict(line.split() for line in stdout(result).splitlines())
    assert got == {"1": "OK", "2": "OK", "10": "OK", "16": "OK", "40": "EAFNOSUPPORT",
                   "38": "EAFNOSUPPORT", "17": "EAFNOSUPPORT", "pair": "EAFNOSUPPORT"}, got


def test_datagrams_the_tracer_sends_arrive_whole_with_their_descriptors(tmp_path):
    """What send_for copies out of the tracee: several buffers (sendmsg's
    iovec), SCM_RIGHTS descriptors (duplicated into the tracer, so the
    receiver gets working ones), the sender's own address."""
    (tmp_path / "note").write_text("passed along\n")
    code = f"""
import array, os, socket
a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); a.bind({str(tmp_path / 'a.sock')!r})
b = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); b.bind({str(tmp_path / 'b.sock')!r})
a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
f = os.open({str(tmp_path / 'note')!r}, os.O_RDONLY)
n = b.sendmsg([b"x" * 70000, b"y" * 30000],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [f]))], 0,
              {str(tmp_path / 'a.sock')!r})
msg, fds, flags, addr = socket.recv_fds(a, 200000, 4)
print(n, len(msg), msg.count(b"x"), msg.count(b"y"), len(fds), addr)
print(os.read(fds[0], 100).decode().strip())
print(b.sendto(b"plain", {str(tmp_path / 'a.sock')!r}), a.recvfrom(10))
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    out = stdout(result).splitlines()
    assert out[0].split() == ["100000", "100000", "70000", "30000", "1", str(tmp_path / "b.sock")], \
        stderr(result)
    assert out[1] == "passed along"
    assert out[2] == f"5 (b'plain', '{tmp_path / 'b.sock'}')"
    sends = [e for e in of_kind(events, Kind.SENDTO) if e.path == str(tmp_path / "a.sock")]
    assert {e.syscall for e in sends} == {"sendmsg", "sendto"} and all(e.ok for e in sends)


def test_own_seccomp_user_notification_cannot_bypass_the_tracer(tmp_path, cfixture,
                                                               host_unix_listener):
    listener, host = host_unix_listener
    hidden = tmp_path / "hidden.txt"
    events, result = sandbox([cfixture("usernotif", "-pthread"), host, str(hidden)], tmp_path)
    assert_nothing_accepted(listener)
    r = report_lines(result)
    assert r["connect_host"] != "OK"
    assert r["io_uring_setup"] != "OK"
    # A file change the report does not show is as bad as a leak.
    assert not hidden.exists() or any(e.path == str(hidden) for e in of_kind(events, Kind.OPEN))


def test_own_seccomp_filter_cannot_forge_the_tracer_table_index(tmp_path, cfixture,
                                                                host_unix_listener):
    listener, host = host_unix_listener
    events, result = sandbox([cfixture("tracedata"), host], tmp_path)
    assert_nothing_accepted(listener)
    r = report_lines(result)
    assert r["connect_host"] != "OK"
    assert r["io_uring_setup"] == "EPERM"
    assert r["unshare_user"] == "EPERM"
    assert {"io_uring_setup", "unshare"} <= refused_names(events)


# ---- processes: the host's are invisible and out of reach ------------------------

@pytest.fixture
def host_sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_kill_of_host_process_fails_and_is_reported(tmp_path, host_sleeper):
    pid = host_sleeper.pid
    events, result = sandbox(f"kill -9 {pid}; echo rc=$?; test -e /proc/{pid} && echo visible",
                             tmp_path)
    time.sleep(0.05)
    assert host_sleeper.poll() is None, "the host process was killed from inside the sandbox"
    out = stdout(result)
    assert "rc=0" not in out and "rc=" in out
    assert "visible" not in out
    sig = [e for e in of_kind(events, Kind.SIGNAL) if e.arg0 == pid]
    assert len(sig) == 1, [e.to_dict() for e in of_kind(events, Kind.SIGNAL)]
    assert sig[0].arg1 == 9 and sig[0].syscall == "kill" and sig[0].error == "ESRCH"


def test_kill_minus_one_reaches_only_the_sandbox(tmp_path, host_sleeper):
    events, result = sandbox("sleep 30 & kill -9 -1; echo survived", tmp_path, timeout=20)
    time.sleep(0.05)
    assert host_sleeper.poll() is None
    assert stdout(result).split() == ["survived"]
    assert any(e.arg1 == 9 and e.ok for e in of_kind(events, Kind.SIGNAL))
    # The sandbox's own sleep was killed, so the run did not wait for it.
    assert result.stats.wall_ms < 10_000


def test_signal_event_reports_negative_targets_as_negative(tmp_path):
    events, result = sandbox("kill -9 -1; kill -0 -$$; echo done", tmp_path)
    assert stdout(result).split() == ["done"]
    targets = [e.arg0 for e in of_kind(events, Kind.SIGNAL)]
    assert targets == [-1, -2], targets
    assert [e.to_dict()["target"] for e in of_kind(events, Kind.SIGNAL)] == [-1, -2]


def test_daemons_started_inside_do_not_outlive_the_run(tmp_path):
    marker = f"{31 + os.getpid() % 1000}.{uuid.uuid4().int % 10**6:06d}"  # sleep DURATION
    events, result = sandbox(f"setsid sleep {marker} & (nohup sleep {marker} >/dev/null 2>&1 &); "
                             "echo started", tmp_path)
    assert stdout(result).split() == ["started"]
    assert pids_with_cmdline(f"sleep\0{marker}".encode()) == []


def test_proc_shows_only_the_sandbox_and_pid_1_is_caper_init(tmp_path):
    code = """
import os
pids = sorted(int(d) for d in os.listdir("/proc") if d.isdigit())
def ppid(p):
    for line in open(f"/proc/{p}/status"):
        if line.startswith("PPid:"):
            return int(line.split()[1])
print("pids", *pids)
print("self", os.getpid(), "parent", os.getppid())
print("init_ppid", ppid(1))
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    lines = {l.split()[0]: l.split()[1:] for l in stdout(result).splitlines()}
    pids = [int(p) for p in lines["pids"]]
    assert 1 in pids
    assert os.getpid() not in pids
    assert len(pids) <= 3, pids  # init, the command (and nothing of the host)
    assert lines["init_ppid"] == ["0"]        # pid 1 is the namespace's init ...
    assert lines["self"] == ["2", "parent", "1"]   # ... and the command is its child


def test_untraced_child_cannot_act(tmp_path, cfixture):
    """A CLONE_UNTRACED child would escape auto-attach. Whether caper refuses
    the clone or not, such a child must not act: caper's filter still holds
    it, and with no tracer every listed call fails with ENOSYS."""
    target = tmp_path / "created-untraced"
    events, result = sandbox([cfixture("untraced"), str(target)], tmp_path)
    r = report_lines(result)
    assert r["clone_untraced"] in ("OK", "EPERM")
    assert r.get("child_create", "EPERM") in ("ENOSYS", "EPERM")
    assert r.get("child_exec", "ENOSYS") != "OK"
    assert not target.exists()


def test_untraced_child_is_refused_or_reported(tmp_path, cfixture):
    events, result = sandbox([cfixture("untraced"), str(tmp_path / "x")], tmp_path)
    refused_clone = any(e.syscall == "clone" for e in refusals(events))
    children = [e for e in of_kind(events, Kind.PROC_START) if e.ppid]
    assert refused_clone or children


@pytest.mark.parametrize("how", ["fork", "untraced"])
def test_process_limit_holds(tmp_path, cfixture, how):
    """16 live processes against max_pids=4: the sandbox is killed, or the
    extra processes were never made."""
    if how == "fork":
        cmd = "for i in $(seq 16); do sleep 5 & done; echo made=16; wait"
    else:
        cmd = [cfixture("untraced"), str(tmp_path / "x"), "16"]
    events, result = sandbox(cmd, tmp_path, max_pids=4, timeout=20)
    made = int(report_lines(result).get("made", "0"))
    assert result.end == End.PIDS_LIMIT or made <= 4, (result.status, stdout(result))


# A bounded burst: FORKS children that pause, made as fast as one process can.
BURST = """
import os, signal
made = 0
for _ in range({forks}):
    try:
        pid = os.fork()
    except OSError as e:
        print("fork=" + os.strerror(e.errno), flush=True)
        break
    if pid == 0:
        os.closerange(0, 3)     # hold no pipe of the caller's open
        signal.pause()
    made += 1
print(f"made={{made}}", flush=True)
"""


def _pids_cgroup_or_skip():
    from caper.sandbox.limits import sandbox_cgroups
    probe = sandbox_cgroups(None, 4)
    probe.remove()
    if probe.pids is None:
        pytest.skip("no pids cgroup can be made here (rootless: none delegated)")


def test_the_kernel_refuses_forks_past_the_pids_cgroup(tmp_path):
    """The pids cgroup on its own, without the tracer: the process placed in
    it gets EAGAIN at max_pids + PIDS_MARGIN tasks, and the cgroup says so."""
    from caper.sandbox.limits import PIDS_MARGIN, sandbox_cgroups
    _pids_cgroup_or_skip()
    cg = sandbox_cgroups(None, 4)
    [procs] = cg.procs
    join = f"open({procs!r}, 'w').write(str(os.getpid()))\n"
    p = subprocess.Popen([PY, "-c", "import os\n" + join + BURST.format(forks=40)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=60)
        assert "fork=Resource temporarily unavailable" in out, out + err
        assert f"made={4 + PIDS_MARGIN - 1}" in out           # the parent is one of the tasks
        assert cg.forks_refused()
    finally:
        os.killpg(p.pid, signal.SIGKILL)                       # its paused children
        for _ in range(100):
            with open(procs) as f:
                if not f.read().strip():
                    break
            time.sleep(0.05)
        cg.remove()
    assert not os.path.exists(os.path.dirname(cg.procs[0]))


def test_forks_the_pids_cgroup_refused_end_the_run_at_the_pids_limit(tmp_path, monkeypatch):
    """With no margin, the kernel refuses the command's forks before the
    tracer counts past the limit: the run still ends as PIDS_LIMIT."""
    from caper.sandbox import limits
    _pids_cgroup_or_skip()
    monkeypatch.setattr(limits, "PIDS_MARGIN", 0)
    events, result = sandbox([PY, "-c", BURST.format(forks=40)], tmp_path, max_pids=8,
                             timeout=20)
    r = report_lines(result)
    assert r.get("fork") == "Resource temporarily unavailable", stdout(result)
    assert int(r["made"]) <= 8 and result.end == End.PIDS_LIMIT


# ---- privileged calls: refused by the tracer and reported ------------------------

def test_mount_umount_pivot_root_commands_fail_and_are_refused(tmp_path):
    (tmp_path / "mnt").mkdir()
    (tmp_path / "mnt" / "old").mkdir()
    cmd = ("PATH=$PATH:/usr/sbin:/sbin; "      # pivot_root is in sbin, off a user's PATH
           "mount -t tmpfs none mnt; echo mount=$?; "
           "umount /proc; echo umount=$?; "
           "pivot_root mnt mnt/old; echo pivot_root=$?; "
           "test -e /proc/self/status && echo proc=still")
    events, result = sandbox(cmd, tmp_path)
    r = report_lines(result)
    assert r["mount"] != "0" and r["umount"] != "0" and r["pivot_root"] != "0"
    assert r["proc"] == "still"
    assert not os.path.ismount(tmp_path / "mnt")
    names = refused_names(events)
    assert names & {"mount", "fsopen", "fsmount", "move_mount"}, names
    assert {"umount2", "pivot_root"} <= names
    for e in refusals(events):
        assert e.flags == Refusal.DENYLIST and e.error == "EPERM" and e.refused


MOUNT_CALLS = ["mount", "umount2", "pivot_root", "open_by_handle_at", "open_tree", "move_mount",
               "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"]
KERNEL_CALLS = ["bpf", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd",
                "init_module", "finit_module", "delete_module", "kexec_load", "swapon", "swapoff",
                "reboot", "acct", "quotactl"]


@pytest.mark.parametrize("fixture,calls,args", [
    ("mounts", MOUNT_CALLS, ["mnt"]),
    ("kernel", KERNEL_CALLS, []),
    ("io_uring", ["io_uring_setup", "io_uring_enter", "io_uring_register"], []),
])
def test_denylisted_syscalls_fail_with_eperm_and_are_reported(tmp_path, cfixture, fixture, calls,
                                                             args):
    (tmp_path / "mnt").mkdir()
    events, result = sandbox([cfixture(fixture), *args], tmp_path)
    r = report_lines(result)
    assert {c: r.get(c) for c in calls} == {c: "EPERM" for c in calls}, stdout(result)
    by_name = {e.syscall: e for e in refusals(events)}
    for c in calls:
        assert c in by_name, f"{c} not reported: {sorted(by_name)}"
        ev = by_name[c]
        assert ev.flags == Refusal.DENYLIST and ev.refused and ev.error == "EPERM"
    assert not os.path.ismount(tmp_path / "mnt")


def test_namespace_calls_are_refused_and_reported(tmp_path, cfixture):
    events, result = sandbox([cfixture("namespaces")], tmp_path)
    r = report_lines(result)
    assert r == {"setns": "EPERM", "unshare_user": "EPERM", "unshare_mnt": "EPERM",
                 "unshare_net": "EPERM", "clone_user": "EPERM", "clone_pid": "EPERM",
                 "clone3_user": "ENOSYS",  # flags unreadable to the filter: libc falls back
                 "plain_fork": "OK"}, stdout(result)
    refused = [(e.syscall, Refusal(e.flags)) for e in refusals(events)]
    assert refused == [("setns", Refusal.DENYLIST)] + [("unshare", Refusal.NAMESPACE)] * 3 + \
        [("clone", Refusal.NAMESPACE)] * 2
    assert all(e.error == "EPERM" for e in refusals(events))
    # The refused clones made no process; the plain fork did.
    starts = [e for e in of_kind(events, Kind.PROC_START) if e.ppid]
    assert len(starts) == 1


def test_unshare_command_cannot_make_a_user_namespace(tmp_path):
    events, result = sandbox("unshare -U -r id -u; echo rc=$?", tmp_path)
    assert "rc=0" not in stdout(result)
    assert ("unshare", Refusal.NAMESPACE) in {(e.syscall, Refusal(e.flags))
                                              for e in refusals(events)}


def test_ptrace_and_reaching_into_init_are_refused(tmp_path, cfixture):
    events, result = sandbox([cfixture("ptrace")], tmp_path)
    r = report_lines(result)
    # TRACEME would succeed in a bare process: EPERM here is caper's.
    assert r["traceme"] == "EPERM" and r["attach_child"] == "EPERM"
    assert r["seize_child"] == "EPERM" and r["attach_init"] == "EPERM"
    # init keeps its capabilities and no filter; its memory and fds are out of reach.
    assert r["open_init_mem"] in ("EACCES", "EPERM")
    assert r["vm_writev_init"] in ("EACCES", "EPERM")
    assert r["pidfd_getfd_init"] in ("EACCES", "EPERM"), stdout(result)
    ptraces = [e for e in refusals(events) if e.syscall == "ptrace"]
    assert len(ptraces) + sum(e.count - 1 for e in ptraces) >= 1
    assert all(e.flags == Refusal.DENYLIST for e in ptraces)
    assert {e.arg0 for e in ptraces} >= {0}  # PTRACE_TRACEME


# ---- foreign ABIs: int 0x80 and x32 ---------------------------------------------

AUDIT_ARCH_I386 = 0x40000003


def test_int80_syscalls_are_refused_before_they_run(tmp_path, cfixture):
    exe = cfixture("int80")
    # Control: outside caper the fixture really does run 32-bit calls.
    host = subprocess.run([exe, str(tmp_path / "host-file")], capture_output=True, text=True,
                          timeout=10)
    assert "LEAK" in host.stdout and (tmp_path / "host-file").exists()
    assert re.search(r"^getpid=\d+$", host.stdout, re.M)

    target = tmp_path / "created-by-int80"
    events, result = sandbox([exe, str(target)], tmp_path)
    r = report_lines(result)
    assert r == {"getpid": "EPERM", "write": "EPERM", "open": "EPERM"}, stdout(result)
    assert "LEAK" not in stdout(result)
    assert not target.exists()
    abi = [e for e in refusals(events) if e.flags == Refusal.ABI]
    assert [e.arg1 for e in abi] == [20, 4, 5]  # i386 getpid, write, open
    for e in abi:
        assert e.refused and e.error == "EPERM"
        assert e.syscall == f"syscall {e.arg1} (arch 0x{AUDIT_ARCH_I386:x})"


def test_x32_syscalls_are_refused_before_they_run(tmp_path, cfixture):
    exe = cfixture("x32")
    target = tmp_path / "created-by-x32"
    events, result = sandbox([exe, str(target)], tmp_path)
    r = report_lines(result)
    # A kernel without x32 answers ENOSYS, one with x32 runs them: EPERM is caper's.
    assert r == {"getpid": "EPERM", "write": "EPERM", "openat": "EPERM", "x32_520": "EPERM"}, \
        stdout(result)
    assert "LEAK" not in stdout(result)
    assert not target.exists()
    abi = [e for e in refusals(events) if e.flags == Refusal.ABI]
    assert [e.arg1 for e in abi] == [0x40000000 | n for n in (39, 1, 257, 520)]
    assert all(e.refused and e.error == "EPERM" for e in abi)


# ---- the view from inside --------------------------------------------------------

@pytest.mark.parametrize("userns", [PLAIN, True], ids=["plain", "userns"])
def test_network_has_only_loopback_and_it_is_up(tmp_path, userns):
    code = """
import os
print("sys", *sorted(os.listdir("/sys/class/net")))
print("dev", *sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
print("flags", open("/sys/class/net/lo/flags").read().strip())
"""
    events, result = sandbox([PY, "-c", code], tmp_path, userns=userns)
    lines = {l.split()[0]: l.split()[1:] for l in stdout(result).splitlines()}
    assert lines["sys"] == ["lo"], stdout(result) + stderr(result)
    assert lines["dev"] == ["lo"]
    assert int(lines["flags"][0], 16) & 0x1  # IFF_UP
    events, result = sandbox("ip -o link; ip link add caper0 type dummy; echo add=$?", tmp_path,
                             userns=userns)
    out = stdout(result)
    links = [l for l in out.splitlines() if re.match(r"^\d+: ", l)]
    assert len(links) == 1 and links[0].startswith("1: lo:") and ",UP" in links[0]
    assert "add=0" not in out  # CAP_NET_ADMIN is gone


def test_hostname_is_the_hosts_and_cannot_be_set(tmp_path):
    """The sandbox's own uts namespace, named as the host is (a name of
    caper's own would tell the command it is pre-executed)."""
    host_name = socket.gethostname()
    events, result = sandbox("hostname; cat /proc/sys/kernel/hostname; "
                             "hostname caper-evil 2>/dev/null; echo set=$?", tmp_path)
    lines = stdout(result).split()
    assert lines[0] == host_name and lines[0] == lines[1]
    assert lines[2] != "set=0"
    assert socket.gethostname() == host_name


def test_dev_holds_only_the_minimal_nodes_and_is_read_only(tmp_path):
    code = """
import errno, os
print("dev", *sorted(os.listdir("/dev")))
for path in ("/dev/evil", "/dev/shm/../evil2"):
    try:
        open(path, "w"); print("create OK")
    except OSError as e:
        print("create", errno.errorcode[e.errno])
try:
    os.open("/dev/tty", os.O_RDWR); print("tty OK")
except OSError as e:
    print("tty", errno.errorcode[e.errno])
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    out = stdout(result).splitlines()
    assert out[0].split()[1:] == sorted(["null", "zero", "full", "random", "urandom", "tty", "pts",
                                         "ptmx", "shm", "fd", "stdin", "stdout", "stderr"]), out
    assert out[1:3] == ["create EROFS", "create EROFS"]
    assert out[3] == "tty ENXIO"  # no controlling terminal
    failed = [e for e in of_kind(events, Kind.OPEN) if e.path == "/dev/evil"]
    assert failed and failed[0].error == "EROFS"


def test_device_nodes_cannot_be_made(tmp_path):
    events, result = sandbox("mknod disk b 8 0; echo rc=$?", tmp_path)
    assert "rc=0" not in stdout(result)
    assert not (tmp_path / "disk").exists()
    [ev] = of_kind(events, Kind.MKNOD)
    assert ev.error == "EPERM" and ev.path == str(tmp_path / "disk")


def test_kernel_knobs_are_read_only(tmp_path):
    knobs = ["/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname",
             "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger",
             "/proc/scsi/scsi", "/proc/latency_stats", "/proc/timer_stats", "/proc/self/comm",
             "/sys/kernel/uevent_helper", "/sys/class/net/lo/mtu"]
    knobs = [k for k in knobs if os.path.exists(k) or k.startswith("/sys/class/net/lo")]
    # Open for writing only: nothing is ever written, even if the open succeeded.
    code = f"""
import errno, os
for k in {knobs!r}:
    try:
        os.close(os.open(k, os.O_WRONLY)); print(k, "OK")
    except OSError as e:
        print(k, errno.errorcode[e.errno])
print("cgroup", *os.listdir("/sys/fs/cgroup"))
"""
    events, result = sandbox([PY, "-c", code], tmp_path)
    lines = stdout(result).splitlines()
    # A fresh sysfs: no cgroup hierarchy (release_agent, cgroup.procs) below it.
    assert lines.pop() == "cgroup"
    got = dict(l.split() for l in lines)
    # In a user namespace, a knob the host's root owns fails the permission
    # check (EACCES) before the read-only mount is reached.
    refused = {"EROFS"} if os.geteuid() == 0 else {"EROFS", "EACCES"}
    assert set(got) == set(knobs) and set(got.values()) <= refused, \
        stdout(result) + stderr(result)
    opens = {e.path: e.error for e in of_kind(events, Kind.OPEN) if e.path in knobs}
    assert opens == got


# Capabilities that reach past the namespaces (linux/capability.h numbers).
DANGEROUS_CAPS = {"CAP_DAC_READ_SEARCH": 2, "CAP_SETPCAP": 8, "CAP_NET_ADMIN": 12,
                  "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_PTRACE": 19,
                  "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_TIME": 25, "CAP_MKNOD": 27,
                  "CAP_PERFMON": 38, "CAP_BPF": 39}


@pytest.mark.parametrize("userns", [PLAIN, True], ids=["plain", "userns"])
def test_capabilities_dropped_no_new_privs_and_seccomp(tmp_path, userns):
    events, result = sandbox(["cat", "/proc/self/status"], tmp_path, userns=userns)
    status = dict(l.split(":\t", 1) for l in stdout(result).splitlines() if ":\t" in l)
    for field in ("CapBnd", "CapEff", "CapPrm", "CapInh"):
        mask = int(status[field], 16)
        kept = sorted(n for n, bit in DANGEROUS_CAPS.items() if mask >> bit & 1)
        assert kept == [], f"{field} keeps {kept}"
    assert int(status["CapAmb"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"


def test_no_host_file_descriptor_leaks_in(tmp_path):
    # Inheritable host fds: only caper's own close-on-exec sweep keeps them out.
    leak_file = open(tmp_path / "host-secret", "w")
    leak_sock = socket.socket()
    leak_sock.bind(("127.0.0.1", 0))
    leak_sock.listen(1)
    os.set_inheritable(leak_file.fileno(), True)
    os.set_inheritable(leak_sock.fileno(), True)
    try:
        code = """
import os
for fd in range(1024):
    try:
        os.fstat(fd)
    except OSError:
        continue
    print(fd, os.readlink(f"/proc/self/fd/{fd}"))
"""
        events, result = sandbox([PY, "-c", code], tmp_path)
    finally:
        leak_file.close()
        leak_sock.close()
    fds = dict(l.split(" ", 1) for l in stdout(result).splitlines())
    assert sorted(fds) == ["0", "1", "2"], fds
    assert fds["0"] == "/dev/null"


def test_ipc_and_shared_memory_are_the_sandbox_own(tmp_path):
    shm = f"/dev/shm/caper-isolation-{uuid.uuid4().hex}"
    with open(shm, "w") as f:
        f.write("host")
    q = subprocess.run(["ipcmk", "-Q"], capture_output=True, text=True)
    qid = re.search(r"(\d+)\s*$", q.stdout.strip()) if q.returncode == 0 else None
    try:
        events, result = sandbox("ls -A /dev/shm; echo ---; tail -n +2 /proc/sysvipc/msg; "
                                 "echo ---", tmp_path)
    finally:
        os.unlink(shm)
        if qid:
            subprocess.run(["ipcrm", "-q", qid.group(1)], capture_output=True)
    assert stdout(result).split("\n") == ["---", "---", ""], stdout(result)


def test_host_processes_roots_and_fds_are_out_of_reach(tmp_path):
    """/proc/<host pid>/root and /proc/<host pid>/fd: a host pid does not exist
    in the sandbox's fresh /proc (its own pid namespace), so neither path leads
    anywhere."""
    host = os.getpid()                       # pytest itself: a host process
    target = tmp_path / "via-proc-root"
    events, result = sandbox(
        f"ls /proc/{host}/root/ >/dev/null 2>&1 && echo root-visible; "
        f"echo x > /proc/{host}/root{target} 2>/dev/null && echo wrote; "
        f"ls /proc/{host}/fd/ >/dev/null 2>&1 && echo fds-visible; "
        f"cat /proc/{host}/environ >/dev/null 2>&1 && echo environ-visible; echo done", tmp_path)
    assert stdout(result).split() == ["done"]
    assert not target.exists()


# ---- device nodes and FIFOs on host filesystems ------------------------------

DEVICE_PROBE = """
for n in null zero; do
  if printf x > "$n" 2>/dev/null; then echo "write-$n=OK"; else echo "write-$n=FAIL"; fi
  if head -c 4 "$n" >/dev/null 2>&1; then echo "read-$n=OK"; else echo "read-$n=FAIL"; fi
done
"""


@pytest.mark.parametrize("userns", [False, True], ids=["root", "rootless"])
def test_a_device_node_on_a_host_filesystem_opens_no_device(tmp_path, userns):
    """A device node outside /dev (a chroot or container tree, anything
    mknod'd) opened the real device from a blocked run: the overlays of host
    filesystems were not nodev, and the command keeps CAP_DAC_OVERRIDE. Here
    the harmless null (1:3) and zero (1:5) stand in for kmsg or a disk: an
    open for reading or writing now fails, the report flags the attempt, and
    the node itself is unchanged."""
    from caper.report.build import DEVICE_OPENS, NOTES
    from caper.transaction import run
    if os.geteuid() != 0:
        pytest.skip("needs root to make the device nodes")
    if userns:   # a directory uid 65534 can reach (pytest's own is root's alone)
        need_rootless_venv()
        tmp_path = Path(tempfile.mkdtemp(prefix="caper-devnode-"))
        os.chmod(tmp_path, 0o755)
    ws = tmp_path / "chroot"
    ws.mkdir()
    for name, minor in (("null", 3), ("zero", 5)):
        os.mknod(ws / name, 0o20666, os.makedev(1, minor))
        os.chmod(ws / name, 0o666)                 # past the umask: rootless may open it too
    if userns:
        os.chown(ws, NOBODY, NOBODY)
        state = tmp_path / "state"
        state.mkdir()
        os.chown(state, NOBODY, NOBODY)
        try:
            out = run_as_nobody(ws, DEVICE_PROBE, "block", state)
        finally:
            shutil.rmtree(tmp_path, ignore_errors=True)
        text, notes = out["stdout"], out["notes"]
    else:
        outcome = run(DEVICE_PROBE, cwd=str(ws), workspace=str(ws), approver="block",
                      state_dir=str(tmp_path / "state"))
        text, notes = outcome.stdout.text().decode(), list(outcome.notes)
        assert any(u.startswith(DEVICE_OPENS) for u in outcome.report.uncertain), \
            outcome.report.uncertain
    got = dict(l.split("=") for l in text.split())
    assert got == {f"{op}-{n}": "FAIL" for op in ("write", "read") for n in ("null", "zero")}, text
    assert NOTES[DEVICE_OPENS] in notes
    if not userns:
        for name, minor in (("null", 3), ("zero", 5)):
            st = os.lstat(ws / name)
            assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, minor)


# The host's objects a run sees: the device nodes bound into its /dev, and the
# entries of /proc that are one object for every proc mount of the host.
HOST_OBJECTS = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                "/dev/tty", "/proc/cpuinfo", "/proc/self/net/dev", "/proc/scsi",
                "/proc/latency_stats", "/proc/timer_list", "/proc/asound"]
# Each op sets a value the object already has: were it to reach the host, it
# changes nothing there but the ctime of a device node.
METADATA_PROBE = """
import errno, os, sys
for p in sys.argv[1:]:
    if not os.path.exists(p):
        continue
    st = os.stat(p)
    for op, call in (("chmod", lambda: os.chmod(p, st.st_mode & 0o7777)),
                     ("chown", lambda: os.chown(p, st.st_uid, st.st_gid)),
                     ("utime", lambda: os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns)))):
        try:
            call(); print(f"{op}:{p}=OK")
        except OSError as e:
            print(f"{op}:{p}={errno.errorcode[e.errno]}")
"""


@pytest.mark.parametrize("userns", [False, True], ids=["root", "rootless"])
def test_host_device_nodes_and_proc_entries_keep_their_metadata(tmp_path, userns):
    """A root run chmod'ed, chown'ed and touched the host's /dev/null (its
    /dev held read-write binds of the host's nodes) and /proc entries such as
    /proc/self/net/dev and /proc/cpuinfo, and the change stayed after the
    block. The binds and the whole /proc are read-only now: every such call
    fails with EROFS, and the nodes' ctimes on the host do not move."""
    targets = [p for p in HOST_OBJECTS if os.path.exists(p)]
    devices = {p: os.stat(p) for p in targets if p.startswith("/dev/")}
    command = shlex.join([sys.executable if not userns else "python3", "-c", METADATA_PROBE,
                          *targets])
    if userns:
        with nobody_project("caper-metadata-") as (ws, state):
            text = run_as_nobody(ws, command, "block", state)["stdout"]
    else:
        events, result = sandbox(command, tmp_path)
        text = stdout(result)
    got = dict(l.split("=") for l in text.split())
    assert len(got) == 3 * len(targets), text
    assert set(got.values()) == {"EROFS"}, text
    for p, before in devices.items():
        after = os.stat(p)
        assert (after.st_mode, after.st_uid, after.st_gid, after.st_ctime_ns) == \
            (before.st_mode, before.st_uid, before.st_gid, before.st_ctime_ns), p


AIO_PROBE = """
import ctypes, errno
ctx = ctypes.c_ulong(0)
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(206, 65536, ctypes.byref(ctx))          # io_setup(nr_events, &ctx)
print("io_setup", "OK" if r == 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_native_aio_reserves_nothing_from_the_hosts_pool(tmp_path):
    """Round 7: io_setup reserves events from one host-wide pool (fs.aio-nr up
    to fs.aio-max-nr, 65536 by default): a run could take all of it from the
    host's databases while it ran. It answers ENOSYS, as a kernel without AIO
    does, and libaio's users fall back to threads."""
    events, result = sandbox([PY, "-c", AIO_PROBE], tmp_path)
    assert stdout(result).split() == ["io_setup", "ENOSYS"], stdout(result) + stderr(result)


# A thread's sends are the tracer's to make (its descriptor table is shared):
# a bridge asked for over netlink from a thread, a route dump beside it, and
# the control: the same request from the main thread (the kernel's, with the
# command's own dropped capabilities).
NETLINK_PROBE = r"""
import errno, socket, struct, threading
def rta(kind, data):
    n = 4 + len(data)
    return struct.pack("HH", n, kind) + data + b"\0" * ((4 - n % 4) % 4)
def request(kind, flags, body):
    return struct.pack("IHHII", 16 + len(body), kind, flags, 1, 0) + body
def ask(name, msg):
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        s.sendto(msg, (0, 0))
        reply = s.recv(65536)
        kind = struct.unpack_from("H", reply, 4)[0]
        code = -struct.unpack_from("i", reply, 16)[0] if kind == 2 else 0
        print(name, errno.errorcode.get(code, "OK"))
    except OSError as e:
        print(name, errno.errorcode[e.errno])
ifinfo = struct.pack("BxHiII", 0, 0, 0, 0, 0)
bridge = request(16, 1 | 4 | 0x400 | 0x200, ifinfo + rta(3, b"capertest0\0") +
                 rta(18, rta(1, b"bridge")))
dump = request(22, 1 | 0x300, struct.pack("BBBBI", 0, 0, 0, 0, 0))     # RTM_GETADDR
ask("main-newlink", bridge)
for name, msg in (("thread-newlink", bridge), ("thread-getaddr", dump)):
    t = threading.Thread(target=ask, args=(name, msg)); t.start(); t.join()
"""


@pytest.mark.parametrize("userns", [PLAIN, True], ids=["plain", "userns"])
def test_a_threads_netlink_request_gets_none_of_the_tracers_capabilities(tmp_path, userns):
    """Round 8: the tracer sends for a task that shares its descriptor table
    (any thread), and for netlink the kernel judges the sending task: a
    thread's RTM_NEWLINK had the tracer's CAP_NET_ADMIN (as root, with
    IFLA_NET_NS_PID 1, in the host's network namespace). Only route dumps
    are sent for a thread now; the main thread's request was always the
    kernel's, with the command's dropped capabilities."""
    events, result = sandbox([PY, "-c", NETLINK_PROBE], tmp_path, userns=userns)
    got = dict(l.split() for l in stdout(result).splitlines())
    assert got == {"main-newlink": "EPERM", "thread-newlink": "EPERM", "thread-getaddr": "OK"}, \
        stdout(result) + stderr(result)


# A datagram whose SCM_CREDENTIALS names another uid: the kernel lets only a
# sender with CAP_SETUID do that, and the tracer, which sends it, has it.
CREDS_PROBE = r"""
import os, socket, struct
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
forged = struct.pack("iII", os.getpid(), 4242, 4242)
try:
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, forged)])
    msg, anc, flags, addr = b.recvmsg(16, socket.CMSG_SPACE(12))
    pid, uid, gid = struct.unpack("iII", anc[0][2][:12])
    print("uid", uid)
except OSError as e:
    print("send", e.errno)
"""


def test_a_forged_scm_credentials_never_reaches_the_receiver(tmp_path):
    """Round 8: the tracer sends every unix datagram for the command and
    copied its control messages as they were: as root it could name any
    host pid (a receiver with SO_PASSPIDFD then held a pidfd of a host
    process) or uid. SCM_CREDENTIALS is dropped: the receiver gets the
    tracer's own, as for every send the tracer makes."""
    if os.geteuid() != 0:
        pytest.skip("forging another uid needs the tracer to be root")
    events, result = sandbox([PY, "-c", CREDS_PROBE], tmp_path)
    out = stdout(result).split()
    assert out[0] == "uid" and out[1] != "4242", stdout(result) + stderr(result)


PIDFD_PROBE = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(434, os.getpid(), 0)                      # pidfd_open(self)
for name, nr, args in (("pidfd_getfd", 438, (fd, 0, 0)), ("process_madvise", 440, (fd, 0, 0, 0, 0)),
                       ("process_mrelease", 448, (fd, 0))):
    r = libc.syscall(nr, *args)
    print(name, "OK" if r >= 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_calls_that_reach_through_a_pidfd_are_refused(tmp_path):
    """A pidfd names a process whatever its pid namespace: pidfd_getfd took
    the descriptors of a host process whose pidfd a blocked run held (round
    8). It, process_madvise and process_mrelease are refused and reported."""
    events, result = sandbox([PY, "-c", PIDFD_PROBE], tmp_path)
    got = dict(l.split() for l in stdout(result).splitlines())
    assert got == {"pidfd_getfd": "EPERM", "process_madvise": "EPERM",
                   "process_mrelease": "EPERM"}, stdout(result) + stderr(result)
    refused = {e.syscall for e in of_kind(events, Kind.REFUSED)}
    assert {"pidfd_getfd", "process_madvise", "process_mrelease"} <= refused, refused


def test_every_planned_mount_is_nodev_and_nosuid(tmp_path):
    """The plan's side of the test above: each overlay, bind and tmpfs of a
    snapshot (root and rootless plans) carries MS_NODEV | MS_NOSUID, a bind
    by the remount that follows it. Only caper's /dev (the native core's)
    holds devices."""
    from caper.view.overlay import MS_BIND, MS_NODEV, MS_NOSUID, MS_REMOUNT, OverlaySnapshot
    for userxattr in (False, True):
        snap = OverlaySnapshot.create(str(tmp_path / f"state{userxattr}"), userxattr=userxattr)
        try:
            final: dict[str, int] = {}
            for m in snap.mounts:
                if m.flags & MS_BIND and not m.flags & MS_REMOUNT:
                    final.setdefault(m.target, 0)      # flags come with the remount
                else:
                    final[m.target] = m.flags
            bare = [t for t, f in final.items() if f & (MS_NODEV | MS_NOSUID) != MS_NODEV | MS_NOSUID]
            assert not bare, bare
        finally:
            snap.discard()


def test_the_report_never_opens_a_host_fifo_at_a_path_the_run_rewrote(tmp_path):
    """The report read the host's version of every changed path (for the
    diff) with a plain non-blocking open: where the host holds a FIFO, that
    open released a host writer waiting on it (and for a device node, ran
    its driver). The host version is now looked at by O_PATH first and
    opened only if it is a regular file."""
    from caper.transaction import run
    ws = tmp_path / "ws"
    ws.mkdir()
    fifo = ws / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"echo released > {fifo}"])
    try:
        # Wait (bounded) until the writer sits in its open of the FIFO.
        for _ in range(500):
            try:
                call = Path(f"/proc/{writer.pid}/syscall").read_text().split()[0]
            except (OSError, IndexError):
                call = ""
            if call in ("2", "257") and Path(f"/proc/{writer.pid}/wchan").read_text() != "0":
                break
            time.sleep(0.01)
        else:
            pytest.fail("the host writer never blocked in its open of the FIFO")
        out = run("rm pipe; echo data > pipe", cwd=str(ws), workspace=str(ws), approver="block",
                  state_dir=str(tmp_path / "state"))
        assert not out.committed
        assert [c for c in out.report.changes if c.path.endswith("pipe")], out.report.changes
        assert writer.poll() is None, "caper opened the host FIFO: its writer was released"
    finally:
        # Release the writer ourselves (a reader), then reap it.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.wait(timeout=10)
        os.close(fd)


CRASH_PROBE = """
ulimit -c unlimited 2>/dev/null && echo raised=yes || echo raised=no
grep '^Max core file size' /proc/self/limits | tr -s ' ' | cut -d' ' -f5,6 | tr ' ' / | sed 's/^/limit=/'
sh -c 'kill -SEGV $$'
sh -c 'kill -ABRT $$'
ls core* 2>/dev/null | sed 's/^/dump=/'
echo done=1
"""


@pytest.mark.parametrize("userns", [False, True], ids=["root", "rootless"])
def test_a_crash_writes_no_core_dump_and_is_reported(tmp_path, userns):
    """A crash in the sandbox started the host's core handler (core_pattern
    "|systemd-coredump ..." or apport runs on the host, as root, with the
    process's memory) or left a dump: the command now starts with
    RLIMIT_CORE = 1 soft and hard, for which the kernel writes no dump and
    runs no pipe, and cannot raise it; each crash is flagged in the report."""
    from caper.report.build import CRASHES, NOTES
    from caper.transaction import run
    if userns:
        need_rootless_venv()
        base = Path(tempfile.mkdtemp(prefix="caper-core-"))
        try:
            os.chmod(base, 0o755)
            for d in ("ws", "state"):
                (base / d).mkdir()
                os.chown(base / d, NOBODY, NOBODY)
            out = run_as_nobody(base / "ws", CRASH_PROBE, "block", base / "state")
        finally:
            shutil.rmtree(base, ignore_errors=True)
        text, notes = out["stdout"], out["notes"]
    else:
        outcome = run(CRASH_PROBE, cwd=str(tmp_path), workspace=str(tmp_path), approver="block",
                      state_dir=str(tmp_path / "state"))
        text, notes = outcome.stdout.text().decode(), list(outcome.notes)
        assert f"{CRASHES}: 2" in outcome.report.uncertain, outcome.report.uncertain
    got = dict(l.split("=", 1) for l in text.split())
    assert got == {"raised": "no", "limit": "1/1", "done": "1"}, text
    assert NOTES[CRASHES] in notes


# ---- host-global kernel resources ----------------------------------------------

WRITABLE_PROBE = r"""
import os
for top in ("/proc", "/sys"):
    for root, dirs, files in os.walk(top):
        if root == "/proc":   # the sandbox's own processes are theirs to write
            dirs[:] = [d for d in dirs if not d.isdigit() and d not in ("self", "thread-self")]
        for name in files:
            p = os.path.join(root, name)
            try:
                if os.path.islink(p) or not os.lstat(p).st_mode & 0o222:
                    continue
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))   # opened only, never written
                print(p)
            except OSError:
                pass
"""


@pytest.mark.parametrize("userns", [False, True], ids=["plain", "userns"])
def test_no_host_wide_knob_below_proc_or_sys_is_writable(tmp_path, userns):
    """The class behind /proc/pressure (PSI triggers: kernel pollers that
    count against the whole host): every file below /proc and /sys that has
    a write bit, outside the sandbox's own process directories, opens for
    writing as nothing but an error. Walked, not listed, so that a knob a
    newer kernel adds shows up here."""
    events, result = sandbox([PY, "-c", WRITABLE_PROBE], tmp_path, timeout=120, userns=userns)
    assert result.exit_code == 0, stderr(result)
    assert stdout(result).split() == [], stdout(result)


@pytest.mark.parametrize("userns", [False, True], ids=["plain", "userns"])
def test_the_sandbox_takes_a_bounded_number_of_ptys(tmp_path, userns):
    """kernel.pty.max is one count for every devpts instance: an unbounded
    sandbox could take all the host's shareable ptys (3072) for its whole
    timeout. Its devpts has max=48."""
    code = """
import errno, os
fds = []
try:
    for _ in range(100):
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    print("got", len(fds), "OK")
except OSError as e:
    print("got", len(fds), errno.errorcode[e.errno])
"""
    events, result = sandbox([PY, "-c", code], tmp_path, userns=userns)
    assert stdout(result).split() == ["got", "48", "ENOSPC"], stdout(result) + stderr(result)


def test_programs_run_shows_the_argv_the_kernel_executed(tmp_path, cfixture):
    """execve's argv was read at the seccomp stop, but the kernel copies it
    later (after resolving the program's path, which a chain of long
    symlinks makes slow): another thread could rewrite it in between (the
    fixture does once the tracer's read has faulted the script's page in),
    and "programs run" showed a harmless script while the shell ran another.
    The argv is now read again at the exec event, from the new image before
    it runs; a change is flagged."""
    from caper.report.build import ARGV_CHANGED
    from caper.transaction import run
    exe = cfixture("exec_argv_swap", "-O2", "-pthread")
    swaps = 0
    for i in range(6):                           # bounded; here the swap wins every time
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        shutil.copy(exe, ws / "build")
        out = run("./build", cwd=str(ws), workspace=str(ws), approver="block",
                  state_dir=str(tmp_path / "state"))
        ran = out.stdout.text().decode().strip()
        assert ran in ("ran=as-checked", "ran=swapped"), ran + out.stderr.text().decode()
        [shown] = [e.argv[-1] for e in out.report.processes.execs if e.argv[:2] == ["sh", "-c"]]
        assert shown.split()[1] == ran, (shown, ran)
        flagged = ARGV_CHANGED in out.report.uncertain
        assert not flagged or ran == "ran=swapped", out.report.uncertain
        swaps += flagged
        if swaps == 2:
            break
    assert swaps, "no swap after the check won in 6 tries: the test did not exercise the race"


def test_an_overlong_unix_address_does_not_overrun_the_tracer(tmp_path, cfixture):
    """connect/bind/sendto with a 128-byte AF_UNIX address (the kernel refuses
    it as too long; the tracer copied 126 bytes into a 109-byte buffer at the
    end of its allocation, and caper aborted in free()): the run ends
    normally and the calls fail as natively."""
    events, result = sandbox([cfixture("sockaddr_overlong"), "50"], tmp_path)
    assert result.exit_code == 0, (stdout(result), stderr(result))
    assert of_kind(events, Kind.CONNECT)


def test_the_program_an_exec_ran_is_the_one_the_report_names(tmp_path, cfixture):
    """execve(name) where a second thread rewrites name from /usr/bin/true to
    another program the moment the tracer's read faults its page in: the
    report names what the kernel ran (the new image), and says the exec
    changed after the check. Before, the file the other program wrote was
    "by /usr/bin/true"."""
    race, real = cfixture("race_exec_path", "-pthread"), cfixture("write_evidence")
    events, result = sandbox([race, "/usr/bin/true", real, "./evil-was-here", "300"], tmp_path)
    assert (tmp_path / "evil-was-here").exists(), "the race was not won: nothing to check"
    execs = [e for e in of_kind(events, Kind.EXEC) if e.ok]
    assert not any(e.path == "/usr/bin/true" and e.info & Info.ARGV_CHANGED for e in execs)
    changed = [e for e in execs if e.info & Info.ARGV_CHANGED]
    assert changed and all(e.path == real for e in changed), [(e.path, e.info) for e in execs]


# Each lock call a command may make on the file argv[1]: "TAG.name=RESULT" lines.
LOCKS = ("import errno, fcntl, os, struct, sys\n"
         "def tryit(name, call):\n"
         "    try:\n"
         "        call(); print(f'{sys.argv[2]}.{name}=OK')\n"
         "    except OSError as e:\n"
         "        print(f'{sys.argv[2]}.{name}={errno.errorcode[e.errno]}')\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
         "rd = struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0)\n"
         "tryit('flock', lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))\n"
         "tryit('setlk', lambda: fcntl.fcntl(fd, fcntl.F_SETLK, rd))\n"
         "tryit('ofd_setlk', lambda: fcntl.fcntl(fd, 37, rd))\n"
         "tryit('getlk', lambda: fcntl.fcntl(fd, fcntl.F_GETLK, rd))\n"
         "if sys.argv[2] == 'host':\n"
         "    tryit('lease', lambda: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK))\n"
         "tryit('unlock', lambda: fcntl.flock(fd, fcntl.LOCK_UN))\n")


@pytest.fixture
def read_only_mount():
    """A read-only tmpfs of the host's holding a file `lock` and a FIFO `fifo`
    (root only); the sandbox sees it through a read-only bind: the host's
    inodes."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only filesystem needs root")
    point = Path(tempfile.mkdtemp(prefix="caper-rolock-"))
    point.chmod(0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(point)],
                   check=True)
    try:
        (point / "lock").write_text("x\n")
        (point / "lock").chmod(0o644)
        os.mkfifo(point / "fifo", 0o666)
        subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()


def _locks(ws: Path, state: Path, target: str, rootless: bool) -> tuple[dict, list]:
    """The lock calls on target and on a file of the workspace (the
    overlay's), in one real run: their results and the refused calls."""
    import json
    (ws / "locks.py").write_text(LOCKS)
    command = f"python3 locks.py {target} host; python3 locks.py locks.py own"
    if rootless:
        out = run_as_nobody(ws, command, "policy", state)
        text, refused = out["stdout"], json.loads(out["report"])["processes"]["refused"]
        reason = out["reason"]
    else:
        from caper.transaction import run
        o = run(command, cwd=str(ws), workspace=str(ws), approver="policy",
                state_dir=str(state), env={**os.environ, "HOME": str(state)})
        text = o.stdout.text().decode()
        refused = [r.model_dump() for r in o.report.processes.refused]
        reason = o.reason
    assert "flock (host_lock), which caper refused" in reason, reason
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line), refused


@pytest.mark.parametrize("rootless", [False, True])
def test_a_lock_on_a_host_inode_is_refused_and_reported(read_only_mount, tmp_path, rootless):
    """Locks belong to the inode: through a read-only bind of a host mount a
    sandboxed flock/fcntl lock was the host's (until round 3: EAGAIN against
    the lock the host holds here; held by the command, it would stop host
    processes and other runs that lock the file). Now ENOLCK, reported as
    refused (host_lock), and the run unsure; so is a lease, and so on a device
    node bound from the host's /dev. A file of the overlay, the sandbox's own inode, locks as
    before; F_GETLK and unlocking pass."""
    import fcntl
    lock = read_only_mount / "lock"
    holder = os.open(lock, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)       # the host's own lock
    base = Path(tempfile.mkdtemp(prefix="caper-rolock-ws-"))
    try:
        if rootless:
            need_rootless_venv()
        base.chmod(0o755)
        for target in (str(lock), "/dev/null"):
            ws, state = base / f"ws{len(target)}", base / f"state{len(target)}"
            for p in (ws, state):
                p.mkdir()
                os.chown(p, NOBODY, NOBODY) if rootless else None
            got, refused = _locks(ws, state, target, rootless)
            assert got == {"host.flock": "ENOLCK", "host.setlk": "ENOLCK",
                           "host.ofd_setlk": "ENOLCK", "host.getlk": "OK", "host.lease": "ENOLCK",
                           "host.unlock": "OK",
                           "own.flock": "OK", "own.setlk": "OK", "own.ofd_setlk": "OK",
                           "own.getlk": "OK", "own.unlock": "OK"}, (target, got)
            assert {(r["syscall"], r["reason"]) for r in refused} == {
                ("flock", "host_lock"), ("fcntl", "host_lock")}, refused
    finally:
        os.close(holder)
        shutil.rmtree(base, ignore_errors=True)


FIFO_PROBE = r"""
import errno, os, sys
d = os.open(os.path.dirname(sys.argv[1]), os.O_RDONLY | os.O_DIRECTORY)
via = "/proc/self/fd/%d/%s" % (d, os.path.basename(sys.argv[1]))   # a magic link (adv13a 02)
for name, path, flags in (("write", sys.argv[1], os.O_WRONLY | os.O_NONBLOCK),
                          ("read", sys.argv[1], os.O_RDONLY | os.O_NONBLOCK),
                          ("via", via, os.O_RDONLY | os.O_NONBLOCK),
                          ("dotted", via.replace("/proc/", "/proc/./"), os.O_RDONLY | os.O_NONBLOCK)):
    try:
        fd = os.open(path, flags)
        print(name, "opened", os.write(fd, b"FROM-THE-SANDBOX") if name == "write" else os.read(fd, 64))
    except OSError as e:
        print(name, errno.errorcode[e.errno])
os.mkfifo("own")
fd = os.open("own", os.O_RDWR)
os.write(fd, b"x")
print("own", os.read(fd, 1).decode())
os.close(fd)
os.unlink("own")
"""


@pytest.mark.parametrize("rootless", [False, True])
def test_a_fifo_on_a_host_mount_is_not_opened(read_only_mount, rootless):
    """adv12a 01: a FIFO seen through a read-only bind of a host mount is the
    host's pipe: a blocked run wrote into a host reader's FIFO and read what a
    host writer sent. Its open is refused (EACCES, reported as host_fifo),
    and the host reader gets nothing; a FIFO the run makes in the workspace
    (the overlay's own) works."""
    import json
    fifo = read_only_mount / "fifo"
    reader = subprocess.Popen(["timeout", "60", "cat", str(fifo)], stdout=subprocess.PIPE)
    base = Path(tempfile.mkdtemp(prefix="caper-rofifo-ws-"))
    try:
        base.chmod(0o755)
        ws, state = base / "ws", base / "state"
        for p in (ws, state):
            p.mkdir()
            if rootless:
                os.chown(p, NOBODY, NOBODY)
        (ws / "probe.py").write_text(FIFO_PROBE)
        command = f"python3 probe.py {fifo}"
        if rootless:
            need_rootless_venv()
            out = run_as_nobody(ws, command, "block", state)
            text = out["stdout"]
            refused = json.loads(out["report"])["processes"]["refused"]
        else:
            from caper.transaction import run
            o = run(command, cwd=str(ws), workspace=str(ws), approver="block",
                    state_dir=str(state), env={**os.environ, "HOME": str(state)})
            text = o.stdout.text().decode()
            refused = [r.model_dump() for r in o.report.processes.refused]
        assert text.splitlines() == ["write EACCES", "read EACCES", "via EACCES", "dotted EACCES",
                                     "own x"], text
        assert {(r["syscall"], r["reason"]) for r in refused} == {("openat", "host_fifo")}, refused
    finally:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))     # the reader's EOF
        got = reader.communicate(timeout=30)[0]
        shutil.rmtree(base, ignore_errors=True)
    assert got == b""


MOUNT_RENAMES = r"""
import errno, os
os.mkdir("empty")
for name, src, dst in (("onto-proc", "empty", "/proc"), ("proc-away", "/proc", "gone"),
                       ("onto-dev", "empty", "/dev")):
    try:
        os.rename(src, dst)
        print(name, "renamed")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
print("proc", "self" in os.listdir("/proc"))
"""


@pytest.mark.parametrize("rootless", [False, True])
def test_a_rename_at_or_onto_a_mount_of_the_sandbox_is_busy(tmp_path, rootless):
    """adv13a 01: the tracer makes every rename, in its own mount namespace,
    where the kernel's EBUSY for mount points does not look at the
    sandbox's: rename(emptydir, "/proc") detached the sandbox's /proc. EBUSY,
    as natively."""
    import json
    base = Path(tempfile.mkdtemp(prefix="caper-mntren-"))
    try:
        base.chmod(0o755)
        ws, state = base / "ws", base / "state"
        for p in (ws, state):
            p.mkdir()
            if rootless:
                os.chown(p, NOBODY, NOBODY)
        (ws / "probe.py").write_text(MOUNT_RENAMES)
        if rootless:
            need_rootless_venv()
            text = run_as_nobody(ws, "python3 probe.py", "block", state)["stdout"]
        else:
            from caper.transaction import run
            text = run("python3 probe.py", cwd=str(ws), workspace=str(ws), approver="block",
                       state_dir=str(state), env={**os.environ, "HOME": str(state)}
                       ).stdout.text().decode()
        assert text.splitlines() == ["onto-proc EBUSY", "proc-away EBUSY", "onto-dev EBUSY",
                                     "proc True"], text
    finally:
        shutil.rmtree(base, ignore_errors=True)


# A loopback TCP pair whose thread sends with MSG_ZEROCOPY: the tracer's send
# would have let the kernel transmit from its own freed, reused buffer.
ZEROCOPY_PROBE = r"""
import errno, socket, threading
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
c = socket.create_connection(srv.getsockname()); peer, _ = srv.accept()
c.setsockopt(socket.SOL_SOCKET, 60, 1)                      # SO_ZEROCOPY
data = bytes(range(256)) * 256
sent = []
def send(name, flags):
    try:
        n = c.sendmsg([data], [], flags)
        sent.append(data[:n])
        print(name, n == len(data))
    except OSError as e:
        print(name, errno.errorcode[e.errno])
send("main-zerocopy", 0x4000000)                            # MSG_ZEROCOPY: the kernel's own
for name, flags in (("thread-zerocopy", 0x4000000), ("thread-plain", 0)):
    t = threading.Thread(target=send, args=(name, flags)); t.start(); t.join()
want, got = b"".join(sent), b""
while len(got) < len(want):
    got += peer.recv(1 << 20)
print("intact", got == want)
"""


@pytest.mark.parametrize("userns", [PLAIN, True], ids=["plain", "userns"])
def test_a_threads_zerocopy_send_is_answered_enobufs_not_sent_from_caper_memory(tmp_path, userns):
    """adv10a 03: the tracer passed the thread's MSG_ZEROCOPY to its own
    sendmsg, and the kernel sent pages of the tracer's heap buffer after it
    was freed and reused: the command read ~60 KB of caper's memory. It is
    answered ENOBUFS (callers then copy); the plain send is intact."""
    events, result = sandbox([PY, "-c", ZEROCOPY_PROBE], tmp_path, userns=userns)
    got = dict(l.split() for l in stdout(result).splitlines())
    assert got == {"main-zerocopy": "True", "thread-zerocopy": "ENOBUFS", "thread-plain": "True",
                   "intact": "True"}, stdout(result) + stderr(result)
