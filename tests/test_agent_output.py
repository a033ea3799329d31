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
from helpers.report import AWS_SECRET, JUDGED_AFTER, go
from helpers.gate import stop_gate

APPROVER_KEY = "sk-proj-Abc123ApproverKey-77e1d"

ROOT = Path(__file__).resolve().parent.parent


def _command_env(repo, tmp_path, door: str, config: str, env: dict[str, str]) -> dict[str, str]:
    """The environment `env` run through caper (cli or gate door) with this config.toml."""
    conf = tmp_path / "config.toml"
    conf.write_text(config)
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "nohome"),
           "CAPER_STATE_DIR": str(state), "CAPER_CONFIG": str(conf), "CAPER_GATE_IDLE": "5",
           **env}
    if door == "gate":
        env.pop("CAPER_NO_GATE", None)
    else:
        env["CAPER_NO_GATE"] = "1"
    p = subprocess.run([sys.executable, "-P", "-m", "caper", "run", "--json", "--approver", "allow",
                        "-c", "env -0"], cwd=repo, env=env, capture_output=True, timeout=120)
    try:
        doc = json.loads(p.stdout)
        assert ("gate" in doc) == (door == "gate") and doc["committed"], p.stderr
        return dict(v.split("=", 1) for v in doc["stdout"].split("\0") if "=" in v)
    finally:
        if door == "gate":
            stop_gate(state)


@pytest.mark.parametrize("door", ["cli", "gate"])
def test_the_command_sees_none_of_capers_own_variables(repo, tmp_path, door):
    got = _command_env(repo, tmp_path, door, '[llm]\napi_key_env = "MY_APPROVER_KEY"\n', {
        "CAPER_LLM_API_KEY": APPROVER_KEY, "MY_APPROVER_KEY": APPROVER_KEY,
        "CAPER_LLM_BASE_URL": "http://127.0.0.1:9/v1", "ORDINARY_VAR": "kept-1"})
    assert got.get("ORDINARY_VAR") == "kept-1"
    assert not [n for n in got if n.startswith("CAPER_")], got
    assert "MY_APPROVER_KEY" not in got and APPROVER_KEY not in got.values()


CALLER_CREDENTIALS = {
    "ANTHROPIC_API_KEY": "sk-ant-api03-Zq8Xv3correcthorse41batterystaple",
    "OPENAI_API_KEY": "not-shaped-but-named-1", "GITHUB_TOKEN": "named-2",
    "AWS_SECRET_ACCESS_KEY": "named-3", "DB_PASSWORD": "named-4", "DEPLOY_SECRET": "named-5",
    "SHAPED_ONLY": "ghp_" + "A1b2C3d4" * 5, "DATABASE_URL": "postgres://app:hunter22x@db/app",
    # round 4: passed until then
    "MYSQL_PWD": "named-6", "DB_PASS": "named-7", "DOCKER_AUTH_CONFIG": "named-8",
    "SLACK_WEBHOOK_URL": "named-9", "SENTRY_DSN": "named-10",
    "REDIS_URL": "redis://:hunter23y@cache:6379/0",
    "UPSTREAM_AUTHORIZATION": "Basic dXNlcjpodW50ZXIyNHo=", "API_BEARER": "named-11",
    "VAULT_ROLE_ID": "named-12", "WALLET_SEED": "named-13",
    # round 5
    "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountKey=hunter25w==;",
    "BUNDLE_RUBYGEMS__PKG__GITHUB__COM": "me:hunter26v", "GIT_CONFIG_VALUE_0": "named-14",
    "LDAP_BIND_PW": "named-15", "DEPLOY_SSH": "LS0tLS1CRUdJTiBPUEVOU1NIIFBSSVZBVEUgS0VZLS0tLS0K",
    "MFA": "otpauth://totp/me?secret=JBSWY3DPEHPK3PXP",
    # round 7: session and tool tokens named without TOKEN/KEY at the end
    "BW_SESSION": "named-16", "OP_SESSION_my": "named-17", "TF_TOKEN_app_terraform_io": "named-18",
    "SYSTEM_ACCESSTOKEN": "named-19", "NGROK_AUTHTOKEN": "named-20", "SONAR_LOGIN": "named-21",
    "DOCKER_CONFIG_JSON": "named-22", "GCP_CREDS": "named-23",
    # round 8: the word fused at the end, a SAS token
    "HONEYCOMB_WRITEKEY": "named-24", "MEILI_MASTERKEY": "named-25", "AZURE_STORAGE_SAS": "named-26",
}


@pytest.mark.parametrize("door", ["cli", "gate"])
def test_the_command_gets_no_credential_of_the_callers_environment_unless_allowed(
        repo, tmp_path, door):
    ordinary = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "CI": "1", "TERM": "xterm",
                "SSH_AUTH_SOCK": "/tmp/agent.sock", "TOKENIZERS_PARALLELISM": "false",
                "OLDPWD": "/srv", "BYPASS_CACHE": "1", "BUNDLE_PATH": "vendor/bundle",
                "GIT_CONFIG_COUNT": "0", "KEYBOARD": "us", "XDG_SESSION_TYPE": "tty",
                "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus", "LOGNAME": "me"}
    got = _command_env(repo, tmp_path, door, '[env]\nallow = ["GITHUB_TOKEN"]\n',
                       {**CALLER_CREDENTIALS, **ordinary})
    assert {k: got.get(k) for k in ordinary} == ordinary
    assert got.get("GITHUB_TOKEN") == "named-2"          # the user allowed it
    leaked = [k for k in CALLER_CREDENTIALS if k != "GITHUB_TOKEN" and k in got]
    assert leaked == [] and not set(CALLER_CREDENTIALS.values()) - {"named-2"} & set(
        got.values())


# What Gemini CLI gives its shell (0.61: eight overrides), then a pair that
# carries a credential, then one the user allowed.
GEMINI_GIT_OVERRIDES = [("credential.helper", ""), ("core.fsmonitor", ""), ("core.hooksPath", ""),
                        ("core.sshCommand", ""), ("core.pager", "cat"), ("core.editor", ""),
                        ("sequence.editor", ""), ("diff.external", "")]


def test_gits_environment_configuration_stays_one_list_without_its_credentials(repo, tmp_path):
    """GIT_CONFIG_COUNT names pairs GIT_CONFIG_KEY_<n>/VALUE_<n>; a pair
    missing makes every git fail ("missing config key"). The command gets
    the pairs that hold no credential, renumbered, and their count: not
    the extraHeader's value, and the allowed one."""
    pairs = GEMINI_GIT_OVERRIDES + [("http.extraHeader", "Authorization: Basic aHVudGVyMjd4Cg=="),
                                    ("commit.gpgSign", "false")]
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for n, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{n}"], env[f"GIT_CONFIG_VALUE_{n}"] = key, value
    got = _command_env(repo, tmp_path, "cli", '[env]\nallow = ["GIT_CONFIG_VALUE_9"]\n', env)
    count = int(got["GIT_CONFIG_COUNT"])
    assert [(got[f"GIT_CONFIG_KEY_{n}"], got[f"GIT_CONFIG_VALUE_{n}"]) for n in range(count)] == \
        GEMINI_GIT_OVERRIDES + [("commit.gpgSign", "false")]
    assert f"GIT_CONFIG_KEY_{count}" not in got and "aHVudGVyMjd4Cg==" not in str(got)
    git = subprocess.run(["git", "config", "--get", "core.pager"], cwd=repo, capture_output=True,
                         text=True, env={**os.environ, **{k: v for k, v in got.items()
                                                          if k.startswith("GIT_CONFIG")}})
    assert git.returncode == 0 and git.stdout == "cat\n", git.stderr


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
    out = go(ENCODE, repo, tmp_path, home=home, **JUDGED_AFTER)
    assert not out.committed and out.report.read_credentials == ["aws-credentials"]
    agent_sees = out.card() + json.dumps(out.to_json()) + out.agent_reason
    assert _leaks(agent_sees) == [], agent_sees
    assert set(_leaks(out.report.card())) >= {"rev", "name"}   # the approver's report
    r = out.agent_report
    assert r.withheld and "withheld: the run read a credential" in r.card()
    assert r.output.stdout.head is None and r.output.stdout.bytes == 0 and out.stdout.total == 0
    assert r.changes == r.aggregates == r.protected_reads == [] and r.counts == {}
    assert r.processes.execs == [] and r.end.how == WITHHELD
    assert "withheld" in out.agent_reason and "aws" not in out.agent_reason
    assert "timings" not in out.to_json() or not out.to_json()["timings"]
    # round 5: which rule fired and how sure are choices the run made too
    doc = out.to_json()
    assert doc["confidence"] is None and not {"boundary", "steps", "notes"} & set(doc), doc


# Each number and name here is one the run chose after it read a credential:
# an aggregate's file names, which existing files it touched, bytes of output
# past what is held, its exit status, a signal's number and target.
CHOSEN = ("cat ~/.aws/credentials >/dev/null; mkdir -p gen/x; "
          "for j in $(seq 300); do : > gen/x/picked-name-$j; done; "
          "echo >> src/m1.c; chmod 600 Makefile; "
          "head -c 212345 /dev/zero; kill -s USR2 4280393 2>/dev/null; exit 77")


def test_a_sealed_report_carries_no_name_or_number_the_run_chose(repo, tmp_path, home):
    out = go(CHOSEN, repo, tmp_path, home=home, **JUDGED_AFTER)
    full = out.report
    assert not out.committed and out.withheld
    approver_sees = full.card()
    assert "picked-name-" in approver_sees and "src/m1.c" in approver_sees   # the test can fail
    assert any(s.target == 4280393 for s in full.processes.signals) and full.end.exit_code == 77
    assert any(u.startswith("stdout-not-all-held: ") for u in full.uncertain)
    omitted = next(int(u.split(": ")[1]) for u in full.uncertain if u.startswith("stdout-not"))
    r = out.agent_report.model_copy(update={"command": ""})   # the agent's own words
    rest = {k: v for k, v in out.to_json().items() if k != "report"}
    assert out.to_json()["report"] == out.agent_report.to_dict()
    for agent_sees in (r.card(), r.to_json(), json.dumps(rest), out.agent_reason):
        for chosen in ("picked-name", "src/m1.c", "Makefile", "gen/x", "4280393", "status 77",
                       '"exit_code": 77', f": {omitted}", "signal 12", '"signal": 12'):
            assert chosen not in agent_sees, (chosen, agent_sees)
    # Round 5: sizes, counts, flags and kinds, even rounded, carried a byte a
    # run (2^h bytes of stdout, 2^l of stderr): the sealed report is a constant.
    other = go("cat ~/.aws/credentials >/dev/null; echo x; exit 3", repo, tmp_path / "2",
               home=home)
    assert other.withheld and other.agent_report.model_copy(update={"command": ""}) == r


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


# Round 4: under the default approver, a run that read a credential and then
# printed nothing gave its bytes back through what a committed run returns:
# its exit status (one byte a run, 40 runs for an AWS key), a directory's
# name or a symlink's target left on the host for the next run to list.
CHANNELS = {
    "exit status": "exit $(head -c1 ~/.aws/credentials | od -An -tu1)",
    "directory name": "mkdir -p \"k-$(sed -n 3p ~/.aws/credentials | rev | tr / _)\"",
    "symlink target": "ln -s \"$(sed -n 3p ~/.aws/credentials | rev)\" lnk",
    "chosen deletion": "[ \"$(head -c1 ~/.aws/credentials)\" = '[' ] && rm -f build/app.o; true",
}


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_the_policy_commits_no_run_that_read_a_credential_whatever_it_gives_back(
        repo, tmp_path, home, channel):
    (repo / "build" / "app.o").write_text("an object file\n")     # ignored: expendable
    before = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts)
    out = go(CHANNELS[channel], repo, tmp_path, home=home, approver="policy")
    assert out.report.read_credentials == ["aws-credentials"]
    assert not out.committed and out.withheld, out.reason
    assert out.to_json()["exit_code"] is None
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*")
                  if ".git" not in p.parts) == before
    assert "credential" in out.reason
