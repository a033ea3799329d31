"""Agent hooks: Claude Code, Codex CLI and Gemini CLI, and their installers.

    caper hook claude-code|codex|gemini      (reads the agent's hook JSON on stdin)
    caper install claude-code|codex|gemini [--project | --user]
    caper uninstall claude-code|codex|gemini [--project | --user]

A hook never runs the command. Its job is that the command runs exactly once,
inside `caper run --session <session> --shell bash --call <id> -c <command>`, so the agent
sees the held output when the effects are approved, or the effect card and
the block reason (exit status 125) when they are not. The task the run is
judged against never travels in that command (the agent could edit it):
the hook records it in caper's state directory under the call's id
(caper.front.tasks), from the user's prompt as the agent's prompt event recorded
it (UserPromptSubmit, BeforeAgent: the same hook, installed for both
events), else from the transcript (caper.front.transcripts).

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

from caper.front import claude_rules
from caper.launch import caper_command

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
    default_scope: str         # where `caper install` puts it: the one the agent cannot skip
    can_ask: bool = False      # the host can put a question to its human
    per_second: int = 1        # timeout units per second
    shell: str = "bash"        # what its shell tool runs the command with (Claude Code's
                               # Bash tool, Codex's bash -lc, Gemini's bash -c)
    project_env: str | None = None   # the variable that names the session's project to its
                                     # hooks (else the hook input's cwd)
    file_tools: tuple[str, ...] = ()  # its own tools that read or write files by path
    writing_tools: tuple[str, ...] = ()  # ... of them, the ones that write
    turn_tools: tuple[str, ...] = ()  # its tools whose text it later submits as a prompt
    starting_tools: tuple[str, ...] = ()  # its tools that start a skill or a sub-agent


# Default scopes: Codex runs a project's hooks only in a project it trusts,
# and Gemini's --skip-trust (which its own error message suggests) loads no
# project hooks at all; user-level hooks fire in both.
AGENTS = {
    "claude-code": Agent("claude-code", "PreToolUse", "Bash", ".claude/settings.json",
                         ".claude/settings.json", 30, "rewrite", "UserPromptSubmit", "project",
                         can_ask=True, project_env="CLAUDE_PROJECT_DIR",
                         file_tools=("Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "Glob",
                                     "Grep", "LS"),
                         writing_tools=("Write", "Edit", "MultiEdit", "NotebookEdit"),
                         turn_tools=("CronCreate", "ScheduleWakeup", "RemoteTrigger"),
                         starting_tools=("Skill", "Agent", "Task")),
    "codex": Agent("codex", "PreToolUse", "Bash", ".codex/hooks.json", ".codex/hooks.json", 30,
                   "resubmit", "UserPromptSubmit", "user", file_tools=("apply_patch",),
                   writing_tools=("apply_patch",)),
    "gemini": Agent("gemini", "BeforeTool", "run_shell_command", ".gemini/settings.json",
                    ".gemini/settings.json", 30000, "rewrite", "BeforeAgent", "user",
                    per_second=1000, project_env="GEMINI_PROJECT_DIR",
                    file_tools=("read_file", "write_file", "replace", "read_many_files",
                                "list_directory", "glob", "grep_search"),
                    writing_tools=("write_file", "replace")),
}


# --- the wrapped command ---------------------------------------------------------------------

def wrap(command: str, session: str, call: str, ask: bool = False,
         timeout: float | None = None, shell: str = "bash") -> str:
    """The command as caper runs it. The task is not in it: `--call` names
    the record the hook wrote (caper.front.tasks), which holds the task the user
    gave and exactly this command. --brief: the model sees the command's own
    output when it is approved, and the reason and the effect card when not.
    The shell is the one the agent's tool would have run it with (caper
    run's own default is /bin/sh)."""
    argv = caper_command() + ["run", "--session", session, "--shell", shell, "--brief"]
    if ask:       # unsure: hold the run; the human decides at `caper commit`
        argv += ["--on-unsure", "ask"]
    if timeout is not None:
        argv += ["--timeout", f"{timeout:g}"]
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


def is_wrapped(command: str, session: str, state: str, shell: str = "bash") -> str | None:
    """The inner command if `command` is, byte for byte, the wrapped command
    the hook recorded for one of this session's calls (it names the call),
    else None: a flag the model added (`--on-unsure ask`, a `--timeout`)
    makes it another command."""
    from caper.front.tasks import TaskRecordError, check_call
    rest = caper_args(command)
    if rest is None or rest[:6] != ["run", "--session", session, "--shell", shell, "--brief"]:
        return None
    rest = rest[6:]
    if rest[:2] == ["--on-unsure", "ask"]:
        rest = rest[2:]
    if rest[:1] == ["--timeout"] and len(rest) > 1 and re.fullmatch(r"[0-9.]+", rest[1]):
        rest = rest[2:]
    if len(rest) != 4 or rest[0] != "--call" or rest[2] != "-c":
        return None
    try:
        check_call(state, rest[1], session, rest[3], wrapped=command)
    except TaskRecordError:
        return None
    return rest[3]


def call_task(hook: dict, session: str, state: str,
              project: str | None) -> tuple[str | None, str, str | None]:
    """The task for a gated call, where it came from, and the project it
    was given for: the prompts the agent's prompt event recorded (with the
    session's project), else (no record at all) the transcript (with
    `project`, the one this call's hook input names), else none. A record
    caper did not make is none: the strictest case."""
    from caper.front.transcripts import task_from_transcript
    from caper.front.tasks import TaskRecordError, recorded_task
    try:
        recorded, task, recorded_project = recorded_task(state, session)
    except TaskRecordError:
        return None, "none", None
    if recorded:
        return task, "prompt-event" if task else "none", recorded_project
    path = hook.get("transcript_path")
    task = task_from_transcript(path if isinstance(path, str) else None)
    return task, "transcript" if task else "none", project


# --- answers ---------------------------------------------------------------------------------

CODEX_REWRITES_FROM = (0, 171, 0)   # measured: Codex 0.171.0 runs an allow's updatedInput


def codex_version(env=None) -> tuple[int, ...] | None:
    """The running Codex's version, from its npm launcher's package (the
    launcher puts CODEX_MANAGED_PACKAGE_ROOT in every hook's environment)."""
    root = (os.environ if env is None else env).get("CODEX_MANAGED_PACKAGE_ROOT")
    try:
        with open(os.path.join(root, "package.json")) as f:
            version = json.load(f)["version"]
        return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", version).groups())
    except (TypeError, OSError, ValueError, KeyError, AttributeError):
        return None


def mode(agent: Agent, env=None) -> str:
    """rewrite | resubmit. An older Codex treats updatedInput as a failed
    hook and runs the call ungated, so it is used only when the running
    Codex is known to take it."""
    if agent.name == "codex":
        v = codex_version(env)
        return "rewrite" if v is not None and v >= CODEX_REWRITES_FROM else agent.mode
    return agent.mode


def _out(agent: Agent, decision: str, reason: str, command: str | None = None,
         tool_input: dict | None = None, tell_user: str | None = None) -> str:
    """tell_user: shown to the human whatever the mode (Claude Code's and
    Gemini's systemMessage), for what the agent alone would hide from them."""
    if agent.name == "gemini":
        doc: dict = {"decision": decision, "reason": reason}
        if command is not None:
            doc["hookSpecificOutput"] = {"hookEventName": "BeforeTool",
                                         "tool_input": {**(tool_input or {}), "command": command}}
        if tell_user:
            doc["systemMessage"] = tell_user
        return json.dumps(doc)
    out = {"hookEventName": "PreToolUse", "permissionDecision": decision,
           "permissionDecisionReason": reason}
    if command is not None:          # Claude Code, and Codex from CODEX_REWRITES_FROM on
        updated = {**(tool_input or {}), "command": command}
        updated.pop("run_in_background", None)   # held output needs the run to finish
        out["updatedInput"] = updated
    doc = {"hookSpecificOutput": out}
    if tell_user and agent.name == "claude-code":
        doc["systemMessage"] = tell_user
    return json.dumps(doc)


# Claude Code's Bash tool: its default and largest timeouts (ms), and the
# environment variables that change them
# (https://docs.anthropic.com/en/docs/claude-code/settings#environment-variables).
# When its timeout expires it moves the command to the background and the
# model never sees caper's verdict, so the rewritten call gets a timeout that
# covers the command's own (caper --timeout) plus caper's work after it.
BASH_DEFAULT_MS, BASH_MAX_MS = 120_000, 600_000
CAPER_AFTER_MS = 60_000        # report, approver (the LLM's own timeout is 20 s), commit


def claude_timeouts(tool_input: dict, env=None) -> tuple[float, int]:
    """(caper's --timeout in s, the Bash tool's timeout in ms) for one call."""
    env = os.environ if env is None else env

    def ms(value, default: int) -> int:
        try:
            return max(1, int(value))
        except (TypeError, ValueError):
            return default
    largest = ms(env.get("BASH_MAX_TIMEOUT_MS"), BASH_MAX_MS)
    asked = ms(tool_input.get("timeout"), ms(env.get("BASH_DEFAULT_TIMEOUT_MS"), BASH_DEFAULT_MS))
    command_ms = max(1000, min(asked, largest - CAPER_AFTER_MS))
    return command_ms / 1000, min(largest, command_ms + CAPER_AFTER_MS)


def project_dir(agent: Agent, hook: dict, env=None) -> str:
    """The session's project directory: where the agent was started, as it
    tells its hooks (CLAUDE_PROJECT_DIR, GEMINI_PROJECT_DIR), else the hook
    input's cwd (Codex's is the session's, not a call's `workdir`)."""
    d = agent.project_env and (os.environ if env is None else env).get(agent.project_env) \
        or hook.get("cwd")
    if not isinstance(d, str) or not os.path.isabs(d):
        raise ValueError(f"no absolute project directory ({agent.project_env or 'cwd'})")
    return d


def session_project(agent: Agent, hook: dict, env=None) -> str | None:
    """The workspace of the session's project directory (caper.front.tasks:
    a task holds only there); None if the agent did not say."""
    from caper.front.tasks import project_of
    try:
        return project_of(project_dir(agent, hook, env))
    except ValueError:
        return None


# Claude Code's permission modes whose "ask" puts the question to the human.
# Others (bypassPermissions, auto, dontAsk, and any unknown or missing) may
# treat a hook's ask as an allow (anthropics/claude-code#89561, #77212).
ASKING_MODES = {"default", "acceptEdits", "plan"}


def can_ask(agent: Agent, hook: dict) -> bool:
    """Whether a hook's "ask" reaches the human in this session."""
    return agent.can_ask and (agent.name != "claude-code" or
                              hook.get("permission_mode") in ASKING_MODES)


def answer(agent: Agent, hook, env=None, state: str | None = None,
           client: int | None = None) -> str:
    """The hook's answer (JSON text, or "" to let the call through) for one
    input. env: the hook process's environment (default: this one's); state:
    the state directory (default: the one env names); client: the hook
    process, whose ancestor is the agent (default: this one)."""
    if not isinstance(hook, dict):
        raise ValueError("the hook input is not a JSON object")
    if hook.get("hook_event_name") == agent.prompt_event:
        return prompt_answer(agent, hook, state, env)
    if hook.get("tool_name") in agent.file_tools:
        return file_tool_answer(agent, hook, env, state)
    if hook.get("tool_name") in agent.starting_tools:
        return starting_answer(agent, hook, env)
    if hook.get("tool_name") in agent.turn_tools:
        # The prompt it schedules reaches the prompt event later with nothing
        # that tells it from the user's (round 6): the agent would write the
        # task its commands are judged against.
        return _out(agent, "deny", f"caper: {hook.get('tool_name')} is not allowed: the prompt "
                    "it schedules would reach caper as the user's own words")
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
    from caper.front.tasks import new_call
    state = state or state_dir()
    inner = is_wrapped(command, session, state, agent.shell)
    if inner is not None and mode(agent, env) == "resubmit":
        return ""        # the wrapped command the hook asked for: it runs once, there
    held = held_commit(command)
    if held is not None:
        return ask_human(agent, held, state, can_ask(agent, hook))
    # Claude Code checks its own rules against the rewritten command, where
    # they no longer match: the hook applies them to the model's command.
    rule = claude_rules.verdict(inner or command, project_dir(agent, hook, env), env,
                                claude_rules.Launch.of_ancestor(client)) \
        if agent.name == "claude-code" else None
    if rule is not None and (rule[0] == "deny" or not can_ask(agent, hook)):
        return _out(agent, "deny", f"caper: not run: {rule[1]} ({rule[0]}"
                                   + ("" if rule[0] == "deny" else ": this session's permission "
                                      "mode does not ask the user") + ")")
    decision, why = ("ask", f"caper: {rule[1]} (ask); the command then runs once in caper's "
                            "sandbox") if rule else \
        ("allow", "caper: the command runs once in a sandbox and counts only if its effects "
                  "are approved")
    if inner is not None:            # already inside the gate: it runs once, there
        return _out(agent, decision, why, command, tool_input)
    task, source, project = call_task(hook, session, state, session_project(agent, hook, env))
    caper_s, tool_ms = claude_timeouts(tool_input, env) if agent.name == "claude-code" \
        else (None, None)
    def wrapped_of(call: str) -> str:
        return wrap(command, session, call, ask=can_ask(agent, hook), timeout=caper_s,
                    shell=agent.shell)
    wrapped = wrapped_of(new_call(state, session, command, task, source, project, wrapped_of))
    if agent.name == "claude-code":
        return _out(agent, decision, why, wrapped, {**tool_input, "timeout": tool_ms})
    if mode(agent, env) == "resubmit":
        return _out(agent, "deny", "caper gates shell commands: run exactly this instead (it runs "
                                   "the command once in a sandbox and keeps its effects only if "
                                   f"they are approved):\n{wrapped}")
    return _out(agent, decision, why, wrapped, tool_input)


# A turn the agent starts by itself opens with a tag of Claude Code's: a
# background task's end (<task-notification>, round 6), a sub-agent's or a
# teammate's message (<agent-message from=...>, <teammate-message>, round 7),
# another session's. Its text is an agent's, not the user's: any prompt that
# opens with a tag is taken for one, but a slash command the user typed.
SELF_STARTED = re.compile(r"\s*<(?!command-(?:message|name|args)>)[A-Za-z][\w.:-]*[\s/>]")


def prompt_answer(agent: Agent, hook: dict, state: str | None = None, env=None) -> str:
    """The agent's prompt event: record what the human typed (a sub-agent's
    prompt is the agent's words, not the user's), in which project, and let
    it through."""
    from caper.state import state_dir
    from caper.front.tasks import record_prompt
    session, prompt = hook.get("session_id"), hook.get("prompt")
    if isinstance(session, str) and session and len(session) <= 200 and \
            isinstance(prompt, str) and not hook.get("agent_id") and \
            not SELF_STARTED.match(prompt):
        try:
            record_prompt(state or state_dir(), session, prompt,
                          session_project(agent, hook, env))
        except Exception:   # never block the user's prompt: the calls fall back to the
            pass            # transcript, and to the strictest case without one
    return ""


# --- the agent's own file tools: never on caper's state directory ----------------------------
# Its records (the task, calls, held runs, journals) are MAC'd under a key
# kept there: a tool that can read it could forge them, one that can write
# there could replace what caper trusts (caper.state.record_key). The agent's
# shell never sees the state directory (the sandbox hides it); its file tools
# run in the agent's own process, so the hook keeps them out.

PATH_KEYS = {"file_path", "notebook_path", "path", "dir_path", "absolute_path", "include",
             "paths", "file_paths"}
_PATCH_PATH = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+)$", re.M)
_GLOB = re.compile(r"[*?\[{]")


def tool_paths(tool_input: dict) -> list[str]:
    """The paths a file tool's input names, as given: path-named fields (a
    string or a list of them), a pattern that is absolute or starts at ~, and
    the files of an apply_patch patch in any string field."""
    out: list[str] = []
    for key, value in tool_input.items():
        values = value if isinstance(value, list) else [value]
        strings = [v for v in values if isinstance(v, str)]
        if key in PATH_KEYS:
            out += strings
        elif key == "pattern":
            out += [v for v in strings if v.startswith(("/", "~"))]
        for v in strings:
            out += [m.strip() for m in _PATCH_PATH.findall(v)]
    return out


def resolved(path: str, cwd: str, home: str | None) -> str:
    """path as the tool would reach it: ~ as the agent's home, relative to
    the tool's cwd, up to its first glob character, symlinks and .. resolved."""
    if home and (path == "~" or path.startswith("~/")):
        path = home + path[1:]
    m = _GLOB.search(path)
    if m:
        path = os.path.dirname(path[:m.start()]) or "."
    return os.path.realpath(os.path.join(cwd, path))


def file_matcher(agent: Agent) -> str:
    """The matcher of the file tools' entry: Gemini CLI matches a regular
    expression anywhere in the name (anchored, so that an MCP tool called
    `x_read_file` is not caught and denied as an unknown tool); Claude Code
    and Codex take `A|B` as the exact names."""
    names = "|".join(agent.file_tools + agent.turn_tools + agent.starting_tools)
    return f"^({names})$" if agent.name == "gemini" else names


def file_tool_answer(agent: Agent, hook: dict, env=None, state: str | None = None) -> str:
    """Deny a file tool whose path is in a state directory of caper's, or
    above one (a search or a listing from there reaches into it); say
    nothing otherwise (the agent's own permission flow goes on). A tool that
    names no path acts from its cwd."""
    from caper.state import known_state_dirs, state_dir
    tool_input = hook.get("tool_input")
    if not isinstance(tool_input, dict):
        raise ValueError("tool_input is missing or not an object")
    cwd = hook.get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        cwd = project_dir(agent, hook, env)
    env = os.environ if env is None else env
    from caper.display import escape
    guarded = {os.path.realpath(d) for d in [state or state_dir()] + known_state_dirs(env)}
    writes = hook.get("tool_name") in agent.writing_tools
    project = project_dir(agent, hook, env) if writes else ""
    for path in tool_paths(tool_input) or ["."]:
        where = resolved(path, cwd, env.get("HOME"))
        for d in guarded:
            if where == d or where.startswith(d + "/") or d.startswith(where.rstrip("/") + "/"):
                return _out(agent, "deny", f"caper: {hook.get('tool_name')} may not reach "
                                           f"caper's state directory ({escape(d)}, through "
                                           f"{escape(path)}): caper's records are kept there")
        if writes:
            why = agent_file(path, cwd, project, env)
            if why:
                return _out(agent, "deny", f"caper: {hook.get('tool_name')} may not write "
                                           f"{escape(path)}: {why}. If it should change, the "
                                           "user edits it; a shell command that does is judged "
                                           "by caper")
    return ""


def agent_file(path: str, cwd: str, project: str, env) -> str | None:
    """Why the agent's own tools may not write path, or None: the file
    configures an agent or caper (a setting can turn caper's hook off, a
    skill's hooks run on the host), or an agent's settings run it (env: the
    hook's environment, whose caper config is guarded too). Judged by
    the path as written and as resolved (a symlinked `.claude`)."""
    from caper.judge.agent_config import is_control_file, programs_run
    home = env.get("HOME")
    if home and (path == "~" or path.startswith("~/")):
        path = home + path[1:]
    places = {os.path.normpath(os.path.join(cwd, path)), resolved(path, cwd, home)}
    roots = {project, os.path.realpath(project)}
    if any(is_control_file(p, r, home) for p in places for r in roots):
        return "it configures an agent, caper or git (hooks, permissions, skills, MCP " \
               "servers, filters)"
    from caper.config import config_path
    own = {os.path.realpath(config_path(e)) for e in (env, os.environ)}
    if {os.path.realpath(p) for p in places} & own:
        return "it is caper's own configuration"
    run = {os.path.realpath(p) for r in roots for p in programs_run(r, home)}
    if places & run or {os.path.realpath(p) for p in places} & run:
        return "an agent's settings run it on the host, outside caper's sandbox"
    return None


def starting_answer(agent: Agent, hook: dict, env=None) -> str:
    """Deny starting a skill or a sub-agent whose definition declares hooks:
    the agent would run them on the host, for its next events, with no shell
    call a hook sees. Any other goes on through the agent's own permission
    flow."""
    from caper.display import escape
    from caper.judge import agent_config
    tool_input = hook.get("tool_input")
    if not isinstance(tool_input, dict):
        raise ValueError("tool_input is missing or not an object")
    name = tool_input.get("skill", tool_input.get("subagent_type"))
    if not isinstance(name, str) or not name:
        return ""          # the agent's own general-purpose sub-agent
    env = os.environ if env is None else env
    project = project_dir(agent, hook, env)
    try:
        hooked = agent_config.hooked_definitions(name, project, env.get("HOME"))
    except agent_config.TooManyFolders:
        return _out(agent, "deny", f"caper: {hook.get('tool_name')} {escape(name)} is not "
                                   f"allowed: the project has more than {agent_config.SEARCH_LIMIT} "
                                   "folders, too many to find the definitions that declare hooks")
    if hooked:
        return _out(agent, "deny", f"caper: {hook.get('tool_name')} {escape(name)} is not "
                                   f"allowed: {escape(hooked[0])} declares hooks, which "
                                   f"{agent.name} would run on the host, outside caper's "
                                   "sandbox. Do its steps as shell commands instead")
    return ""


def held_commit(command: str) -> str | None:
    """The id in `caper commit <id>`, whichever caper the model names (on
    PATH, by a path, `python -m caper`), and nothing else in the command."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if shlex.join(argv) != command.strip():
        return None
    if argv[:1] and re.fullmatch(r"python[0-9.]*", os.path.basename(argv[0])) and \
            argv[1:3] == ["-m", "caper"]:
        argv = argv[2:]
    if len(argv) == 3 and os.path.basename(argv[0]) == "caper" and argv[1] == "commit" and \
            _HELD_ID.fullmatch(argv[2]):
        return argv[2]
    return None


PROMPT_CARD_CHARS = 6000   # of the card in a host's permission prompt


def ask_human(agent: Agent, run_id: str, state: str, asks: bool) -> str:
    """Applying a held run is the human's call, never the agent's: the host's
    permission prompt shows them the effect card; a host that cannot ask is
    told to leave it to the user, and so is one whose session's permission
    mode does not ask (asks: False). Every run-derived string in the prompt is
    escaped: a file name cannot add a line of its own."""
    from caper.display import escape
    from caper.errors import ConfigError
    from caper.held import load
    yours = f"caper held run {run_id} for you: to apply it, run `caper commit {run_id}` in a " \
            f"terminal (`caper discard {run_id}` drops it)"
    if not asks:
        return _out(agent, "deny", f"only the user may apply a run caper held for them: ask "
                                   f"them to run `caper commit {run_id}` in a terminal",
                    tell_user=yours)
    try:
        held = load(state, run_id)
    except ConfigError as e:
        return _out(agent, "deny", f"no held run {run_id} to apply ({escape(str(e))})")
    card = escape(held.card, keep_lines=True)
    if len(card) > PROMPT_CARD_CHARS:
        cut = card.rfind("\n", 0, PROMPT_CARD_CHARS)
        cut = cut if cut > 0 else PROMPT_CARD_CHARS
        card = (card[:cut] + f"\n[the card goes on for {len(card) - cut} more characters, not "
                f"shown here: `caper commit {run_id}` in a terminal shows it whole]")
    text = (f"caper ran this command in a sandbox and held the result for you: "
            f"{escape(held.reason)}\n\n{card}\n"
            f"Apply these effects to your files? (Or later, in a terminal: "
            f"`caper commit {run_id}`.)")
    # Whatever caper the model named, this one applies it. In -p mode the
    # ask is a denial the user never sees: tell them.
    return _out(agent, "ask", text, shlex.join(caper_command() + ["commit", run_id]),
                {"description": f"apply caper's held run {run_id}"}, tell_user=yours)


def hook_text(agent: Agent, raw: bytes, env=None, state: str | None = None,
              client: int | None = None) -> str:
    """The hook's answer to its raw input, a deny for any failure (env,
    state, client: as answer's; the gate passes its native client's)."""
    try:
        if len(raw) > MAX_INPUT:
            raise ValueError(f"the hook input is over {MAX_INPUT} bytes")
        return answer(agent, json.loads(raw), env, state, client)
    except Exception as e:   # fail closed: deny, never crash (a crash runs it ungated)
        from caper.display import escape
        return _out(agent, "deny", f"caper's hook could not gate this command "
                                   f"({escape(str(e))}); it was not run")


def hook_main(agent_name: str, stdin=None, stdout=None, timeout_s: float | None = None) -> int:
    """timeout_s: the hook's timeout in the agent's settings. An agent whose
    hook times out runs the call ungated if anything else allows it
    (Claude Code records hook_cancelled), so the hook answers deny itself
    at half of it, whatever it was doing."""
    import signal
    agent = AGENTS[agent_name]
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    deadline = (timeout_s or agent.timeout / agent.per_second) / 2

    def too_late(signum, frame):
        stdout.write(_out(agent, "deny", f"caper's hook did not finish within {deadline:g} s; "
                                         "the command was not run") + "\n")
        stdout.flush()
        os._exit(0)
    signal.signal(signal.SIGALRM, too_late)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    text = hook_text(agent, stdin.read(MAX_INPUT + 1))
    signal.setitimer(signal.ITIMER_REAL, 0)
    if text:
        stdout.write(text + "\n")
        stdout.flush()
        if agent.name == "claude-code":
            tell_terminal(text)
    return 0


def tell_terminal(text: str, client: int | None = None) -> None:
    """Where Claude Code shows a hook's systemMessage nowhere (`claude -p`
    with text output), write it where Claude Code's own errors go, when that
    is a terminal (Claude Code starts hooks without one of their own).
    client: the hook process (default: this one)."""
    try:
        message = json.loads(text).get("systemMessage")
        launch = claude_rules.Launch.of_ancestor(client) if message else None
    except ValueError:
        return
    if launch is None or not launch.prints_text or launch.pid is None:
        return
    try:
        fd = os.open(f"/proc/{launch.pid}/fd/2", os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        if os.isatty(fd):           # a file or a pipe is not the user's eyes
            os.write(fd, f"caper: {message}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


# --- install / uninstall -------------------------------------------------------------------

def codex_home() -> str:
    return os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")


def settings_path(agent: Agent, scope: str, cwd: str | None = None) -> str:
    if scope == "user":
        if agent.name == "codex":       # Codex's user layer is $CODEX_HOME
            return os.path.join(codex_home(), "hooks.json")
        return os.path.join(os.path.expanduser("~"), agent.user_file)
    return os.path.abspath(os.path.join(cwd or os.getcwd(), agent.project_file))


def _load(path: str) -> dict:
    # Not through a symlink: a repository's .claude/settings.json may point at
    # a file of the user's that the merge would then copy into the project.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror} (a symlink is not followed); "
                         "not touching it") from e
    with os.fdopen(fd) as f:
        text = f.read()
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); not touching it") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{path} does not hold a JSON object; not touching it")
    return doc


def _save(path: str, doc: dict) -> None:
    from caper.commit.journal import write_atomic
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # The user's own settings file keeps its mode (0600 where it holds tokens);
    # a new one gets the usual (umask). A temporary name no file of theirs is
    # likely to have.
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666
    write_atomic(path, (json.dumps(doc, indent=2) + "\n").encode(), mode=mode,
                 tmp=f"{path}.caper-{os.getpid()}")


# Beside an agent's settings file: the settings caper's install added to it
# (by the file's name), for uninstall to take back. Not in the settings file
# (an agent may refuse keys it does not know) nor in caper's state (a
# different CAPER_STATE_DIR at uninstall would lose it).
ADDED = "caper-installed.json"


def _added_record(path: str) -> tuple[str, dict]:
    record = os.path.join(os.path.dirname(path), ADDED)
    try:
        doc = _load(record)
    except ValueError:
        doc = {}                            # unreadable: nothing is taken back
    return record, doc


def _note_added(path: str, key: str) -> None:
    record, doc = _added_record(path)
    keys = doc.setdefault(os.path.basename(path), [])
    if isinstance(keys, list) and key not in keys:
        keys.append(key)
        _save(record, doc)


def _take_added(path: str) -> list[str]:
    """The keys install added to path, forgotten as they are returned."""
    record, doc = _added_record(path)
    keys = doc.pop(os.path.basename(path), [])
    if not isinstance(keys, list):
        return []
    if doc:
        _save(record, doc)
    elif os.path.lexists(record):
        os.unlink(record)
    return [k for k in keys if isinstance(k, str)]


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


def hook_command(agent: Agent, timeout_s: float | None = None, gate: bool = True) -> str:
    """gate: the shell tool's hook. `|| exit 2`: if caper cannot even start
    (Python broken, caper removed), exit 2 makes the agent block the call;
    another status would let it run. The prompt event's hook has none: a
    caper that cannot start must not swallow what the user typed (its calls
    are blocked all the same)."""
    extra = ["--timeout", f"{timeout_s:g}"] if timeout_s is not None else []
    return shlex.join(caper_command() + ["hook", agent.name] + extra) + (" || exit 2" if gate else "")


# Claude Code runs a skill's or a command file's !`cmd` lines itself, on the
# host, with no tool call a hook sees (round 6): caper's install turns that
# off where the user has not decided otherwise.
SKILL_SHELL = "disableSkillShellExecution"


def _no_skill_shell(path: str, doc: dict) -> list[str]:
    if doc.get(SKILL_SHELL) is True:
        return []
    return [f"{path} sets {SKILL_SHELL} to {doc.get(SKILL_SHELL)!r}: Claude Code then runs the "
            "!`command` lines of skills and slash commands on the host, NOT through caper. "
            f"Set \"{SKILL_SHELL}\": true to close that."]


def install(agent_name: str, scope: str | None = None, cwd: str | None = None,
            timeout_s: float | None = None) -> tuple[str, list[str]]:
    """Merge caper's entries into the agent's settings, for the shell tool's
    event (the shell tool, and the agent's own file tools, kept out of
    caper's state directory) and for the prompt event (which records what
    the user typed, see caper.front.tasks), and make them active where the agent asks for more than
    the entry (Codex's hook trust): the settings file, and what the user must
    still do, loudly (empty if nothing). timeout_s: the hooks' timeout
    (default: the agent's entry's)."""
    agent = AGENTS[agent_name]
    scope = scope or agent.default_scope
    path = settings_path(agent, scope, cwd)
    doc = _load(path)
    timeout = agent.timeout if timeout_s is None else max(1, round(timeout_s * agent.per_second))
    def entry(gate: bool) -> dict:
        return {"type": "command", "command": hook_command(agent, timeout_s, gate),
                "timeout": timeout}
    mine: dict[str, list] = {agent.event: [{"matcher": agent.tool, "hooks": [entry(True)]},
                                           {"matcher": file_matcher(agent),
                                            "hooks": [entry(True)]}],
                             agent.prompt_event: [{"hooks": [entry(False)]}]}
    for event, groups_of_caper in mine.items():
        hooks, groups = _event_list(doc, event, path)
        hooks[event] = _without_caper(groups, agent) + groups_of_caper
    added = agent.name == "claude-code" and SKILL_SHELL not in doc
    if added:
        doc[SKILL_SHELL] = True
    _save(path, doc)
    if added:
        _note_added(path, SKILL_SHELL)
    todo: list[str] = []
    if agent.name == "claude-code":
        todo += _no_skill_shell(path, doc)
    if agent.name == "codex":
        todo += trust_codex_hook(path, doc, scope, cwd)
    elif agent.name == "gemini" and scope == "project":
        todo.append("Gemini CLI loads no project hooks when started with --skip-trust or in a "
                    "folder it does not trust: caper is then NOT in front of it. Install with "
                    "--user to cover every folder.")
    return path, todo


# --- Codex: a hook runs only once its hash is trusted --------------------------------------
# codex-rs/hooks/src/engine/discovery.rs (command_hook_hash) and
# codex-rs/config/src/fingerprint.rs (version_for_toml) in openai/codex: the
# sha256 of the compact, key-sorted JSON of {event_name, matcher, hooks: [the
# one handler, normalized]}, with absent options left out; the state key is
# "<hooks.json path>:<event>:<group index>:<handler index>".

CODEX_EVENTS = {"PreToolUse": "pre_tool_use", "UserPromptSubmit": "user_prompt_submit"}


def codex_hook_hash(event: str, group: dict, handler: dict) -> str:
    import hashlib
    norm = {"type": "command", "command": handler["command"],
            "timeout": max(1, int(handler.get("timeout", 600))),
            "async": bool(handler.get("async", False))}
    if handler.get("statusMessage") is not None:
        norm["statusMessage"] = handler["statusMessage"]
    identity = {"event_name": CODEX_EVENTS[event], "hooks": [norm]}
    if group.get("matcher") is not None:
        identity["matcher"] = group["matcher"]
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def codex_entries(path: str, doc: dict) -> list[tuple[str, str]]:
    """(state key, hash) of each caper entry in a Codex hooks.json."""
    agent = AGENTS["codex"]
    out = []
    for event in (agent.event, agent.prompt_event):
        for g, group in enumerate(doc.get("hooks", {}).get(event, [])):
            for i, handler in enumerate(group.get("hooks", []) if isinstance(group, dict) else []):
                if _ours(handler, agent):
                    out.append((f"{path}:{CODEX_EVENTS[event]}:{g}:{i}",
                                codex_hook_hash(event, group, handler)))
    return out


def codex_config() -> tuple[str, str, dict]:
    """$CODEX_HOME/config.toml: (path, text, parsed)."""
    import tomllib
    path = os.path.join(codex_home(), "config.toml")
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    try:
        return path, text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path} is not valid TOML ({e}); not touching it") from e


def codex_project_root(cwd: str) -> str:
    """Where Codex looks for a project's trust: the nearest .git upwards, else cwd."""
    d = os.path.abspath(cwd)
    while True:
        if os.path.exists(os.path.join(d, ".git")):
            return d
        up = os.path.dirname(d)
        if up == d:
            return os.path.abspath(cwd)
        d = up


def trust_codex_hook(hooks_path: str, doc: dict, scope: str, cwd: str | None) -> list[str]:
    """Record caper's entry as reviewed in $CODEX_HOME/config.toml, as
    Codex's own /hooks review does; what the user must still do."""
    config, text, parsed = codex_config()
    new = text
    for key, digest in codex_entries(hooks_path, doc):
        state = parsed.get("hooks", {}).get("state", {}).get(key)
        header = f"[hooks.state.{json.dumps(key)}]"
        body = f'trusted_hash = "{digest}"\n'
        if state is None:
            new += ("\n" if new and not new.endswith("\n") else "") + f"\n{header}\n{body}"
            continue
        lines = new.splitlines(keepends=True)
        at = next((n for n, line in enumerate(lines) if line.strip() == header), None)
        if at is None:
            raise ValueError(f"{config}: hooks.state.{json.dumps(key)} is not written as its own "
                             f"table; not touching it: set its trusted_hash to \"{digest}\"")
        end = next((n for n in range(at + 1, len(lines)) if lines[n].lstrip().startswith("[")),
                   len(lines))
        kept = [line for line in lines[at + 1:end]
                if line.split("=", 1)[0].strip() not in ("trusted_hash", "enabled")]
        new = "".join(lines[:at + 1] + [body] + kept + lines[end:])
    if new != text:
        import tomllib
        if codex_hook_states(tomllib.loads(new), hooks_path, doc) != "trusted":
            raise ValueError(f"{config}: could not record caper's hook as trusted; not touching it")
        from caper.commit.journal import write_atomic
        os.makedirs(os.path.dirname(config), exist_ok=True)
        write_atomic(config, new.encode(), mode=0o600, tmp=f"{config}.caper-{os.getpid()}")
        parsed = tomllib.loads(new)
    todo = []
    if scope == "project":
        root = codex_project_root(cwd or os.getcwd())
        level = parsed.get("projects", {}).get(root, {}).get("trust_level")
        if level != "trusted":
            todo.append(f"Codex runs a project's hooks only in a project it trusts, and {root} is "
                        f"not trusted in {config}: caper is NOT in front of Codex there until you "
                        f"trust it (start codex in it and answer yes, or add [projects."
                        f"{json.dumps(root)}] trust_level = \"trusted\"), or install with --user.")
    return todo


def codex_hook_states(parsed: dict, hooks_path: str, doc: dict) -> str:
    """trusted | untrusted | modified | disabled | absent: caper's entry as Codex sees it."""
    entries = codex_entries(hooks_path, doc)
    if not entries:
        return "absent"
    states = parsed.get("hooks", {}).get("state", {})
    for key, digest in entries:
        st = states.get(key) or {}
        if st.get("enabled") is False:
            return "disabled"
        if st.get("trusted_hash") is None:
            return "untrusted"
        if st["trusted_hash"] != digest:
            return "modified"
    return "trusted"


def uninstall(agent_name: str, scope: str | None = None, cwd: str | None = None) -> str:
    agent = AGENTS[agent_name]
    scope = scope or agent.default_scope
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
    for key in _take_added(path):
        if doc.get(key) is True:            # still caper's value, not one the user chose
            del doc[key]
    _save(path, doc)
    return path
