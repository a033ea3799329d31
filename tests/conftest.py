"""Shared pytest fixtures.

`cfixture(name)` compiles tests/fixtures/<name>.c once per session (gcc, into a
session tmp dir) and returns the path of the executable. Tests skip when no C
compiler is installed.

Every test runs with CAPER_NO_GATE=1: a `caper run` subprocess runs in its
own process instead of starting a resident gate that would outlive the test.
tests/test_gate.py turns it off where the gate is what it tests.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _no_gate(monkeypatch):
    monkeypatch.setenv("CAPER_NO_GATE", "1")


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


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                   check=True, capture_output=True)


def git_project(root: Path, files: dict[str, str], tracked: tuple[str, ...] = ("-A",)) -> Path:
    """A git repository at root holding files, with `tracked` committed."""
    root.mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git(root, "init", "-q")
    git(root, "add", *tracked)
    git(root, "commit", "-qm", "init")
    return root
