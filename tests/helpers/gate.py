"""The resident gate, from the tests: its pid (from its log), whether it
lives, stopping it, and `caper run` as a hook would call it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def gate_pid(state: Path) -> int | None:
    log = state / "gate.log"
    if not log.exists():
        return None
    pids = [int(line.split()[3]) for line in log.read_text().splitlines()
            if line.startswith("caper serve: pid")]
    return pids[-1] if pids else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


def stop_gate(state: Path) -> None:
    pid = gate_pid(state)
    if pid and alive(pid):
        os.kill(pid, signal.SIGTERM)


def caper(env, ws, *args):
    """`caper run ARGS` in ws with env (through the gate, unless env says not)."""
    return subprocess.run([sys.executable, "-m", "caper", "run", *args], cwd=ws, env=env,
                          capture_output=True)


def start_gate(env, ws) -> Path:
    """Start the gate with a first `caper run` in ws; its state directory."""
    assert caper(env, ws, "--approver", "allow", "-c", "true").returncode == 0
    return Path(env["CAPER_STATE_DIR"])
