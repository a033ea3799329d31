"""caper's overhead next to plain execution and strace, one group per workload.

    cd /work/main && python3 -m pytest bench --benchmark-json=bench/results.json
    python3 bench/report.py --json bench/results.json     # Markdown table

Variants of every workload (same argv, cwd and environment):

    native          subprocess.run, output captured through pipes
    caper           caper.sandbox.trace.trace(argv).run() in this process (the API that matters)
    caper-cli       python3 -m caper trace --quiet -- argv (adds interpreter start-up)
    strace-f        strace -f -o /dev/null -- argv
    strace-seccomp  strace -f --seccomp-bpf -o /dev/null -e trace=<caper's syscalls> -- argv

Rounds are fixed per workload (pedantic mode, one warm-up round each) so the
whole run takes a few minutes on two cores; CAPER_BENCH_SCALE=0.3 (or 3)
scales them all.
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import pytest

from benchlib import ROOT, c_build_outputs, cpu_delta, cpu_snapshot, which

SCALE = float(os.environ.get("CAPER_BENCH_SCALE", "1"))
PYTHON = os.path.realpath(sys.executable)   # the real binary, not the pyenv shim

VARIANTS = ("native", "caper", "caper-cli", "strace-f", "strace-seccomp")


@dataclass
class Workload:
    argv: list[str]
    cwd: str
    rounds: int
    setup: Callable[[], None] | None = None


def _rounds(n: int) -> int:
    return max(3, round(n * SCALE))


def _make_workload(c_project: str) -> Workload:
    make = which("make")
    state = {"ran": False}

    def setup() -> None:
        # The previous round must have done the whole build; then start clean.
        if state["ran"]:
            missing = [p for p in c_build_outputs(c_project) if not os.path.exists(p)]
            assert not missing, f"the last round did not build {missing[:3]}..."
        subprocess.run([make, "-s", "clean"], cwd=c_project, check=True,
                       stdout=subprocess.DEVNULL)
        state["ran"] = True

    return Workload([make, "-j1"], c_project, _rounds(6), setup)


# slug (test id and benchmark group) -> how to build it; LABELS are for the report
WORKLOADS = {
    "true": lambda fx: Workload([which("true")], fx("git_repo"), _rounds(60)),
    "git-status": lambda fx: Workload([which("git"), "status"], fx("git_repo"), _rounds(20)),
    "git-log-stat": lambda fx: Workload([which("git"), "log", "--stat"], fx("git_repo"),
                                        _rounds(20)),
    "make": lambda fx: _make_workload(fx("c_project")),
    "python-import": lambda fx: Workload([PYTHON, "-c", "import email, json, http.client"],
                                         fx("git_repo"), _rounds(20)),
    "find-xargs-cat": lambda fx: Workload(
        ["/bin/sh", "-c", "find . -type f | xargs cat > /dev/null"], fx("git_repo"),
        _rounds(12)),
}
LABELS = {
    "true": "true",
    "git-status": "git status (5,120 files)",
    "git-log-stat": "git log --stat (5 commits)",
    "make": "make -j1 (30 .c files)",
    "python-import": "python3 -c 'import email, json, http.client'",
    "find-xargs-cat": "find . -type f | xargs cat",
}

CASES = [pytest.param(w, v, id=f"{w}-{v}", marks=pytest.mark.benchmark(group=w))
         for w in WORKLOADS for v in VARIANTS]


def _check(rc: int, what: str, stderr: bytes = b"") -> None:
    assert rc == 0, f"{what} exited {rc}: {stderr[-500:]!r}"


def _runner(variant: str, w: Workload, env: dict, syscall_set, stash: dict) -> Callable[[], None]:
    pipes = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def spawn(argv: list[str], run_env: dict = env) -> Callable[[], None]:
        def run() -> None:
            r = subprocess.run(argv, cwd=w.cwd, env=run_env, **pipes)
            _check(r.returncode, variant, r.stderr)
        return run

    if variant == "native":
        return spawn(w.argv)
    if variant == "caper":
        from caper.sandbox.events import End
        from caper.sandbox.trace import trace

        def run() -> None:
            events, result = trace(w.argv, cwd=w.cwd, env=env).run()
            assert result.end == End.EXITED, result.status
            _check(result.exit_code, variant, result.stderr.text())
            stash["events"], stash["result"] = events, result
            stash.setdefault("stops", []).append(result.stats.stops)
        return run
    if variant == "caper-cli":
        cli_env = dict(env, PYTHONPATH=ROOT)
        return spawn([PYTHON, "-m", "caper", "trace", "--quiet", "--", *w.argv], cli_env)
    strace = which("strace")
    if variant == "strace-f":
        return spawn([strace, "-f", "-o", "/dev/null", "--", *w.argv])
    if variant == "strace-seccomp":
        return spawn([strace, "-f", "--seccomp-bpf", "-o", "/dev/null", "-e", syscall_set.expr,
                      "--", *w.argv])
    raise ValueError(variant)


@pytest.mark.parametrize("workload,variant", CASES)
def test_overhead(benchmark, request, workload, variant, bench_env, syscall_set, noise_warm):
    w = WORKLOADS[workload](request.getfixturevalue)
    stash: dict = {}
    fn = _runner(variant, w, bench_env, syscall_set, stash)
    benchmark.extra_info.update(workload=workload, label=LABELS[workload], variant=variant,
                                argv=w.argv, rounds=w.rounds)
    if variant == "strace-seccomp":
        benchmark.extra_info["strace_trace_set"] = list(syscall_set.strace)
        benchmark.extra_info["strace_unknown_skipped"] = list(syscall_set.unknown)
    before = cpu_snapshot()
    if w.setup is not None:
        benchmark.pedantic(fn, setup=w.setup, rounds=w.rounds, iterations=1, warmup_rounds=1)
    else:
        benchmark.pedantic(fn, rounds=w.rounds, iterations=1, warmup_rounds=1)
    # CPU that other processes used meanwhile: a disturbed measurement shows here
    benchmark.extra_info["cpu"] = cpu_delta(before, cpu_snapshot())
    if variant == "caper":
        s = stash["result"].stats
        kinds = collections.Counter(ev.kind.name for ev in stash["events"])
        benchmark.extra_info["caper_stats"] = {
            "stops": s.stops, "events": s.events, "noise": s.noise,
            "collapsed": s.collapsed, "peak_pids": s.peak_pids, "wall_ms": round(s.wall_ms, 2),
            "py_events": len(stash["events"]), "kinds": dict(kinds.most_common()),
            "stops_min": min(stash["stops"]), "stops_max": max(stash["stops"]),
        }
