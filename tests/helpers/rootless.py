"""Running caper as an unprivileged user (uid 65534) from the tests, as root:
setpriv, a source tree that user can read, the venv ./bootstrap makes for it."""
from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PY = "/usr/bin/python3"
NOBODY = 65534
ROOTLESS_VENV = "/opt/caper-rootless-venv/bin/python"


def as_nobody(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           *argv], capture_output=True, text=True, **kw)


@functools.cache
def source_root() -> Path:
    """The checkout, where uid 65534 can read it; else (a directory above it
    closed to others, as /root is, where a CI may clone) a copy of it, built
    module included, in a temporary directory that user can read."""
    if as_nobody("/usr/bin/test", "-r", str(ROOT / "caper" / "__init__.py")).returncode == 0:
        return ROOT
    copy = Path(tempfile.mkdtemp(prefix="caper-rootless-src-"))
    atexit.register(shutil.rmtree, copy, True)
    copy.chmod(0o755)
    shutil.copytree(ROOT, copy / "src", symlinks=True,
                    ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.img"))
    return copy / "src"


def why_not_rootless() -> str | None:
    if os.geteuid() != 0:
        return "needs root to switch to an unprivileged user"
    if not shutil.which("setpriv"):
        return "setpriv (util-linux) missing"
    probe = as_nobody(SYSTEM_PY, "-c", f"import sys, _cffi_backend; sys.path.insert(0, "
                      f"{str(source_root())!r}); import caper_native._caper")
    if probe.returncode != 0:
        return f"uid {NOBODY} cannot import caper with {SYSTEM_PY}: {probe.stderr.strip()[-200:]}"
    return None


def need_rootless_venv() -> None:
    reason = why_not_rootless()
    if reason or not os.access(ROOTLESS_VENV, os.X_OK):
        pytest.skip(reason or f"{ROOTLESS_VENV} missing (./bootstrap makes it)")


RUN_AS_NOBODY = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import caper
out = caper.run(sys.argv[3], cwd=sys.argv[2], workspace=sys.argv[2], approver=sys.argv[4],
                state_dir=sys.argv[5])
print(json.dumps({"committed": out.committed, "reason": out.reason, "exit": out.exit_code,
                  "stdout": out.stdout.text().decode(), "notes": list(out.notes),
                  "backend": out.report.backend, "report": out.report.to_json()}))
"""


@contextmanager
def nobody_project(prefix: str) -> Iterator[tuple[Path, Path]]:
    """(workspace, state dir) of uid 65534's, in a temporary directory it can
    reach (pytest's tmp_path is root's only), removed afterwards."""
    need_rootless_venv()
    base = tempfile.mkdtemp(prefix=prefix)
    try:
        os.chmod(base, 0o755)
        ws, state = Path(base, "ws"), Path(base, "state")
        for p in (ws, state):
            p.mkdir()
            os.chown(p, NOBODY, NOBODY)
        yield ws, state
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_as_nobody(ws, command: str, approver: str, state, home=None) -> dict:
    """caper.run(command) in workspace ws by uid 65534: its outcome's fields."""
    p = as_nobody(ROOTLESS_VENV, "-c", RUN_AS_NOBODY, str(source_root()), str(ws), command,
                  approver, str(state), timeout=120, cwd="/",
                  env={"PATH": "/usr/bin:/bin", "HOME": str(home or state)})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)
