"""Agent hooks: Claude Code, Codex CLI and Gemini CLI, and their installers.

    caper hook claude-code|codex|gemini      (reads the agent's hook JSON on stdin)
    caper install claude-code|codex|gemini [--project | --user]
    caper uninstall claude-code|codex|gemini [--project | --user]

A hook never runs the command. Its job is that the command runs exactly once,
inside `caper run --session <session> --shell bash --task <the user's latest words> -c
<command>`, so the agent sees the held output when the effects are approved,
or the effect card and the block reason (exit status 125) when they are not:

- Claude Code (PreToolUse, Bash) and Gemini CLI (BeforeTool,
  run_shell_command) let a hook rewrite the call: the hook answers allow with
  the wrapped command (`updatedInput`, `hookSpecificOutput.tool_input`).
- Codex CLI's PreToolUse can only block (its parser treats `updatedInput`,
  `ask` and even `additionalContext` as failures, and a failed hook lets the
  call run). So the hook denies the raw command with the wrapped one in the
  reason, and lets through exactly that wrapped command, byte for byte, when
  the model resubmits it: one more model turn per command, same guarantee.

Whatever the agent, a command that already has that exact wrapped form for
this session passes unchanged, and any failure of the hook itself answers
deny: a hook that crashed or exited with another status would let the call
run ungated (the installed command also ends in `|| exit 2`, which all three
treat as a block).

Input and output shapes, from each agent's reference: Claude Code
https://docs.anthropic.com/en/docs/claude-code/hooks ; Codex
codex-rs/hooks/schema/generated/pre-tool-use.command.{input,output}.schema.json
and codex-rs/hooks/src/events/pre_tool_use.rs in openai/codex ; Gemini CLI
docs/hooks/reference.md in google-gemini/gemini-cli.

Standard library only: this runs once per command.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass

MAX_INPUT = 1 << 20            # hook JSON larger than this is refused
TASK_MESSAGES = 3              # latest user messages that make the task
TASK_CHARS = 2000
TRANSCRIPT_TAIL = 512 * 1024   # bytes read from the end of a transcript
MARK = " hook "                # how install/uninstall recognise caper's entry
_HELD_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class Agent:
    name: str
    event: str                 # the hook event
    tool: str                  # the shell tool's name (the matcher)
    project_file: str          # settings file, relative to the project
    user_file: str             # ... and under the home directory
    timeout: int               # the hook's own timeout, in the unit the agent uses
    mode: str                  # rewrite | resubmit
    can_ask: bool = False      # the host can put a question to its human
    shell: str = "bash"        # what its shell tool runs the command with (Claude Code's
                               # Bash tool, Codex's bash -lc, Gemini's bash -c)


AGENTS = {
    "claude-code": Agent("claude-code", "PreToolUse", "Bash", ".claude/settings.json",
                         ".claude/settings.json", 30, "rewrite", can_ask=True),
    "codex": Agent("codex", "PreToolUse", "Bash", ".codex/hooks.json", ".codex/hooks.json", 30,
                   "resubmit"),
    "gemini": Agent("gemini", "BeforeTool", "run_shell_command", ".gemini/settings.json",
                    ".gemini/settings.json", 30000, "rewrite"),   # Gemini: milliseconds
}


# --- the task, from the agent's transcript ---------------------------------------------------

def _user_texts(entry) -> list[str]:
    """User-written text in one transcript entry: Claude Code's
    {"type": "user", "message": {...}}, Codex's {"type": "response_item",
    "payload": {"type": "message", "role": "user", ...}}, Gemini's
    {"type": "user", "content": ...}; content a string or text parts."""
    if not isinstance(entry, dict):
        return []
    msg = next((entry[k] for k in ("message", "payload") if isinstance(entry.get(k), dict)),
               entry)
    if (msg.get("role") or entry.get("role") or entry.get("type")) != "user" or \
            msg.get("type") not in (None, "message", "user"):
        return []
    content = msg.get("content", msg.get("parts"))
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):   # tool results are not the user's words
        return ["\n".join(b.get("text", "") for b in content if isinstance(b, dict)
                          and b.get("type", "text") in ("text", "input_text")
                          and isinstance(b.get("text"), str))]
    return []


def task_from_transcript(path: str | None) -> str | None:
    """The user's latest words: the last few user messages, bounded."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TRANSCRIPT_TAIL))
            tail = f.read()
    except OSError:
        return None
    lines = [x for x in tail.splitlines()[1 if size > TRANSCRIPT_TAIL else 0:] if x.strip()]
    docs: list = []
    for line in lines:               # JSON lines (Claude Code, Codex)
        try:
            docs.append(json.loads(line))
        except ValueError:
            docs = []
            break
    if not docs:                     # one pretty-printed JSON document (Gemini)
        try:
            docs = [json.loads(tail)]
        except ValueError:
            return None
    entries: list = []
    for d in docs:                   # a document holding the conversation: its messages
        inner = d.get("messages") if isinstance(d, dict) else d if isinstance(d, list) else None
        entries += inner if isinstance(inner, list) else [d]
    texts = [t.strip() for e in entries for t in _user_texts(e) if t.strip()]
    task = "\n".join(texts[-TASK_MESSAGES:])
    return task[-TASK_CHARS:] or None


# --- the wrapped command ---------------------------------------------------------------------

def caper_command() -> list[str]:
    """How the wrapped command calls caper: this executable when it is
    caper's console script, else this Python with -m caper."""
    exe = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(exe) == "caper" and os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-m", "caper"]


def wrap(command: str, session: str, task: str | None, ask: bool = False,
         shell: str = "bash") -> str:
    """The command as one call of caper run, with the shell the agent's tool
    would have run it with (caper run's own default is /bin/sh)."""
    argv = caper_command() + ["run", "--session", session, "--shell", shell]
    if ask:       # unsure: hold the run; the human decides at `caper commit`
        argv += ["--on-unsure", "ask"]
    if task:
        argv += ["--task", task]
    return shlex.join(argv + ["-c", command])


def caper_args(command: str) -> list[str] | None:
    """The arguments of `command` if it is exactly one call of this caper:
    one simple command (re-quoting it gives back the same bytes, so nothing
    can hide behind a `;` or `&&`) whose head is caper's own executable."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    head = caper_command()
    if shlex.join(argv) != command or argv[:len(head)] != head:
        return None
    return argv[len(head):]


def is_wrapped(command: str, session: str, shell: str = "bash") -> bool:
    """Exactly the form `wrap` produces for this session: nothing after -c X."""
    rest = caper_args(command)
    if rest is None or rest[:3] != ["run", "--session", session] or rest[3:5] != ["--shell", shell]:
        return False
    rest = rest[5:]
    if rest[:2] == ["--on-unsure", "ask"]:
        rest = rest[2:]
    if rest[:1] == ["--task"]:
        rest = rest[2:]
    return len(rest) == 2 and rest[0] == "-c"


# --- answers ---------------------------------------------------------------------------------

def _out(agent: Agent, decision: str, reason: str, command: str | None = None,
         tool_input: dict | None = None) -> str:
    if agent.name == "gemini":
        doc: dict = {"decision": decision, "reason": reason}
        if command is not None:
            doc["hookSpecificOutput"] = {"hookEventName": "BeforeTool",
                                         "tool_input": {**(tool_input or {}), "command": command}}
        return json.dumps(doc)
    out = {"hookEventName": "PreToolUse", "permissionDecision": decision,
           "permissionDecisionReason": reason}
    if command is not None:          # Claude Code only: Codex takes no updatedInput
        updated = {**(tool_input or {}), "command": command}
        updated.pop("run_in_background", None)   # held output needs the run to finish
        out["updatedInput"] = updated
    return json.dumps({"hookSpecificOutput": out})


def answer(agent: Agent, hook) -> str:
    """The hook's answer (JSON text, or "" to let the call through) for one input."""
    if not isinstance(hook, dict):
        raise ValueError("the hook input is not a JSON object")
    if hook.get("tool_name") != agent.tool:
        raise ValueError(f"caper gates the {agent.tool} tool, got {hook.get('tool_name')!r}")
    tool_input = hook.get("tool_input")
    if not isinstance(tool_input, dict) or not isinstance(tool_input.get("command"), str):
        raise ValueError("tool_input.command is missing or not a string")
    command = tool_input["command"]
    if not command.strip() or "\0" in command:
        raise ValueError("the command is empty or holds a NUL byte")
    session = hook.get("session_id")
    if not isinstance(session, str) or not session or len(session) > 200 or \
            any(ord(ch) < 32 for ch in session):
        raise ValueError("session_id is missing or malformed")
    if is_wrapped(command, session, agent.shell):
        # Already inside the gate: it runs once, there.
        return "" if agent.mode == "resubmit" else _out(
            agent, "allow", "caper: already runs inside caper")
    held = held_commit(command)
    if held is not None:
        return ask_human(agent, held)
    path = hook.get("transcript_path")
    wrapped = wrap(command, session, task_from_transcript(path if isinstance(path, str) else None),
                   ask=agent.can_ask, shell=agent.shell)
    if agent.mode == "resubmit":
        return _out(agent, "deny", "caper gates shell commands: run exactly this instead (it runs "
                                   "the command once in a sandbox and keeps its effects only if "
                                   f"they are approved):\n{wrapped}")
    return _out(agent, "allow", "caper: the command runs once in a sandbox and counts only if "
                                "its effects are approved", wrapped, tool_input)


def held_commit(command: str) -> str | None:
    """The id in exactly `<caper> commit <id>`, else None."""
    rest = caper_args(command)
    if rest is not None and len(rest) == 2 and rest[0] == "commit" and _HELD_ID.fullmatch(rest[1]):
        return rest[1]
    return None


def ask_human(agent: Agent, run_id: str) -> str:
    """Applying a held run is the human's call, never the agent's: the host's
    permission prompt shows them the effect card; a host that cannot ask is
    told to leave it to the user."""
    if not agent.can_ask:
        return _out(agent, "deny", f"only the user may apply a run caper held for them: ask "
                                   f"them to run `caper commit {run_id}` in a terminal")
    from caper.state import default_state_dir
    try:
        with open(os.path.join(default_state_dir(), "pending", run_id + ".json")) as f:
            held = json.load(f)
        card, reason = str(held["card"]), str(held["reason"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return _out(agent, "deny", f"no held run {run_id} to apply ({e})")
    text = (f"caper ran this command in a sandbox and held the result for you: {reason}\n\n"
            f"{card[:6000]}\nApply these effects to your files?")
    return _out(agent, "ask", text)


def hook_main(agent_name: str, stdin=None, stdout=None) -> int:
    agent = AGENTS[agent_name]
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    try:
        raw = stdin.read(MAX_INPUT + 1)
        if len(raw) > MAX_INPUT:
            raise ValueError(f"the hook input is over {MAX_INPUT} bytes")
        text = answer(agent, json.loads(raw))
    except Exception as e:   # fail closed: deny, never crash (a crash runs it ungated)
        text = _out(agent, "deny", f"caper's hook could not gate this command ({e}); "
                                   "it was not run")
    if text:
        stdout.write(text + "\n")
        stdout.flush()
    return 0


# --- install / uninstall -------------------------------------------------------------------

def settings_path(agent: Agent, scope: str, cwd: str | None = None) -> str:
    if scope == "user":
        return os.path.join(os.path.expanduser("~"), agent.user_file)
    return os.path.join(cwd or os.getcwd(), agent.project_file)


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); not touching it") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{path} does not hold a JSON object; not touching it")
    return doc


def _save(path: str, doc: dict) -> None:
    from caper.journal import write_atomic
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # The user's own settings file: the usual mode (umask), and a temporary
    # name no file of theirs is likely to have.
    write_atomic(path, (json.dumps(doc, indent=2) + "\n").encode(), mode=0o666,
                 tmp=f"{path}.caper-{os.getpid()}")


def _ours(h, agent: Agent) -> bool:
    return isinstance(h, dict) and str(h.get("command", "")).find(MARK + agent.name) >= 0


def _without_caper(groups: list, agent: Agent) -> list:
    out = []
    for g in groups:
        if isinstance(g, dict) and isinstance(g.get("hooks"), list):
            kept = [h for h in g["hooks"] if not _ours(h, agent)]
            if kept or not g["hooks"]:
                out.append({**g, "hooks": kept})
        else:
            out.append(g)
    return out


def _event_list(doc: dict, agent: Agent, path: str) -> tuple[dict, list]:
    hooks = doc.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise ValueError(f"{path}: 'hooks' is not an object; not touching it")
    groups = hooks.get(agent.event, [])
    if not isinstance(groups, list):
        raise ValueError(f"{path}: 'hooks.{agent.event}' is not a list; not touching it")
    return hooks, groups


def hook_command(agent: Agent) -> str:
    # `|| exit 2`: if caper cannot even start (Python broken, caper removed),
    # exit 2 makes the agent block the call; another status would let it run.
    return shlex.join(caper_command() + ["hook", agent.name]) + " || exit 2"


def install(agent_name: str, scope: str, cwd: str | None = None) -> str:
    agent = AGENTS[agent_name]
    path = settings_path(agent, scope, cwd)
    doc = _load(path)
    hooks, groups = _event_list(doc, agent, path)
    hooks[agent.event] = _without_caper(groups, agent) + [
        {"matcher": agent.tool, "hooks": [{"type": "command", "command": hook_command(agent),
                                           "timeout": agent.timeout}]}]
    _save(path, doc)
    return path


def uninstall(agent_name: str, scope: str, cwd: str | None = None) -> str:
    agent = AGENTS[agent_name]
    path = settings_path(agent, scope, cwd)
    doc = _load(path)
    if not doc:
        return path
    hooks, groups = _event_list(doc, agent, path)
    kept = _without_caper(groups, agent)
    if kept:
        hooks[agent.event] = kept
    else:
        hooks.pop(agent.event, None)
    if not hooks:
        del doc["hooks"]
    _save(path, doc)
    return path
