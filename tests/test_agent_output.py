"""What a run hands back to the agent that asked for it.

The command's environment holds none of caper's own variables, and a run
that read a credential and was not committed returns no byte of its output
and no name it chose: the agent (and through it the model's provider) learns
counts and sizes only, whatever encoding the command used.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_report import ROOT, SECRET, repo  # noqa: F401  (fixtures)

APPROVER_KEY = "sk-proj-Abc123ApproverKey-77e1d"


@pytest.mark.parametrize("door", ["cli", "gate"])
def test_the_command_sees_none_of_capers_own_variables(repo, tmp_path, door):
    conf = tmp_path / "config.toml"
    conf.write_text('[llm]\napi_key_env = "MY_APPROVER_KEY"\n')
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "nohome"),
           "CAPER_STATE_DIR": str(state), "CAPER_CONFIG": str(conf), "CAPER_GATE_IDLE": "5",
           "CAPER_LLM_API_KEY": APPROVER_KEY, "MY_APPROVER_KEY": APPROVER_KEY,
           "CAPER_LLM_BASE_URL": "http://127.0.0.1:9/v1", "ORDINARY_VAR": "kept-1"}
    if door == "gate":
        env.pop("CAPER_NO_GATE", None)
    else:
        env["CAPER_NO_GATE"] = "1"
    p = subprocess.run([sys.executable, "-P", "-m", "caper", "run", "--json", "--approver", "allow",
                        "-c", "env"], cwd=repo, env=env, capture_output=True, timeout=120)
    try:
        doc = json.loads(p.stdout)
        assert ("gate" in doc) == (door == "gate") and doc["committed"], p.stderr
        names = [line.split("=", 1)[0] for line in doc["stdout"].splitlines()]
        assert "ORDINARY_VAR=kept-1" in doc["stdout"].splitlines()
        assert not [n for n in names if n.startswith("CAPER_")], names
        assert "MY_APPROVER_KEY" not in names and APPROVER_KEY not in doc["stdout"]
    finally:
        if door == "gate":
            from test_gate import _stop
            _stop(state)
