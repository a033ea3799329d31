#!/usr/bin/env python3
"""Check the commit case matrix: every `CASE(changed, host)` label in
caper/commit/ has a test in tests/test_commit.py, and every label a test
claims exists in the code.  Exit status 1 on any gap.

    python3 scripts/check_commit_cases.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ROOT / "caper" / "commit"
TESTS = ROOT / "tests" / "test_commit.py"
LABEL = re.compile(r"CASE\(\s*([a-z*][a-z*-]*)\s*,\s*([a-z*][a-z*-]*)\s*\)")


def labels(path: Path) -> set[tuple[str, str]]:
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    return {label for f in files for label in LABEL.findall(f.read_text())}


def main() -> int:
    code, tests = labels(CODE), labels(TESTS)
    problems = [f"missing test for CASE({a}, {b})" for a, b in sorted(code - tests)]
    problems += [f"tests claim CASE({a}, {b}), which caper/commit/ does not label"
                 for a, b in sorted(tests - code)]
    for p in problems:
        print(p)
    if not problems:
        print(f"all {len(code)} commit cases have tests")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
