"""Load: 8 sessions × 200 commands on 8 workspaces at once, and 4 sessions on
one shared workspace; nothing lost, no cross-talk, nothing leaked.

    python3 -m pytest bench/test_load.py -s     # ~1-2 min; writes bench/results-load.json

Each session is its own process with a caper.Gate (an agent host embedding
caper), running commands that append a numbered line to a log (the allow
approver: every run commits). Afterwards: every log holds exactly its
session's lines, in order (no lost commit); every report named only that
command's own change and output (no cross-talk between sessions); no mount,
process, file descriptor (in the sessions' processes) or scratch directory is
left. Reported: throughput,
and the percentiles of each command's wall time and of caper's overhead over
the same command run natively.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import subprocess
import time

from benchlib import ROOT

SESSIONS = 8
COMMANDS = int(os.environ.get("CAPER_LOAD_COMMANDS", 200))
SHARED_SESSIONS = 4
SHARED_COMMANDS = COMMANDS // 4


def _session(args) -> dict:
    ws, state, name, n = args
    from caper import Gate
    from caper.config import Config
    from caper.view.overlay import settle     # a run's scratch goes on a thread after it answers
    gate = Gate(ws, approver="allow", session=name, config=Config(), state_dir=state)
    walls, bad, fds = [], [], None
    for i in range(n):
        line = f"{name}:{i}"
        t = time.perf_counter()
        out = gate.run(f"echo {line} >> log.txt; echo {line}")
        walls.append((time.perf_counter() - t) * 1000)
        paths = [c.path for c in out.report.changes]
        if not out.committed or out.stdout.text() != f"{line}\n".encode() or paths != ["log.txt"]:
            bad.append((i, out.decision, out.reason[:100], paths, out.stdout.text()[:50]))
        if i == 0:     # after the first command: what one-time set-up opened stays open
            settle()
            fds = sorted(os.listdir("/proc/self/fd"))
    settle()
    return {"name": name, "walls": walls, "bad": bad,
            "fds_leaked": len(os.listdir("/proc/self/fd")) - len(fds)}


def _native_ms(ws: str, n: int = 50) -> float:
    xs = []
    for i in range(n):
        t = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", f"echo native:{i} >> native.txt; echo native:{i}"],
                       cwd=ws, capture_output=True, check=True)
        xs.append((time.perf_counter() - t) * 1000)
    return statistics.median(xs)


def _mounts() -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for _ in f)


def _children() -> list[str]:
    """Child processes left, but multiprocessing's resource tracker (it stays)."""
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ")[1].split()[1] != me:
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "resource_tracker" not in cmd:
                out.append(cmd)
    return out


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def test_load(workdir):
    state = os.path.join(workdir, "load-state")
    jobs = []
    for s in range(SESSIONS):
        ws = os.path.join(workdir, f"load-ws{s}")
        os.makedirs(ws)
        jobs.append((ws, state, f"s{s}", COMMANDS))
    shared = os.path.join(workdir, "load-shared")
    os.makedirs(shared)
    jobs += [(shared, state, f"shared{k}", SHARED_COMMANDS) for k in range(SHARED_SESSIONS)]
    native = _native_ms(os.path.join(workdir, "load-ws0"))
    os.unlink(os.path.join(workdir, "load-ws0", "native.txt"))

    mounts = _mounts()
    t = time.perf_counter()
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        results = pool.map(_session, jobs)
    total_s = time.perf_counter() - t

    assert [r["bad"] for r in results if r["bad"]] == []   # every run committed, no cross-talk
    for ws, _, name, n in jobs[:SESSIONS]:                 # no lost commit, in order
        with open(os.path.join(ws, "log.txt")) as f:
            assert f.read().splitlines() == [f"{name}:{i}" for i in range(n)]
    with open(os.path.join(shared, "log.txt")) as f:
        lines = f.read().splitlines()
    assert len(lines) == SHARED_SESSIONS * SHARED_COMMANDS
    for k in range(SHARED_SESSIONS):                       # serialized, each in order
        assert [x for x in lines if x.startswith(f"shared{k}:")] == \
            [f"shared{k}:{i}" for i in range(SHARED_COMMANDS)]
    assert _mounts() == mounts and _children() == []
    assert [r["fds_leaked"] for r in results] == [0] * len(results)
    assert [n for n in os.listdir(os.path.join(state, "runs"))] == []

    walls = [w for r in results for w in r["walls"]]
    summary = {
        "sessions": SESSIONS, "commands_each": COMMANDS, "shared_sessions": SHARED_SESSIONS,
        "shared_commands_each": SHARED_COMMANDS, "commands": len(walls),
        "seconds": round(total_s, 2), "commands_per_s": round(len(walls) / total_s, 1),
        "native_ms": round(native, 2),
        "wall_ms": {p: round(_pct(walls, p), 1) for p in (50, 95, 99)},
        "overhead_ms": {p: round(_pct(walls, p) - native, 1) for p in (50, 95, 99)},
        "cpus": os.cpu_count(),
    }
    with open(os.path.join(ROOT, "bench", "results-load.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("\n" + json.dumps(summary, indent=1))
