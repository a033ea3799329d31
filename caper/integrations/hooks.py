"""Agent hooks: Claude Code, Codex CLI and Gemini CLI, and their installers.

    caper hook claude-code|codex|gemini      (reads the agent's hook JSON on stdin)
    caper install claude-code|codex|gemini [--project | --user]
    caper uninstall claude-code|codex|gemini [--project | --user]

A hook never runs the command. Its job is that the command runs exactly once,
inside `caper run --session <session> --call <id> -c <command>`, so the agent
sees the held output when the effects are approved, or the effect card and
the block reason (exit status 125) when they are not. The task the run is
judged against never travels in that command (the agent could edit it):
the hook records it in caper's state directory under the call's id
(caper.tasks), from the user's prompt as the agent's prompt event recorded
it (UserPromptSubmit, BeforeAgent: the same hook, installed for both
events), else from the transcript (caper.integrations.transcripts).

- Claude Code (PreToolUse, Bash) and Gemini CLI (BeforeTool,
  run_shell_command) let a hook rewrite the call: the hook answers allow with
  the wrapped command (`updatedInput`, `hookSpecificOutput.tool_input`). They
  never show the hook its own rewrite, so every command they submit is
  wrapped, a hand-made `caper run --call` included (it then runs inside the
  sandbox, where caper cannot run).
- Codex CLI's PreToolUse can only block (its parser treats `updatedInput`,
  `ask` and even `additionalContext` as failures, and a failed hook lets the
  call run). So the hook denies the raw command with the wrapped one in the
  reason, and lets through exactly that wrapped command, byte for byte, when
  the model resubmits it and its call record names this session and this
  command: one more model turn per command, same guarantee.

Any failure of the hook itself answers deny: a hook that crashed or exited
with another status would let the call run ungated (the installed command
also ends in `|| exit 2`, which all three treat as a block).

Input and output shapes, from each agent's reference: Claude Code
https://docs.anthropic.com/en/docs/claude-code/hooks ; Codex
codex-rs/hooks/schema/generated/pre-tool-use.command.{input,output}.schema.json
and codex-rs/hooks/src/events/pre_tool_use.rs in openai/codex ; Gemini CLI
docs/hooks/reference.md in google-gemini/gemini-cli; the prompt events:
codex-rs/hooks/src/events/user_prompt_submit.rs (Codex: `prompt`, and
`agent_id` for a sub-agent's), Gemini CLI's BeforeAgent `prompt`.

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
    prompt_event: str          # the event that shows the hook what the user typed
    can_ask: bool = False      # the host can put a question to its human


AGENTS = {
    "claude-code": Agent("claude-code", "PreToolUse", "Bash", ".claude/settings.json",
                         ".claude/settings.json", 30, "rewrite", "UserPromptSubmit", can_ask=True),
    "codex": Agent("codex", "PreToolUse", "Bash", ".codex/hooks.json", ".codex/hooks.json", 30,
                   "resubmit", "UserPromptSubmit"),
    "gemini": Agent("gemini", "BeforeTool", "run_shell_command", ".gemini/settings.json",
                    ".gemini/settings.json", 30000, "rewrite", "BeforeAgent"),   # Gemini: ms
}


# --- the wrapped command ---------------------------------------------------------------------

def caper_command() -> list[str]:
    """How the wrapped command calls caper: this executable when it is
    caper's console script, else this Python with -P -m caper (-P: the cwd,
    a workspace that may ship its own caper/, is not put on sys.path)."""
    exe = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(exe) == "caper" and os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-P", "-m", "caper"]


def wrap(command: str, session: str, call: str, ask: bool = False) -> str:
    argv = caper_command() + ["run", "--session", session]
    if ask:       # unsure: hold the run; the human decides at `caper commit`
        argv += ["--on-unsure", "ask"]
    return shlex.join(argv + ["--call", call, "-c", command])


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


def is_wrapped(command: str, session: str, state: str) -> bool:
    """Exactly the form `wrap` produces for this session, naming a call
    record made for this session and exactly this command."""
    from caper.tasks import TaskRecordError, check_call
    rest = caper_args(command)
    if rest is None or rest[:3] != ["run", "--session", session]:
        return False
    rest = rest[3:]
    if rest[:2] == ["--on-unsure", "ask"]:
        rest = rest[2:]
    if len(rest) != 4 or rest[0] != "--call" or rest[2] != "-c":
        return False
    try:
        check_call(state, rest[1], session, rest[3])
    except TaskRecordError:
        return False
    return True


def call_task(hook: dict, session: str, state: str) -> tuple[str | None, str]:
    """The task for a gated call, and where it came from: the prompts the
    agent's prompt event recorded, else the transcript, else none."""
    from caper.integrations.transcripts import task_from_transcript
    from caper.tasks import recorded_task
    task = recorded_task(state, session)
    if task:
        return task, "prompt-event"
    path = hook.get("transcript_path")
    task = task_from_transcript(path if isinstance(path, str) else None)
    return task, "transcript" if task else "none"


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
    if hook.get("hook_event_name") == agent.prompt_event:
        return prompt_answer(agent, hook)
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
    from caper.state import state_dir
    from caper.tasks import new_call
    state = state_dir()
    if agent.mode == "resubmit" and is_wrapped(command, session, state):
        return ""                     # the wrapped command the hook asked for: it runs once
    held = held_commit(command)
    if held is not None:
        return ask_human(agent, held, state)
    task, source = call_task(hook, session, state)
    wrapped = wrap(command, session, new_call(state, session, command, task, source),
                   ask=agent.can_ask)
    if agent.mode == "resubmit":
        return _out(agent, "deny", "caper gates shell commands: run exactly this instead (it runs "
                                   "the command once in a sandbox and keeps its effects only if "
                                   f"they are approved):\n{wrapped}")
    return _out(agent, "allow", "caper: the command runs once in a sandbox and counts only if "
                                "its effects are approved", wrapped, tool_input)


def prompt_answer(agent: Agent, hook: dict) -> str:
    """The agent's prompt event: record what the human typed (a sub-agent's
    prompt is the agent's words, not the user's) and let it through."""
    from caper.state import state_dir
    from caper.tasks import record_prompt
    session, prompt = hook.get("session_id"), hook.get("prompt")
    if isinstance(session, str) and session and len(session) <= 200 and \
            isinstance(prompt, str) and not hook.get("agent_id"):
        try:
            record_prompt(state_dir(), session, prompt)
        except Exception:   # never block the user's prompt: the calls fall back to the
            pass            # transcript, and to the strictest case without one
    return ""


def held_commit(command: str) -> str | None:
    """The id in exactly `<caper> commit <id>`, else None."""
    rest = caper_args(command)
    if rest is not None and len(rest) == 2 and rest[0] == "commit" and _HELD_ID.fullmatch(rest[1]):
        return rest[1]
    return None


def ask_human(agent: Agent, run_id: str, state: str) -> str:
    """Applying a held run is the human's call, never the agent's: the host's
    permission prompt shows them the effect card; a host that cannot ask is
    told to leave it to the user. Every run-derived string in the prompt is
    escaped: a file name cannot add a line of its own."""
    from caper.display import escape
    from caper.errors import ConfigError
    from caper.pending import load
    if not agent.can_ask:
        return _out(agent, "deny", f"only the user may apply a run caper held for them: ask "
                                   f"them to run `caper commit {run_id}` in a terminal")
    try:
        held = load(state, run_id)
    except ConfigError as e:
        return _out(agent, "deny", f"no held run {run_id} to apply ({escape(str(e))})")
    text = (f"caper ran this command in a sandbox and held the result for you: "
            f"{escape(held.reason)}\n\n{escape(held.card[:6000], keep_lines=True)}\n"
            "Apply these effects to your files?")
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
        from caper.display import escape
        text = _out(agent, "deny", f"caper's hook could not gate this command "
                                   f"({escape(str(e))}); it was not run")
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


def _event_list(doc: dict, event: str, path: str) -> tuple[dict, list]:
    hooks = doc.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise ValueError(f"{path}: 'hooks' is not an object; not touching it")
    groups = hooks.get(event, [])
    if not isinstance(groups, list):
        raise ValueError(f"{path}: 'hooks.{event}' is not a list; not touching it")
    return hooks, groups


def hook_command(agent: Agent) -> str:
    # `|| exit 2`: if caper cannot even start (Python broken, caper removed),
    # exit 2 makes the agent block the call; another status would let it run.
    return shlex.join(caper_command() + ["hook", agent.name]) + " || exit 2"


def install(agent_name: str, scope: str, cwd: str | None = None) -> str:
    """The hook, for the shell tool's event and for the prompt event (which
    records what the user typed, see caper.tasks)."""
    agent = AGENTS[agent_name]
    path = settings_path(agent, scope, cwd)
    doc = _load(path)
    entry = {"type": "command", "command": hook_command(agent), "timeout": agent.timeout}
    for event, group in ((agent.event, {"matcher": agent.tool, "hooks": [entry]}),
                         (agent.prompt_event, {"hooks": [entry]})):
        hooks, groups = _event_list(doc, event, path)
        hooks[event] = _without_caper(groups, agent) + [group]
    _save(path, doc)
    return path


def uninstall(agent_name: str, scope: str, cwd: str | None = None) -> str:
    agent = AGENTS[agent_name]
    path = settings_path(agent, scope, cwd)
    doc = _load(path)
    if not doc:
        return path
    for event in (agent.event, agent.prompt_event):
        hooks, groups = _event_list(doc, event, path)
        kept = _without_caper(groups, agent)
        if kept:
            hooks[event] = kept
        else:
            hooks.pop(event, None)
    if not doc["hooks"]:
        del doc["hooks"]
    _save(path, doc)
    return path
