"""Shared pytest fixtures.

`cfixture(name)` compiles tests/fixtures/<name>.c once per session (gcc, into a
session tmp dir) and returns the path of the executable. Tests skip when no C
compiler is installed.

Every test runs with CAPER_NO_GATE=1: a `caper run` subprocess runs in its
own process instead of starting a resident gate that would outlive the test.
tests/test_gate.py turns it off where the gate is what it tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.gate import start_gate, stop_gate
from helpers.policy import policy_project
from helpers.report import AWS_SECRET, SECRET
from helpers.rootless import SYSTEM_PY, as_nobody
from helpers.trees import git, git_project

ROOT = Path(__file__).resolve().parent.parent

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _no_gate(monkeypatch):
    monkeypatch.setenv("CAPER_NO_GATE", "1")


def _pinned_record_keys() -> set[int]:
    """The serials of the caper record keys this user's keyring shows."""
    try:
        with open("/proc/keys") as f:
            return {int(ln.split()[0], 16) for ln in f if " caper-record-key:" in ln}
    except OSError:
        return set()


# Lists uid 65534's pinned record keys, or drops those given (argv), as that
# user: root cannot see another user's keyring, whose quota (200 keys) every
# rootless test's state directory takes one of.
_NOBODY_KEYS = r"""
import ctypes, os, sys
serials = {int(ln.split()[0], 16) for ln in open("/proc/keys") if " caper-record-key:" in ln}
if len(sys.argv) == 1:
    print(" ".join(map(str, sorted(serials))))
else:
    call = ctypes.CDLL(None, use_errno=True).syscall
    for s in set(map(int, sys.argv[1:])) & serials:
        call(ctypes.c_long(250), ctypes.c_long(21), ctypes.c_long(s))   # keyctl INVALIDATE
"""


def _nobody_keys(*drop: int) -> set[int]:
    if os.geteuid() != 0 or os.uname().machine != "x86_64" or not shutil.which("setpriv"):
        return set()
    p = as_nobody(SYSTEM_PY, "-c", _NOBODY_KEYS, *map(str, drop), cwd="/", timeout=30)
    return {int(x) for x in p.stdout.split()} if p.returncode == 0 else set()


@pytest.fixture(scope="session", autouse=True)
def _unpin_record_keys():
    """Every test state directory pins a record key (caper.state.record_key):
    the session's are taken out of the keyring at its end, root's and uid
    65534's (the rootless tests'), not left to expire (a full quota makes
    later pins fall back to the file)."""
    before, nobody_before = _pinned_record_keys(), _nobody_keys()
    yield
    import ctypes
    from caper.state import _KEY_SYSCALLS
    nums = _KEY_SYSCALLS.get(os.uname().machine)
    if nums is None:
        return
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    for serial in _pinned_record_keys() - before:
        syscall(ctypes.c_long(nums[1]), ctypes.c_long(21), ctypes.c_long(serial))  # INVALIDATE
    made = _nobody_keys() - nobody_before
    if made:
        _nobody_keys(*made)


@pytest.fixture(scope="session")
def cfixture(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    outdir = tmp_path_factory.mktemp("cfixtures")
    built: dict[str, str] = {}

    def build(name: str, *cflags: str) -> str:
        if name not in built:
            src = FIXTURES / f"{name}.c"
            exe = outdir / name
            proc = subprocess.run([cc, "-O1", "-Wall", "-o", str(exe), str(src), *cflags],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.fail(f"cannot compile {src}:\n{proc.stderr}")
            built[name] = str(exe)
        return built[name]

    return build


# Fixtures that more than one test file uses.

@pytest.fixture(scope="session")
def policy_template(tmp_path_factory):
    return policy_project(tmp_path_factory.mktemp("policy"))


@pytest.fixture
def policy_env(policy_template, tmp_path):
    """A copy of the policy tests' project and home (helpers.policy)."""
    shutil.copytree(policy_template, tmp_path / "t", symlinks=True)
    return tmp_path / "t"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("CAPER_NO_GATE", raising=False)
    state = tmp_path / "state"
    e = {**os.environ, "PYTHONPATH": str(ROOT), "CAPER_STATE_DIR": str(state),
         "CAPER_GATE_IDLE": "30", "HOME": str(tmp_path)}
    e.pop("CAPER_NO_GATE", None)
    yield e
    stop_gate(state)


@pytest.fixture
def gate_ws(env, tmp_path):
    """A workspace, and the gate started from it (env's)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    start_gate(env, ws)
    return ws


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    (h / ".aws").mkdir(parents=True)
    (h / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = {AWS_SECRET}\n")
    (h / ".bashrc").write_text("export PS1='$ '\n")
    return h


@pytest.fixture
def repo(tmp_path):
    """A git project: tracked sources, an ignored build dir, a .env with a secret."""
    w = tmp_path / "proj"
    (w / "src").mkdir(parents=True)
    for i in range(3):
        (w / "src" / f"m{i}.c").write_text(f"int m{i}(void) {{ return {i}; }}\n")
    (w / "Makefile").write_text("all:\n\tcc -c src/*.c\n")
    (w / ".gitignore").write_text("build/\n.env\n")
    (w / ".env").write_text(f"API_TOKEN={SECRET}\nDEBUG=1\n")
    git(w, "init", "-q")
    git(w, "add", "src", "Makefile", ".gitignore")
    git(w, "commit", "-qm", "init")
    (w / "build").mkdir()
    for i in range(3):
        (w / "build" / f"m{i}.o").write_bytes(b"\x7fELF" + bytes(60))
    return w


@pytest.fixture
def project(tmp_path):
    return git_project(tmp_path / "proj", {
        "src/main.c": "int main(void) { return 0; }\n",
        "Makefile": "build/app: src/main.c\n\t@mkdir -p build\n\tcc -o build/app src/main.c\n"
                    "clean:\n\trm -rf build src .git\n",
        ".gitignore": "build/\n"})
