"""The wall-clock caper adds to each shell call of the real agent CLIs.

    python bench/agents.py [--calls N] [--repeat R] [--agent claude-code ...] [--json FILE]

Each client (tests/agents/clients.py: pinned, from npm, its own HOME) runs
one turn against the local fake model (tests/agents/model_server.py), which
asks for N shell calls in a row, each appending a line to a file: without
caper (`plain`), and with `caper install <agent>` (its default scope,
through the resident gate as a user runs it) twice: `caper-client`, this
tree as built (the hooks and the rewritten command are
caper_native/caper-client), and `caper-python`, a copy of this tree
without the native client (both are the Python CLI); for Claude Code also
`noop-hook`, a PreToolUse hook that reads its input and answers nothing:
what the client's own hook machinery costs, which any hook pays. A call's time is what
the model sees: from the model's answer asking for it to the client's next
request carrying its result (client, hook, caper run, commit). The added
wall-clock is a variant's median minus the plain median.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "agents")]

import clients  # noqa: E402
from benchlib import machine  # noqa: E402
from model_server import ModelServer, commands  # noqa: E402

COMMAND = "echo step {} >> notes.txt"   # distinct: Gemini stops a turn that repeats a call
TASK = "append a line to notes.txt each step"


def project(root: Path) -> Path:
    p = root / "proj"
    p.mkdir()
    (p / "README").write_text("bench\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.email=b@b", "-c", "user.name=b", *args], cwd=p,
                       check=True, capture_output=True)
    return p


def stop_gates(state: Path) -> None:
    """The gates this bench started (one per state directory)."""
    for pid in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and str(state).encode() in argv:
            os.kill(int(pid), signal.SIGTERM)


VARIANTS = ("plain", "noop-hook", "caper-client", "caper-python")
NOOP_HOOK = {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
    {"type": "command", "command": "cat > /dev/null", "timeout": 30}]}]}}


def python_only_tree(root: Path) -> Path:
    """A copy of this tree, native core included, without caper-client."""
    copy = root / "src"
    shutil.copytree(ROOT, copy, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "__pycache__", "*.img", "caper-client*", "results*.json"))
    return copy


def one(agent: str, calls: int, variant: str, root: Path) -> list[float]:
    proj = project(root)
    gated = variant.startswith("caper")
    model = ModelServer(clients.PROTOCOLS[agent],
                        commands(*[COMMAND.format(n) for n in range(calls)]))
    extra = {"CAPER_NO_GATE": "0"}
    if variant == "caper-python":
        extra["PYTHONPATH"] = str(python_only_tree(root))
    client = clients.Client(agent, root, model, extra_env=extra)
    try:
        if gated:
            p = client.caper("install", agent, cwd=proj)
            if p.returncode != 0:
                raise SystemExit(f"caper install {agent} failed:\n{p.stderr}")
        elif variant == "noop-hook":      # what the agent's own hook machinery costs
            (proj / ".claude").mkdir()
            (proj / ".claude" / "settings.json").write_text(json.dumps(NOOP_HOOK))
        run = client.run(TASK, proj, *(["--allowedTools", "Bash"] if agent == "claude-code"
                                       else []))
    finally:
        model.close()
        stop_gates(root / "state")
    lines = (proj / "notes.txt").read_text().count("step") if (proj / "notes.txt").exists() else 0
    if len(model.asked) != calls or lines != calls:
        raise SystemExit(f"{agent} ({variant}): {lines} of {calls} calls "
                         f"took effect\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    return model.call_times()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--agent", action="append", choices=list(clients.PINS),
                    help="only this client (repeatable; default: all three)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="sessions per variant, the variants in turn (calls after each "
                         "session's first are pooled; the first call's median is apart)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results-agents.json"))
    args = ap.parse_args()
    clients.install()
    out = {"calls": args.calls, "repeat": args.repeat, "command": COMMAND, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                       time.gmtime()),
           "machine": machine(), "agents": {}}
    for agent in args.agent or clients.PINS:
        variants = [v for v in VARIANTS if v != "noop-hook" or agent == "claude-code"]
        times: dict[str, list[float]] = {v: [] for v in variants}
        firsts: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.repeat):      # the variants in turn: a slow minute hits all alike
            for variant in variants:
                with tempfile.TemporaryDirectory(prefix=f"caper-bench-{agent}-") as d:
                    got = one(agent, args.calls, variant, Path(d))
                firsts[variant].append(got[0])
                times[variant] += got[1:]
        row = {}
        for variant in variants:
            row[variant] = {
                "median_ms": round(statistics.median(times[variant]) * 1000, 1),
                "first_ms": round(statistics.median(firsts[variant]) * 1000, 1),
                "all_ms": [round(t * 1000, 1) for t in times[variant]]}
            if variant != "plain":
                row[variant]["added_ms"] = round(row[variant]["median_ms"]
                                                 - row["plain"]["median_ms"], 1)
        row["version"] = clients.installed_version(agent)
        out["agents"][agent] = row
        print(f"{agent} {row['version']}: plain {row['plain']['median_ms']} ms; " + "; ".join(
            f"{v} {row[v]['median_ms']} ms (first call {row[v]['first_ms']} ms): "
            f"+{row[v]['added_ms']} ms per shell call" for v in VARIANTS[1:] if v in row),
            flush=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
