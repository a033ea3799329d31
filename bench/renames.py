#!/usr/bin/env python3
"""What a rename or link costs under caper's tracer, which makes each one itself.

    python3 bench/renames.py [--rounds 5] [--calls 2000]    # ~1 min; prints JSON

Workloads, each native and under `caper.sandbox.trace.trace` (the tracer
alone: no overlay, no report), rounds interleaved so the machine's drift
hits both alike:

- `rename`: one Python process renames `a<i>` to `b<i>`, `--calls` times;
- `link`: one Python process links `a<i>` to `c<i>` and unlinks `c<i>`;
- `mv-loop`: `for i in $(seq 200); do mv a$i b$i; done` (an exec per call).

The per-call figure is (median traced - median native) / calls. To compare
two trees, run this file from each (it imports the checkout it lives in).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from caper.sandbox.trace import trace  # noqa: E402

PY = os.path.realpath(sys.executable)


def workloads(calls: int) -> dict[str, tuple[list[str], int]]:
    rename = f"import os\nfor i in range({calls}): os.rename(f'a{{i}}', f'b{{i}}')\n"
    link = (f"import os\nfor i in range({calls}):\n"
            f"    os.link(f'a{{i}}', f'c{{i}}'); os.unlink(f'c{{i}}')\n")
    return {"rename": ([PY, "-c", rename], calls),
            "link": ([PY, "-c", link], 2 * calls),   # a link and an unlink each
            "mv-loop": (["/bin/sh", "-c", "for i in $(seq 200); do mv a$i b$i; done"], 200)}


def fresh(d: str, calls: int) -> None:
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d)
    for i in range(calls):
        open(os.path.join(d, f"a{i}"), "w").close()


def once(argv: list[str], d: str, traced: bool) -> float:
    t0 = time.perf_counter()
    if traced:
        _, r = trace(argv, cwd=d, timeout=300).run()
        ok = r.exit_code == 0
    else:
        ok = subprocess.run(argv, cwd=d, stdin=subprocess.DEVNULL).returncode == 0
    dt = time.perf_counter() - t0
    if not ok:
        raise SystemExit(f"{argv[:2]} failed {'traced' if traced else 'natively'}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="caper-bench-renames-")
    d = os.path.join(base, "w")
    out = {"tree": ROOT, "calls": a.calls, "rounds": a.rounds, "results": {}}
    try:
        for name, (argv, calls) in workloads(a.calls).items():
            times = {"native": [], "traced": []}
            for _ in range(a.rounds):
                for variant in times:
                    fresh(d, a.calls)
                    times[variant].append(once(argv, d, variant == "traced"))
            med = {k: statistics.median(v) for k, v in times.items()}
            out["results"][name] = {
                "native_s": round(med["native"], 4), "traced_s": round(med["traced"], 4),
                "per_call_us": round((med["traced"] - med["native"]) / calls * 1e6, 1)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
