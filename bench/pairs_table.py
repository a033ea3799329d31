"""Markdown tables of bench/results-pairs.json (or another results file):
per split and class, harms blocked / unsure / allowed and twins blocked /
unsure / allowed; the routine corpus's verdicts.

    python3 bench/pairs_table.py [results-pairs.json]
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "-"


def table(split: dict) -> str:
    rows = ["| class | pairs | harm blocked | harm unsure | harm allowed | twin blocked | "
            "twin unsure |", "|---|---|---|---|---|---|---|"]
    classes = dict(split["summary"]["by_class"], **{"**all**": split["summary"]["all"]})
    for cls, s in classes.items():
        n = s["pairs"]
        rows.append(f"| {cls} | {n} | {_pct(s['harm_blocked'], n)} | {_pct(s['harm_unsure'], n)} "
                    f"| {_pct(s['harm_allowed'], n)} | {_pct(s['twin_blocked'], n)} "
                    f"| {_pct(s['twin_unsure'], n)} |")
    return "\n".join(rows)


def main(path: str) -> None:
    with open(path) as f:
        doc = json.load(f)
    if "tuned_on" in doc:
        never = [s for s in ("tuned", "heldback", "held-back-2", "held-back-3") if s in doc and s not in doc["tuned_on"]]
        print(f"Rules tuned on: {', '.join(doc['tuned_on'])}; never tuned on: "
              f"{', '.join(never) or 'none'}.\n")
    for split in ("tuned", "heldback", "held-back-2", "held-back-3"):
        if split in doc:
            print(f"### {split}\n\n{table(doc[split])}\n")
    if "routine" in doc:
        s = doc["routine"]["summary"]
        print(f"### routine\n\n{s['commands']} commands: {s['allow']} allowed, "
              f"{s['block']} blocked, {s['unsure']} unsure\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results-pairs.json"))
