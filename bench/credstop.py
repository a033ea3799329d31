"""What the stop at a credential read costs per open (caper_config.stop_at).

A workload of many opens (one process opening N distinct files of a tree,
each open a tracer stop) traced with and without the credential stop, the
variants interleaved round by round (a shared machine drifts over minutes),
in one run. The stop asks the tracer to match every open's name, as written
and as resolved inside the sandbox (an openat2 and a readlink more), against
the credential globs of the real configuration (default patterns, every
account's home):

    python3 bench/credstop.py [--rounds 15] [--files 4000] [--json bench/results-credstop.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caper.report.secrets import default_patterns, protected_for   # noqa: E402
from caper.sandbox.trace import CredentialStop, trace                # noqa: E402

OPENER = "import os, sys\nfor p in open(sys.argv[1]).read().split():\n    open(p).close()\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--json")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="caper-bench-credstop-")
    try:
        names = []
        for i in range(args.files):
            d = os.path.join(root, "tree", f"d{i % 40}")
            os.makedirs(d, exist_ok=True)
            names.append(os.path.join(d, f"f{i}.txt"))
            with open(names[-1], "w") as f:
                f.write("x\n")
        listing = os.path.join(root, "list")
        with open(listing, "w") as f:
            f.write("\n".join(names))
        script = os.path.join(root, "open.py")
        with open(script, "w") as f:
            f.write(OPENER)
        home = os.path.expanduser("~")
        protected = protected_for(default_patterns(), home, root)
        argv = [os.path.realpath(sys.executable), script, listing]
        times: dict[str, list[float]] = {"no-stop": [], "stop": []}
        stops = {}
        for _ in range(args.rounds):
            for variant in times:
                stop = CredentialStop(protected.stop_globs, protected.translations,
                                      protected.reached, protected.stop_homes,
                                      protected.stop_below_home) if variant == "stop" else None
                t = time.perf_counter()
                events, result = trace(argv, cwd=root, stop_at=stop).run()
                times[variant].append(time.perf_counter() - t)
                assert result.exit_code == 0, result.status
                stops[variant] = result.stats.stops
        med = {v: statistics.median(ts) for v, ts in times.items()}
        per_open_us = (med["stop"] - med["no-stop"]) / args.files * 1e6
        out = {"files": args.files, "rounds": args.rounds, "globs": len(protected.stop_globs),
               "homes": len(protected.stop_homes), "below_home": len(protected.stop_below_home),
               "median_s": med, "min_s": {v: min(ts) for v, ts in times.items()},
               "stops": stops, "per_open_us": per_open_us}
        print(json.dumps(out, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
