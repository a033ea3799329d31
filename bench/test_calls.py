"""What one agent shell call costs with caper in front, part by part, side
by side in one run (groups `call-true`, `call-ls`):

    python3 -m pytest bench/test_calls.py --benchmark-columns=min,median,max,rounds

Variants (every process started from this one, as an agent starts them):

| variant | what runs |
|---|---|
| `native` | `bash -c CMD`: what the agent's Bash tool does without caper |
| `hook-python` | `python -P -m caper hook claude-code` on a PreToolUse input (the hook alone) |
| `hook-client` | `caper_native/caper-client hook claude-code`, the same through the gate |
| `run-inprocess` | `caper.run(CMD, approver="allow")` in this process: the work the gate does for a run, without any client |
| `run-gate-python` | `python -P -m caper run --approver allow -c CMD` through the gate |
| `run-gate-client` | `caper-client run ...`, the same |
| `run-nogate` | `python -P -m caper run --no-gate ...`: the run in a fresh interpreter |
| `call-python` | the whole call as Claude Code makes it: the Python hook, then `bash -c` of the command it rewrote to, with `python -P -m caper` as its head |
| `call-client` | the same with the native client as both (what `caper install` writes when it is built) |

The call variants judge with the default approver (policy; no LLM is
configured) against no recorded task, and commit. The gate is started
before timing. (What the real Claude Code adds on top: bench/agents.py.)

pytest-benchmark runs each variant's rounds back to back; on a shared
machine whose speed drifts over minutes that makes variants measured in
different minutes hard to compare. So this file also runs as a script
that interleaves them (every round runs each variant once, in turn):

    python3 bench/test_calls.py [--rounds 40] [--json bench/results-calls.json]

With `--baseline DIR` (another checkout, its native core built) every
variant that starts a process runs from that checkout too, in the same
rounds, with a gate and state directory of its own: before and after side by
side (`VARIANT@base` in the JSON, and a before/after table).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from benchlib import ROOT, cpu_delta, cpu_snapshot

SCALE = float(os.environ.get("CAPER_BENCH_SCALE", "1"))
ROUNDS = max(5, round(30 * SCALE))
CLIENT = os.path.join(ROOT, "caper_native", "caper-client")
PYTHON_CAPER = [sys.executable, "-P", "-m", "caper"]

# append: a write, so the run has a change to report, judge and commit (what
# bench/agents.py has the clients do)
WORKLOADS = {"true": "true", "ls": "ls", "append": "echo step >> notes.txt"}
VARIANTS = ["native", "hook-python", "hook-client", "run-inprocess", "run-gate-python",
            "run-gate-client",
            "run-nogate", "call-python", "call-client"]


@pytest.fixture(scope="session")
def call_env(workdir):
    if not os.access(CLIENT, os.X_OK):
        pytest.skip(f"{CLIENT} is not built (python3 caper_native/build.py)")
    return make_call_env(workdir)


def make_call_env(workdir: str, root: str = str(ROOT), tag: str = "") -> tuple[str, dict]:
    """A workspace (a git repo of a few files), a state dir and a HOME of the
    bench's own; the gate of the checkout `root` started (tag: the state
    dir's suffix, one per checkout)."""
    ws, home = os.path.join(workdir, "calls-ws"), os.path.join(workdir, "calls-home")
    if not os.path.isdir(ws):
        os.makedirs(ws)
        os.makedirs(home)
        for i in range(20):
            with open(os.path.join(ws, f"f{i}.txt"), "w") as f:
                f.write(f"{i}\n")
        subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("CAPER_NO_GATE", "PYTHONDONTWRITEBYTECODE", "CLAUDE_PROJECT_DIR")}
    env.update(CAPER_STATE_DIR=os.path.join(workdir, "calls-state" + tag), HOME=home,
               PYTHONPATH=root)
    subprocess.run(PYTHON_CAPER + ["run", "--approver", "allow", "-q", "-c", "true"], cwd=ws,
                   env=env, check=True, capture_output=True)         # start the gate
    return ws, env


def _hook_input(ws: str, command: str) -> bytes:
    return json.dumps({"session_id": "bench-calls", "transcript_path": "/nonexistent",
                       "cwd": ws, "permission_mode": "default", "hook_event_name": "PreToolUse",
                       "tool_name": "Bash", "tool_input": {"command": command},
                       "tool_use_id": "toolu_bench"}).encode()


def _call(head: list[str], ws: str, env: dict, command: str) -> None:
    """The hook, then the command it rewrote the call to, as Claude Code runs both."""
    p = subprocess.run(head + ["hook", "claude-code"], input=_hook_input(ws, command), cwd=ws,
                       env=env, capture_output=True, check=True)
    wrapped = json.loads(p.stdout)["hookSpecificOutput"]["updatedInput"]["command"]
    argv = shlex.split(wrapped)
    argv = head + argv[argv.index("run"):]       # the rewrite names the client when built
    r = subprocess.run(["bash", "-c", shlex.join(argv)], cwd=ws, env=env, capture_output=True)
    assert r.returncode == 0, r.stderr[-2000:]


def call_fn(variant: str, workload: str, ws: str, env: dict):
    """One call of the variant, as a function of no arguments (the
    checkout's: env's PYTHONPATH)."""
    cmd = WORKLOADS[workload]
    client = os.path.join(env["PYTHONPATH"], "caper_native", "caper-client")
    head = [client] if variant.endswith("client") else PYTHON_CAPER
    run = ["run", "--approver", "allow", "-q", "-c", cmd]
    if variant == "native":
        fn = lambda: subprocess.run(["bash", "-c", cmd], cwd=ws, env=env, capture_output=True,
                                    check=True)
    elif variant.startswith("hook"):
        fn = lambda: subprocess.run(head + ["hook", "claude-code"], input=_hook_input(ws, cmd),
                                    cwd=ws, env=env, capture_output=True, check=True)
    elif variant == "run-inprocess":
        import caper
        from caper.sandbox.inherit import Caller
        caller = Caller.here(cwd=ws, env=env)
        fn = lambda: caper.run(cmd, approver="allow", cwd=ws, env=env, caller=caller,
                               state_dir=env["CAPER_STATE_DIR"])
    elif variant.startswith("run-gate"):
        fn = lambda: subprocess.run(head + run, cwd=ws, env=env, capture_output=True, check=True)
    elif variant == "run-nogate":
        fn = lambda: subprocess.run(PYTHON_CAPER + ["run", "--no-gate"] + run[1:], cwd=ws,
                                    env=env, capture_output=True, check=True)
    else:
        fn = lambda: _call(head, ws, env, cmd)
    return fn


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_call(benchmark, call_env, workload, variant):
    ws, env = call_env
    benchmark.group = f"call-{workload}"
    benchmark.extra_info.update(kind="call", call_workload=workload, variant=variant)
    fn = call_fn(variant, workload, ws, env)
    before, gate_before = cpu_snapshot(), _gate_cpu_s(env)
    benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=1)
    cpu = cpu_delta(before, cpu_snapshot())
    # The gate is no child of this process: its CPU is the bench's own, not foreign.
    cpu["foreign_cpu_s"] = max(0.0, cpu["foreign_cpu_s"] - (_gate_cpu_s(env) - gate_before))
    benchmark.extra_info["cpu"] = cpu


def _own_cpu_s() -> float:
    """CPU time of this process and its reaped children (user + system)."""
    import resource
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _gate_cpu_s(env: dict, children: bool = False) -> float:
    """CPU time the bench's gate used so far (user + system; children: and
    that of its reaped children, the sandboxes)."""
    try:
        with open(os.path.join(env["CAPER_STATE_DIR"], "gate.log")) as f:
            pid = [line.split()[3] for line in f if line.startswith("caper serve: pid")][-1]
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = sum(int(f) for f in fields[11:15 if children else 13])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main() -> int:
    import argparse
    import shutil
    import statistics
    import tempfile
    import time

    from benchlib import machine
    ap = argparse.ArgumentParser(description="the per-call bench, variants interleaved")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--json", help="write the medians and every time here")
    ap.add_argument("--baseline", help="another checkout: its variants run in the same rounds")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="a comma-separated subset")
    args = ap.parse_args()
    variants = [v for v in VARIANTS if v == "native" or v in args.variants.split(",")]
    base = [v for v in variants if v not in ("native", "run-inprocess")] if args.baseline else []
    workdir = tempfile.mkdtemp(prefix="caper-bench-calls-")
    try:
        ws, env = make_call_env(workdir)
        fns = {(v, w): call_fn(v, w, ws, env) for w in WORKLOADS for v in variants}
        if base:
            _, base_env = make_call_env(workdir, os.path.abspath(args.baseline), "-base")
            fns.update({(v + "@base", w): call_fn(v, w, ws, base_env)
                        for w in WORKLOADS for v in base})
        envs = {key: base_env if key[0].endswith("@base") else env for key in fns}
        times: dict = {key: [] for key in fns}
        cpu_ms: dict = {key: [] for key in fns}
        for fn in fns.values():
            fn()                                       # warm-up
        start = cpu_snapshot()
        for _ in range(args.rounds):
            for key, fn in fns.items():
                c0 = _own_cpu_s() + _gate_cpu_s(envs[key], children=True)
                t0 = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - t0) * 1000)
                cpu_ms[key].append((_own_cpu_s() + _gate_cpu_s(envs[key], children=True) - c0)
                                   * 1000)
        cpu = cpu_delta(start, cpu_snapshot())
        with open("/proc/loadavg") as f:
            load_end = " ".join(f.read().split()[:3])
    finally:
        from conftest import _stop_gates
        _stop_gates(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    med = {key: statistics.median(t) for key, t in times.items()}
    cpu_med = {key: statistics.mean(t) for key, t in cpu_ms.items()}   # ticks: a mean, not a median
    print(f"{args.rounds} interleaved rounds, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f", {machine()} (at the end: {load_end}); other processes used "
          f"{cpu['foreign_cpu_s'] / cpu['wall_s']:.0%} of a "
          f"CPU meanwhile (the bench's gate included).\n")
    print("Wall-clock medians in ms, (×) the ratio to native, +ms what caper adds; CPU: the "
          "mean CPU time of a call, in ms, of every process it involves (the bench, its "
          "children, the gate and its sandboxes; the gate's in clock ticks, 10 ms steps, "
          "hence a mean).\n")
    print("| variant | " + " | ".join(f"`{w}` ms (×) | `{w}` +ms | `{w}` CPU ms"
                                     for w in WORKLOADS) + " |")
    print("|---|" + "---:|---:|---:|" * len(WORKLOADS))
    for v in variants + [b + "@base" for b in base]:
        cells = []
        for w in WORKLOADS:
            m, n = med[(v, w)], med[("native", w)]
            cells += [f"{m:.1f} ({m / n:.2f}×)", "–" if v == "native" else f"{m - n:.1f}",
                      f"{cpu_med[(v, w)]:.0f}"]
        print(f"| {v} | " + " | ".join(cells) + " |")
    if base:
        print(f"\nBefore (`{args.baseline}`) and after (this checkout), +ms over native, "
              "and after/before of the wall-clock medians:\n")
        print("| variant | " + " | ".join(f"`{w}` before | `{w}` after | `{w}` ratio"
                                         for w in WORKLOADS) + " |")
        print("|---|" + "---:|---:|---:|" * len(WORKLOADS))
        for v in base:
            cells = []
            for w in WORKLOADS:
                n, b, a = med[("native", w)], med[(v + "@base", w)], med[(v, w)]
                cells += [f"{b - n:.1f}", f"{a - n:.1f}", f"{a / b:.2f}"]
            print(f"| {v} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "machine": machine(), "rounds": args.rounds, "cpu": cpu,
                       "baseline": args.baseline, "load_average_end": load_end,
                       "median_ms": {f"{v}/{w}": round(m, 2) for (v, w), m in med.items()},
                       "mean_cpu_ms": {f"{v}/{w}": round(m, 1) for (v, w), m in cpu_med.items()},
                       "all_ms": {f"{v}/{w}": [round(x, 2) for x in t]
                                  for (v, w), t in times.items()}}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
