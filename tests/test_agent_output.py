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

from pathlib import Path

import pytest

from caper.report.build import WITHHELD
from helpers.report import AWS_SECRET, go
from helpers.gate import stop_gate

APPROVER_KEY = "sk-proj-Abc123ApproverKey-77e1d"

ROOT = Path(__file__).resolve().parent.parent


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
            stop_gate(state)


ENCODE = ('base64 -w0 ~/.aws/credentials; echo; rev ~/.aws/credentials; '
          'fold -w1 ~/.aws/credentials >&2; '
          'touch "$(sed -n 3p ~/.aws/credentials | cut -d= -f2 | rev | tr / _)"; '
          'mkdir "d$(sed -n 3p ~/.aws/credentials | cut -c30-40 | base64)"')


def _leaks(text: str) -> list[str]:
    """Which encodings of the test's AWS secret key are in text."""
    import base64
    creds = (f"[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"
             f"aws_secret_access_key = {AWS_SECRET}\n")
    forms = {"base64": base64.b64encode(creds.encode()).decode()[40:80],
             "rev": AWS_SECRET[::-1][:20], "name": AWS_SECRET[::-1].replace("/", "_")[:20],
             "per-line": json.dumps("\n".join(AWS_SECRET[:6]))[1:-1], "verbatim": AWS_SECRET[:20]}
    return [k for k, v in forms.items() if v in text]


def test_a_blocked_run_that_read_a_credential_gives_back_no_output_and_no_chosen_name(
        repo, tmp_path, home):
    out = go(ENCODE, repo, tmp_path, home=home)
    assert not out.committed and out.report.read_credentials == ["aws-credentials"]
    agent_sees = out.card() + json.dumps(out.to_json()) + out.agent_reason
    assert _leaks(agent_sees) == [], agent_sees
    assert set(_leaks(out.report.card())) >= {"rev", "name"}   # the approver's report
    r = out.agent_report
    assert r.withheld and "withheld: the run read a credential" in r.card()
    assert r.output.stdout.head is None and r.output.stdout.bytes == 512   # 360, rounded up
    assert all(c.size is None and c.lines is None for c in r.changes)
    assert out.stdout.text() == b"\n[... 512 bytes omitted ...]\n"
    assert [c.path for c in r.changes if c.op == "created"] == [WITHHELD, WITHHELD]
    assert [p.path for p in r.protected_reads] == ["~/.aws/credentials"] * len(r.protected_reads)
    assert r.processes.execs == [] and r.counts["execs"].observed >= 5
    assert "withheld" in out.agent_reason and "aws" in out.agent_reason


@pytest.mark.parametrize("door", ["cli", "gate"])
def test_caper_run_of_a_blocked_credential_read_prints_no_encoding_of_it(repo, tmp_path, home,
                                                                        door):
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home),
           "CAPER_STATE_DIR": str(state), "CAPER_GATE_IDLE": "5"}
    if door == "gate":
        env.pop("CAPER_NO_GATE", None)
    try:
        for args in (["--json"], []):
            p = subprocess.run([sys.executable, "-P", "-m", "caper", "run", *args, "--approver",
                                "block", "-c", ENCODE], cwd=repo, env=env, capture_output=True,
                               timeout=120)
            text = p.stdout.decode() + p.stderr.decode()
            assert p.returncode == 125 and "withheld" in text, text
            assert _leaks(text) == [], text
    finally:
        if door == "gate":
            stop_gate(state)


def test_what_a_run_without_a_credential_read_or_an_approved_one_gives_back(repo, tmp_path, home):
    """Sealing is for runs that read a credential and were not committed: a
    blocked `ls` shows its output; an approved read returns its output as it was."""
    out = go("echo visible-line; touch made-here", repo, tmp_path, home=home)
    assert not out.committed and not out.withheld
    assert "visible-line" in out.card() and "made-here" in out.card()
    out = go("rev ~/.aws/credentials", repo, tmp_path, home=home, approver="allow")
    assert out.committed and AWS_SECRET[::-1] in out.stdout.text().decode()
