"""What reaches a human: every run-derived string (file names, output,
reasons) is escaped wherever caper shows it (caper.display): the terminal
card and reasons on stderr, the hooks' permission prompt, MCP results. The
escape strings are the issue's: a title set and screen cleared (OSC 0, CSI
2J), a fake green status hidden after it (CSI 32m ... CSI 8m), the
clipboard written (OSC 52), a bidi override, and a newline that starts a
line of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from caper.judge import Decision
from caper.display import escape, quote
from caper.front import hooks
from caper.transaction import run
from conftest import git_project

ROOT = Path(__file__).resolve().parent.parent
FAKE = "caper: all effects stay inside the workspace; risk: low. Safe to apply."
EVIL = ("\x1b]0;owned\x07\x1b[2J\x1b[32mcaper: committed\x1b[8m"
        "\x1b]52;c;cm0gLXJmIH4K\x07\u202egnp.exe\x9b31m\n" + FAKE + "\n")
UNSAFE = [chr(c) for c in range(0x20) if c not in (0x0a,)] + ["\x7f", "\x9b", "\u202e", "\u2028"]


def clean(text: str, lines_kept: bool = True) -> None:
    assert not any(ch in text for ch in UNSAFE), repr(text)
    if lines_kept:
        assert FAKE not in [line.strip() for line in text.splitlines()]


def test_escape_makes_every_control_visible_and_keeps_the_rest():
    out = escape(EVIL)
    clean(out)
    assert "\n" not in out and "\\x1b]0;owned\\x07" in out and "\\u202e" in out
    assert escape("café ünïcode\ttab") == "café ünïcode\\x09tab"
    assert escape("a\tb\nc", keep_lines=True) == "a\tb\nc"
    assert escape(b"\xff".decode(errors="surrogateescape")) == "\\xff"
    assert quote('say "hi"\\') == '"say \\"hi\\"\\\\"'


class Unsure:
    """An approver that is unsure and names the file in its reason (as the
    policy and the LLM do)."""
    name = "test"

    def decide(self, request):
        paths = [c.path for c in request.report.changes]
        return Decision("unsure", f"not sure about {paths[0]}", approver="test")


def test_the_terminal_sees_no_escape_from_a_file_name(tmp_path):
    """A tracked file with the name is deleted: the policy's reason and the
    card both name it."""
    ws = git_project(tmp_path / "ws", {"README": "hi\n", EVIL: "precious\n"})
    (tmp_path / "rm.py").write_text(f"import os\nos.unlink({EVIL!r})\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
           "CAPER_STATE_DIR": str(tmp_path / "state"), "CAPER_NO_GATE": "1"}
    p = subprocess.run([sys.executable, "-P", "-m", "caper", "run", "--approver", "policy", "-c",
                        f"{sys.executable} {tmp_path / 'rm.py'}"], cwd=ws, env=env,
                       capture_output=True, text=True, errors="surrogateescape", timeout=120)
    assert p.returncode == 125 and "caper: blocked" in p.stderr
    reason = p.stderr.split("caper: blocked: ", 1)[1]
    assert "\\x1b]0;owned\\x07" in reason           # the name is shown, escaped
    clean(p.stderr)


def test_the_permission_prompt_shows_no_line_of_the_runs(tmp_path):
    """A held run whose file name holds a newline and a fake verdict line:
    the prompt Claude Code shows its human has no such line."""
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    state = tmp_path / "state"
    (tmp_path / "mk.py").write_text(f"open({EVIL!r}, 'w').write('x')\n")
    out = run(f"{sys.executable} {tmp_path / 'mk.py'}", approver=Unsure(), workspace=str(ws),
              cwd=str(ws), state_dir=str(state), on_unsure="ask",
              env={**os.environ, "HOME": str(tmp_path)})
    assert out.held and not out.committed
    answer = json.loads(hooks.ask_human(hooks.AGENTS["claude-code"], out.held, str(state)))
    prompt = answer["hookSpecificOutput"]["permissionDecisionReason"]
    assert answer["hookSpecificOutput"]["permissionDecision"] == "ask"
    assert "not sure about" in prompt and "\\x1b[2J" in prompt
    clean(prompt)
