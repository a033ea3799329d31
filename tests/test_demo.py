"""`caper demo`, the README's main job: the real pipeline, three verdicts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_blocks_a_and_c_and_builds_b():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "caper", "demo"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    a, b, c = p.stdout.split("\n=== ")[1:4]
    assert "verdict: BLOCKED" in a and 'deleted dir "src" [tracked]' in a and '".git"' in a
    assert "verdict: ALLOWED and committed" in b
    # auto with no LLM blocks every credential read: the run stops at the read of .env
    assert "verdict: BLOCKED" in c and "stopped at a credential read (dotenv)" in c \
        and "sk_live" not in c
    assert "A: src/ still there, .git/ still there" in p.stdout
    assert "B: build/app rebuilt, prints: 2 + 3 = 5" in p.stdout
