"""Claude Code's Bash permission rules as caper's hook applies them to the
model's own command (tests/test_real_agents.py runs them in the real client)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from caper.front import claude_rules as cr
from caper.front import hooks


@pytest.mark.parametrize("pattern, command, hit", [
    ("rm:*", "rm -rf build", True), ("rm:*", "rm", True), ("rm:*", "rmdir x", False),
    ("*", "anything", True), ("", "anything", True),
    ("git * main", "git push origin main", True), ("git * main", "git push origin dev", False),
    ("ls", "ls", True), ("ls", "ls -l", False)])
def test_rule_forms(pattern, command, hit):
    assert cr.matches(pattern, command) is hit


@pytest.mark.parametrize("command", [
    "rm -rf build", "make && rm -rf build", "echo hi; rm -rf build", "true | rm -rf build",
    "FOO=1 rm -rf build", "sudo rm -rf build", "env X=1 rm -rf build", "timeout 5 rm -rf build",
    "echo $(rm -rf build)", "echo `rm -rf build`", "make\nrm -rf build", "(rm -rf build)",
    # The adversarial round's forms: compound statements, reserved words,
    # wrapper options with arguments, a path, nested shells and eval.
    "{ rm -rf build; }", "if true; then rm -rf build; fi", "if false; then :; else rm x; fi",
    "for f in build; do rm -rf $f; done", "while true; do rm -rf build; done", "! rm -rf build",
    "exec -a foo rm -rf build", "timeout -s KILL 5 rm -rf build", "env -u HOME rm -rf build",
    "/bin/rm -rf build", "./../../bin/rm x", "\\rm x", "'rm' x", "bash -c \"rm -rf build\"",
    "sh -ec 'echo; rm -rf build'", "eval 'rm -rf build'", "eval rm -rf build",
    "sudo -u root bash -c 'cd /; rm -rf build'", "bash -c \"bash -c 'rm x'\"",
    "time -p rm x", "f() { rm x; }; f", "function f { rm x; }", "nice -n 5 rm x",
    "find . -name '*.o' -exec rm {} \\;", "xargs -I{} rm {}", "env -S 'rm -rf build'",
    "echo 'unbalanced; rm -rf build"])
def test_a_deny_rule_reaches_every_simple_command(command, tmp_path):
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["Bash(rm:*)"], "ask": ["Bash(make:*)"]}}))
    kind, why = cr.verdict(command, str(tmp_path), env={"HOME": str(tmp_path / "home")})
    assert kind == "deny" and "Bash(rm:*)" in why


@pytest.mark.parametrize("command, denied", [
    ("git push", True), ("git -C . push", True), ("git -c core.x=1 --no-pager push origin", True),
    ("/usr/bin/git push -f", True), ("cd x && git -C sub push", True),
    ("git log push", False), ("git commit -m 'fix push'", False), ("git status", False)])
def test_a_rule_with_a_subcommand_sees_past_global_options(command, denied, tmp_path):
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["Bash(git push:*)"]}}))
    got = cr.verdict(command, str(tmp_path), env={"HOME": str(tmp_path / "home")})
    assert (got is not None and got[0] == "deny") is denied


@pytest.mark.parametrize("command", ["echo rm", "ls -l rm", "grep -r 'rm -rf' .", "make"])
def test_a_rule_does_not_match_its_word_as_an_argument(command, tmp_path):
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["Bash(rm:*)"]}}))
    assert cr.verdict(command, str(tmp_path), env={"HOME": str(tmp_path / "home")}) is None


def test_ask_and_none(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg")}
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "settings.json").write_text(
        json.dumps({"permissions": {"ask": ["Bash(make:*)"], "allow": ["Bash(rm:*)"],
                                    "deny": ["Read(.env)"]}}))
    assert cr.verdict("make clean", str(tmp_path), env)[0] == "ask"
    assert cr.verdict("rm -rf x", str(tmp_path), env) is None


def test_unreadable_settings_fail_closed(tmp_path):
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.local.json").write_text("{ nope")
    with pytest.raises(ValueError, match="not JSON"):
        cr.verdict("ls", str(tmp_path), env={"HOME": str(tmp_path)})


@pytest.mark.parametrize("command, held", [
    ("caper commit 0123456789abcdef", "0123456789abcdef"),
    ("/usr/local/bin/caper commit 0123456789abcdef", "0123456789abcdef"),
    ("python3 -m caper commit 0123456789abcdef", "0123456789abcdef"),
    ("/opt/v/bin/python3.11 -m caper commit 0123456789abcdef", "0123456789abcdef"),
    ("caper commit 0123456789abcdef; rm -rf /", None), ("caper commit xyz", None),
    ("caper commit 0123456789abcdef --state-dir /tmp", None),
    ("notcaper commit 0123456789abcdef", None)])
def test_every_form_of_caper_commit(command, held):
    assert hooks.held_commit(command) == held


def test_claude_timeouts():
    assert hooks.claude_timeouts({}, {}) == (120.0, 120_000 + hooks.CAPER_AFTER_MS)
    assert hooks.claude_timeouts({"timeout": 2000}, {}) == (2.0, 2000 + hooks.CAPER_AFTER_MS)
    # The largest the tool takes bounds both: caper's leaves room for its own work.
    assert hooks.claude_timeouts({"timeout": 600_000}, {}) == (540.0, 600_000)
    assert hooks.claude_timeouts({}, {"BASH_DEFAULT_TIMEOUT_MS": "5000",
                                      "BASH_MAX_TIMEOUT_MS": "900000"}) == (5.0, 65_000)


def test_launch_rules_are_read_as_claude_codes_option_parser_reads_them(tmp_path):
    """`--disallowedTools A B,C` takes words up to the next option and splits
    them at commas and spaces outside parentheses; `--opt=V` one value;
    `--settings` a JSON text or a file relative to Claude Code's cwd."""
    (tmp_path / "s.json").write_text('{"permissions": {"ask": ["Bash(git push:*)"]}}')
    launch = cr.Launch.parse(
        ["claude", "-p", "--disallowedTools", "Edit,Bash(git *)", "Bash(rm:*)", "--verbose",
         "--disallowed-tools=Bash(curl:*)", "--settings", "s.json", "hi"],
        str(tmp_path), "Claude Code (pid 1)")
    assert launch.disallowed == ["Edit", "Bash(git *)", "Bash(rm:*)", "Bash(curl:*)"]
    rules = cr.bash_rules(str(tmp_path / "none"), {"HOME": str(tmp_path)}, launch)
    assert [(k, p) for k, p, _ in rules] == [
        ("deny", "git *"), ("deny", "rm:*"), ("deny", "curl:*"), ("ask", "git push:*")]
    assert cr.verdict("cd x && rm -rf y", str(tmp_path / "none"), {"HOME": str(tmp_path)},
                      launch)[0] == "deny"


def test_launch_rules_come_from_the_nearest_claude_code_ancestor(tmp_path):
    """A process started (through a shell) by a program named claude finds that
    program's --disallowedTools; a process with no such ancestor finds none."""
    import subprocess
    import sys
    probe = (f"import sys; sys.path.insert(0, {str(Path(cr.__file__).parents[2])!r});"
             "from caper.front import claude_rules as cr;"
             "l = cr.Launch.of_ancestor(); print(l and l.disallowed)")
    claude = tmp_path / "claude"
    claude.write_text(f"#!/bin/sh\n{sys.executable} -c \"$PROBE\"\n")
    claude.chmod(0o755)
    env = {"PROBE": probe, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(claude), "--disallowedTools", "Bash(rm:*)"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['Bash(rm:*)']"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "None"


def test_an_unreadable_settings_file_on_the_command_line_fails_closed(tmp_path):
    with pytest.raises(ValueError, match="--settings"):
        cr.Launch.parse(["claude", "--settings", "missing.json"], str(tmp_path), "Claude Code")


@pytest.mark.parametrize("command", [
    "$'\\x72m' -rf src", "{rm,-rf,src}", "rm${IFS}-rf${IFS}src", "$(printf rm) -rf src",
    "`echo rm` -rf src", 'echo "rm -rf src" | bash', "alias r=rm\nr -rf src", "x=rm; $x -rf src",
    "\\rm -rf src", "cat script | sh -s"])
def test_a_command_that_hides_its_program_meets_the_strictest_rule(command, tmp_path):
    """Round 3 got `allow` past `deny: Bash(rm:*)` with each of these: where the
    text does not say which program runs, every rule may match."""
    _deny_rm(tmp_path)
    kind, why = cr.verdict(command, str(tmp_path), {"HOME": str(tmp_path / "h")})
    assert kind == "deny" and ("cannot tell which program" in why or "matches" in why), why


@pytest.mark.parametrize("command", ["echo $HOME", "ls {a,b}.txt", "bash run_tests.sh",
                                     "find . -name '*.o' -exec ls {} +", "sh -c 'ls'"])
def test_expansions_outside_the_command_word_are_no_uncertainty(command, tmp_path):
    _deny_rm(tmp_path)
    assert cr.verdict(command, str(tmp_path), {"HOME": str(tmp_path / "h")}) is None


def _deny_rm(project):
    (project / ".claude").mkdir()
    (project / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["Bash(rm:*)"]}}))
