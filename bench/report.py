#!/usr/bin/env python3
"""Run caper's bench (or read its JSON) and print a Markdown report.

    python3 bench/report.py                     # run the bench, then report
    python3 bench/report.py --pin 0             # the same, pinned to CPU 0
    python3 bench/report.py bench/results.json  # report an earlier run (or --json FILE)
    python3 bench/report.py -- -k make          # extra pytest arguments go after --
    python3 bench/report.py --saved             # every table of every saved results file

Running writes pytest-benchmark's JSON to --out (default bench/results.json,
or bench/results-pin<N>.json with --pin) and the Markdown to stdout: the
tracer overhead tables (bench/test_overhead.py), the per-call table
(bench/test_calls.py), and one table per other benchmark group. --saved
reads bench/results*.json, pytest-benchmark's and the scripts' own
(agents.py, test_load.py, large_files.py, pairs.py), each with the date and
machine it was measured on where the file names them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

VARIANTS = ("native", "caper", "caper-cli", "strace-f", "strace-seccomp")
# targets from the issue
RATIO_TARGET = 1.25              # caper / native, on these workloads:
RATIO_WORKLOADS = ("make", "python-import")
ADDED_TARGET = 1 / 3             # caper's added time / strace -f's added time, everywhere
FOREIGN_LIMIT = 0.15             # CPU used by other processes, per second of a measurement


def wait_quiet(limit_s: float) -> None:
    """Wait (up to limit_s) until other processes use under FOREIGN_LIMIT of a CPU."""
    sys.path.insert(0, HERE)
    from benchlib import cpu_delta, cpu_snapshot
    deadline = time.monotonic() + limit_s
    while True:
        a = cpu_snapshot()
        time.sleep(2)
        d = cpu_delta(a, cpu_snapshot())
        share = d["foreign_cpu_s"] / d["wall_s"]
        if share <= FOREIGN_LIMIT:
            return
        if time.monotonic() > deadline:
            print(f"warning: other processes keep using {100 * share:.0f}% of a CPU; "
                  f"running anyway", file=sys.stderr)
            return
        print(f"waiting: other processes use {100 * share:.0f}% of a CPU", file=sys.stderr)


def run_bench(out: str, pin: str | None, extra: list[str]) -> None:
    env = dict(os.environ)
    if pin is not None:
        env["CAPER_BENCH_PIN"] = pin
    cmd = [sys.executable, "-m", "pytest", os.path.join(HERE), "-q", "-p", "no:cacheprovider",
           f"--benchmark-json={out}", "--benchmark-columns=min,median,iqr,max,rounds",
           "--benchmark-sort=name", *extra]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=sys.stderr)
    if r.returncode != 0:
        sys.exit(f"bench failed (exit {r.returncode})")


def load(path: str) -> tuple[dict, dict[str, dict[str, dict]]]:
    """The run, and its tracer-overhead benchmarks by workload and variant
    (the others have no workload; render_groups shows them)."""
    with open(path) as fh:
        data = json.load(fh)
    table: dict[str, dict[str, dict]] = {}
    for b in data["benchmarks"]:
        ei = b["extra_info"]
        if "workload" in ei:
            table.setdefault(ei["workload"], {})[ei["variant"]] = b
    return data, table


def machine_line(data: dict) -> str:
    mi = data.get("machine_info", {})
    return (f"Machine: {mi.get('cpu', {}).get('brand_raw', mi.get('processor', '?'))}, "
            f"{mi.get('online_cpus', '?')} online CPUs, bench affinity {mi.get('affinity', '?')}, "
            f"kernel {mi.get('kernel', mi.get('release', '?'))}, cpuidle "
            f"{mi.get('cpuidle_driver', '?')}, {mi.get('strace', 'strace ?')}, Python "
            f"{mi.get('python_version', '?')}; load average {mi.get('loadavg_start', '?')} at "
            f"start, {mi.get('loadavg_end', '?')} at end; run {data.get('datetime', '?')[:19]}"
            f"{commit_note(data.get('commit_info') or {})}.")


def _variant(b: dict) -> str:
    return b["extra_info"].get("variant") or b.get("param") or b["name"]


def render_calls(data: dict) -> str:
    """bench/test_calls.py: one agent shell call, part by part."""
    rows: dict[str, dict[str, dict]] = {}
    for b in data["benchmarks"]:
        if b["extra_info"].get("kind") == "call":
            rows.setdefault(_variant(b), {})[b["extra_info"]["call_workload"]] = b
    if not rows:
        return ""
    workloads = sorted({w for r in rows.values() for w in r})
    native = rows.get("native", {})
    lines = ["One agent shell call (bench/test_calls.py), medians in ms; (×) is the ratio to "
             "native `bash -c CMD`, +ms what caper adds to it:", "",
             "| variant | " + " | ".join(f"`{w}` ms (×) | `{w}` +ms" for w in workloads) + " |",
             "|---|" + "---:|---:|" * len(workloads)]
    for v, r in rows.items():
        cells = []
        for w in workloads:
            m, n = ms(r.get(w)), ms(native.get(w))
            cells += [cell(m, n), "–" if None in (m, n) or v == "native" else fmt_ms(m - n)]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines.append("")
    busy = [f"{v} `{w}` ({100 * c['foreign_cpu_s'] / c['wall_s']:.0f}% of a CPU)"
            for v, r in rows.items() for w, b in r.items()
            for c in [b["extra_info"].get("cpu")] if c and c["wall_s"] > 0]
    lines.append("Other processes' CPU during each measurement: " + ", ".join(busy) + "."
                 if busy else "")
    return "\n".join(lines + [""])


def render_groups(data: dict) -> str:
    """Every benchmark group that is neither the tracer overhead's nor the
    per-call one: median, min, max and rounds, and the ratio to the group's
    native variant where it has one."""
    groups: dict[str, list[dict]] = {}
    for b in data["benchmarks"]:
        if "workload" not in b["extra_info"] and b["extra_info"].get("kind") != "call":
            groups.setdefault(b.get("group") or b["name"], []).append(b)
    lines = []
    for g, bs in groups.items():
        native = next((b for b in bs if "native" in b["name"]), None)
        lines += [f"Group `{g}` (medians; (×) is the ratio to "
                  f"{native['name'] if native else '–'}):",
                  "", "| benchmark | median ms (×) | min ms | max ms | rounds |",
                  "|---|---:|---:|---:|---:|"]
        for b in bs:
            lines.append(f"| {b['name']} | {cell(ms(b), ms(native))} | {fmt_ms(ms(b, 'min'))} | "
                         f"{fmt_ms(ms(b, 'max'))} | {b['stats']['rounds']} |")
        lines.append("")
    return "\n".join(lines)


def label(w: str, row: dict, in_cell: bool = True) -> str:
    """The workload's name; in a Markdown table cell, pipes escaped."""
    text = next(iter(row.values()))["extra_info"].get("label", w)
    return text.replace("|", "\\|") if in_cell else text


def commit_note(ci: dict) -> str:
    if not ci.get("id"):
        return ""
    return f" at commit {ci['id'][:7]}" + (" (dirty tree)" if ci.get("dirty") else "")


def ms(b: dict | None, key: str = "median") -> float | None:
    return None if b is None else b["stats"][key] * 1000


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.1f}" if v >= 10 else f"{v:.2f}"


def cell(v: float | None, native: float | None) -> str:
    if v is None:
        return "–"
    return f"{fmt_ms(v)} ({v / native:.2f}×)" if native else fmt_ms(v)


def added_fraction(row: dict) -> float | None:
    n, c, s = ms(row.get("native")), ms(row.get("caper")), ms(row.get("strace-f"))
    if None in (n, c, s) or s - n <= 0:
        return None
    return (c - n) / (s - n)


def render(data: dict, table: dict[str, dict[str, dict]], title: str | None) -> str:
    lines = []
    if title:
        lines += [f"### {title}", ""]
    lines += [machine_line(data), ""]
    if table:
        lines.append(render_overhead(data, table))
    lines += [render_calls(data), render_groups(data)]
    return "\n".join(lines)


def render_overhead(data: dict, table: dict[str, dict[str, dict]]) -> str:
    lines = []
    lines.append("Medians; (×) is the ratio to native.")
    lines.append("")
    lines.append("| workload | native ms | caper ms (×) | strace -f ms (×) | strace --seccomp-bpf ms (×) "
                 "| caper added / strace -f added |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for w, row in table.items():
        n = ms(row.get("native"))
        frac = added_fraction(row)
        lines.append(f"| {label(w, row)} | {fmt_ms(n)} | {cell(ms(row.get('caper')), n)} | "
                     f"{cell(ms(row.get('strace-f')), n)} | {cell(ms(row.get('strace-seccomp')), n)} | "
                     f"{'–' if frac is None else f'{frac:.2f}'} |")
    lines.append("")

    # the CLI, which adds an interpreter start-up to the in-process numbers
    if any("caper-cli" in row for row in table.values()):
        lines.append("`python3 -m caper trace --quiet -- CMD` (a fresh interpreter each time):")
        lines.append("")
        lines.append("| workload | caper CLI ms (×) | CLI − in-process ms |")
        lines.append("|---|---:|---:|")
        for w, row in table.items():
            n, c, cli = ms(row.get("native")), ms(row.get("caper")), ms(row.get("caper-cli"))
            lines.append(f"| {label(w, row)} | {cell(cli, n)} | "
                         f"{'–' if None in (c, cli) else fmt_ms(cli - c)} |")
        lines.append("")

    # caper's own counts, which explain its cost
    lines.append("caper's counts (last round; `stops` = ptrace stops, `events` = records sent to "
                 "Python, `noise` = read-only opens dropped as baseline noise in C, "
                 "`collapsed` = repeats folded into one event):")
    lines.append("")
    lines.append("| workload | stops | events | noise dropped | collapsed | peak pids | "
                 "caper added ms | µs added per stop |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for w, row in table.items():
        b = row.get("caper")
        st = (b or {}).get("extra_info", {}).get("caper_stats")
        if not st:
            continue
        added = ms(b) - ms(row.get("native")) if row.get("native") else None
        per = added * 1000 / st["stops"] if added is not None and st["stops"] else None
        stops = str(st["stops"]) if st["stops_min"] == st["stops_max"] else \
            f"{st['stops']} ({st['stops_min']}–{st['stops_max']})"
        lines.append(f"| {label(w, row)} | {stops} | {st['events']} | {st['noise']} | {st['collapsed']} | "
                     f"{st['peak_pids']} | {fmt_ms(added)} | "
                     f"{'–' if per is None else f'{per:.1f}'} |")
    lines.append("")
    kinds = {w: row["caper"]["extra_info"]["caper_stats"].get("kinds", {})
             for w, row in table.items() if "caper" in row}
    if kinds:
        lines.append("Events by kind: " + "; ".join(
            f"{label(w, table[w], False)}: " + ", ".join(f"{k} {v}" for k, v in ks.items())
            for w, ks in kinds.items()) + ".")
        lines.append("")

    # spread, so a reader can tell a real gap from a noisy one
    lines.append("Spread (interquartile range as % of the median; rounds):")
    lines.append("")
    lines.append("| workload | " + " | ".join(VARIANTS) + " |")
    lines.append("|---|" + "---:|" * len(VARIANTS))
    for w, row in table.items():
        cells = []
        for v in VARIANTS:
            b = row.get(v)
            cells.append("–" if b is None else
                         f"{100 * b['stats']['iqr'] / b['stats']['median']:.0f}% ({b['stats']['rounds']})")
        lines.append(f"| {label(w, row)} | " + " | ".join(cells) + " |")
    lines.append("")

    disturbed, seen = [], False
    for w, row in table.items():
        for v in VARIANTS:
            c = (row.get(v) or {}).get("extra_info", {}).get("cpu")
            seen = seen or bool(c)
            if c and c["wall_s"] > 0 and c["foreign_cpu_s"] / c["wall_s"] > FOREIGN_LIMIT:
                disturbed.append(f"{label(w, row, False)} / {v} "
                                 f"({100 * c['foreign_cpu_s'] / c['wall_s']:.0f}% of a CPU)")
    if disturbed:
        lines.append("Other processes used CPU during: " + "; ".join(disturbed) +
                     ". Those medians are suspect; rerun when the machine is quiet.")
    elif seen:
        lines.append(f"No measurement saw other processes use more than "
                     f"{100 * FOREIGN_LIMIT:.0f}% of a CPU.")
    lines.append("")

    # targets
    lines.append("Targets:")
    lines.append("")
    for w in RATIO_WORKLOADS:
        row = table.get(w, {})
        n, c = ms(row.get("native")), ms(row.get("caper"))
        if n and c:
            r = c / n
            lines.append(f"- caper ≤ {RATIO_TARGET}× native on {label(w, row, False)}: {r:.2f}× — "
                         f"{'met' if r <= RATIO_TARGET else 'MISSED'}")
    for w, row in table.items():
        frac = added_fraction(row)
        if frac is not None:
            lines.append(f"- caper's added time ≤ 1/3 of strace -f's on {label(w, row, False)}: {frac:.2f} — "
                         f"{'met' if frac <= ADDED_TARGET else 'MISSED'}")
    lines.append("")
    trace_set = next((row["strace-seccomp"]["extra_info"] for row in table.values()
                      if "strace-seccomp" in row), {})
    if trace_set.get("strace_trace_set"):
        lines.append(f"strace --seccomp-bpf traced {len(trace_set['strace_trace_set'])} syscalls "
                     f"(caper's table); skipped as unknown to this strace: "
                     f"{', '.join(trace_set.get('strace_unknown_skipped') or []) or 'none'}.")
        lines.append("")
    return "\n".join(lines)


def _flat(doc, prefix: str = "") -> list[tuple[str, object]]:
    """A nested summary as (dotted key, value) rows."""
    if not isinstance(doc, dict):
        return [(prefix, doc)]
    rows = []
    for k, v in doc.items():
        rows += _flat(v, f"{prefix}.{k}" if prefix else str(k))
    return rows


def _value(v) -> str:
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


def render_agents(doc: dict) -> str:
    """bench/agents.py: the real clients, plain and with caper."""
    lines = [f"{doc.get('calls', '?')} calls of `{doc.get('command', '?')}` per client; "
             f"measured {doc.get('date', '(date not recorded)')} on "
             f"{doc.get('machine', '(machine not recorded)')}.", "",
             "| client | variant | median ms | first call ms | added per call ms |",
             "|---|---|---:|---:|---:|"]
    for agent, row in doc.get("agents", {}).items():
        for v, r in row.items():
            if not isinstance(r, dict):
                continue
            added = r.get("added_ms", row.get("added_ms") if v != "plain" else None)
            lines.append(f"| {agent} {row.get('version', '')} | {v} | {r['median_ms']} | "
                         f"{r['first_ms']} | {'–' if added is None else f'+{added}'} |")
    return "\n".join(lines)


def render_saved(paths: list[str]) -> str:
    """Every table of the saved results files."""
    sys.path.insert(0, HERE)
    from pairs_table import table as pairs_split
    out = []
    for path in paths:
        with open(path) as fh:
            doc = json.load(fh)
        name = os.path.basename(path)
        out.append(f"## {name}\n")
        if isinstance(doc, dict) and "benchmarks" in doc:
            data, table = load(path)
            out.append(render(data, table, None))
        elif name == "results-agents.json":
            out.append(render_agents(doc) + "\n")
        elif isinstance(doc, dict) and ("tuned" in doc or "heldback" in doc):
            out += [f"### {split}\n\n{pairs_split(doc[split])}\n" for split in
                    ("tuned", "heldback") if split in doc]
        elif isinstance(doc, list) and doc and isinstance(doc[0], dict):
            keys = list(doc[0])
            out.append("\n".join(["| " + " | ".join(keys) + " |", "|---" * len(keys) + "|"] +
                                 ["| " + " | ".join(_value(r.get(k)) for k in keys) + " |"
                                  for r in doc]) + "\n")
        elif isinstance(doc, dict):
            summary = doc.get("summary", doc)
            out.append("\n".join(["| measure | value |", "|---|---:|"] +
                                 [f"| {k} | {_value(v)} |" for k, v in _flat(summary)
                                  if not isinstance(v, list)]) + "\n")
        if isinstance(doc, dict) and "benchmarks" not in doc and "date" not in doc:
            out.append("(This file records no date or machine: see bench/README.md.)\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # pytest arguments only after "--", so a bare path is never mistaken for one
    pytest_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", metavar="RESULTS.json",
                    help="report this pytest-benchmark JSON instead of running the bench")
    ap.add_argument("--json", help="the same as RESULTS.json")
    ap.add_argument("--out", help="where a run writes its JSON")
    ap.add_argument("--pin", help="pin the bench to these CPUs (e.g. 0), like taskset -c")
    ap.add_argument("--title", help="a heading for the report")
    ap.add_argument("--saved", action="store_true",
                    help="print every table of every saved bench/results*.json (no bench run)")
    ap.add_argument("--wait-quiet", type=float, default=120, metavar="S",
                    help="before running, wait up to S seconds for other CPU users to stop")
    ap.epilog = "Extra pytest arguments go after --, e.g.: report.py -- -k make"
    args = ap.parse_args(argv)
    if args.saved:
        import glob
        print(render_saved(sorted(glob.glob(os.path.join(HERE, "results*.json")))))
        return 0
    if args.results and args.json:
        ap.error("give the JSON to read once")
    path = args.results or args.json
    if path is not None:
        if args.out or args.pin or pytest_args:
            ap.error("--out, --pin and pytest arguments are for running the bench, not reading a JSON")
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            ap.error(f"{path}: no such results file (run without it to run the bench)")
    else:
        path = args.out or os.path.join(
            HERE, "results.json" if args.pin is None else f"results-pin{args.pin.replace(',', '_')}.json")
        if args.wait_quiet > 0:
            wait_quiet(args.wait_quiet)
        run_bench(path, args.pin, pytest_args)
    data, table = load(path)
    print(render(data, table, args.title))
    return 0

if __name__ == "__main__":
    sys.exit(main())
