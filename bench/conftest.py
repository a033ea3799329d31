"""Fixtures for caper's overhead benchmark (bench/test_overhead.py).

Everything heavy is built once per session in a temporary directory:

- a git repository of 5,120 files with five commits (packed with `git gc`),
  a few modified and untracked files so `git status` has something to say;
- a C project of 30 small .c files, one header and a Makefile;
- the syscall set caper traps, as an strace `-e trace=` list.

The bench is kept out of the normal test run: the project's pytest config has
`testpaths = ["tests"]`, and nothing under tests/ imports this directory.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import pytest

from benchlib import (ROOT, caper_syscalls, make_c_project, make_env, make_git_repo,
                      strace_knows, which)


def _loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


_START = {}


def pytest_configure(config) -> None:
    """CAPER_BENCH_PIN=N pins the whole bench (pytest, tracers, commands) to CPU N."""
    pin = os.environ.get("CAPER_BENCH_PIN")
    if pin:
        os.sched_setaffinity(0, {int(c) for c in pin.split(",")})
    _START["loadavg"] = _loadavg()


def pytest_benchmark_update_machine_info(config, machine_info) -> None:
    machine_info.update({
        "kernel": platform.release(),
        "online_cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "cpuidle_driver": _read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "loadavg_start": _START.get("loadavg"),
        "loadavg_end": _loadavg(),
    })
    try:
        v = subprocess.run(["strace", "-V"], capture_output=True, text=True).stdout
        machine_info["strace"] = v.splitlines()[0] if v else None
    except OSError:
        pass


@pytest.fixture(scope="session")
def workdir():
    """A private temporary directory: pytest's own basetemp is pruned by any
    other pytest run started meanwhile (e.g. `pytest tests` next door)."""
    path = tempfile.mkdtemp(prefix="caper-bench-")
    yield path
    _stop_gates(path)
    shutil.rmtree(path, ignore_errors=True)


def _stop_gates(root: str) -> None:
    """A gate the bench started (caper-gate variants) must not outlive it."""
    import glob
    import signal
    for log in glob.glob(os.path.join(root, "**", "gate.log"), recursive=True):
        with open(log) as f:
            for line in f:
                if line.startswith("caper serve: pid"):
                    try:
                        os.kill(int(line.split()[3]), signal.SIGTERM)
                    except (ProcessLookupError, ValueError):
                        pass


def _require_native() -> None:
    try:
        import caper.sandbox._native  # noqa: F401
    except ImportError as e:  # pragma: no cover - environment problem
        pytest.exit(f"caper's native module is not built ({e}); run "
                    f"`cd {ROOT} && python3 caper_native/build.py` first", returncode=3)


# ---------------------------------------------------------------------------
# the syscall set caper traps, as strace knows it


@dataclass(frozen=True)
class SyscallSet:
    caper: tuple[str, ...]      # every name in caper's table
    strace: tuple[str, ...]     # the ones this strace knows
    unknown: tuple[str, ...]    # the ones it does not (skipped)

    @property
    def expr(self) -> str:
        return "trace=" + ",".join(self.strace)


@pytest.fixture(scope="session")
def syscall_set() -> SyscallSet:
    _require_native()
    strace = which("strace")
    names = caper_syscalls()
    known = [n for n in names if strace_knows(strace, n)]
    unknown = [n for n in names if n not in known]
    return SyscallSet(tuple(names), tuple(known), tuple(unknown))


# ---------------------------------------------------------------------------
# the environment every variant runs with


@pytest.fixture(scope="session")
def bench_env() -> dict[str, str]:
    """One environment for native, caper and strace runs alike."""
    return make_env()


@pytest.fixture(scope="session")
def noise_warm() -> None:
    """caper's noise baseline is probed once per process; do it before timing."""
    _require_native()
    from caper.sandbox.trace import baseline
    baseline()


# ---------------------------------------------------------------------------
# the workloads' trees


@pytest.fixture(scope="session")
def git_repo(workdir, bench_env) -> str:
    """5,120 tracked files, five commits, packed; 3 modified and 2 untracked files."""
    which("git")
    return make_git_repo(os.path.join(workdir, "repo"), bench_env)


@pytest.fixture(scope="session")
def c_project(workdir) -> str:
    """30 .c files, a header and a Makefile (build: make -j1; clean: make clean)."""
    which("make")
    which("cc")
    return make_c_project(os.path.join(workdir, "cbuild"))
