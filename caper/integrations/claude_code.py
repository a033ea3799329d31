"""Claude Code: a PreToolUse hook for the Bash tool, and its installer.

    caper hook claude-code          (reads the hook JSON on stdin)
    caper install claude-code [--project | --user]
    caper uninstall claude-code [--project | --user]

The hook never runs the command. It answers `allow` with `updatedInput`
rewriting the command to `caper run --session <session_id> --task <the
user's latest words> -c <the command>`, so Claude Code itself runs it once,
inside the gate: Claude sees the held output when the run is approved, the
effect card and the block reason when it is not (exit status 125). Any
failure of the hook itself (bad input, a bug) answers `deny`: a hook that
crashed or exited non-zero would let Claude Code run the command ungated.

Shapes, from the Claude Code hooks reference
(https://docs.anthropic.com/en/docs/claude-code/hooks):
input  {"session_id", "transcript_path", "cwd", "permission_mode",
        "hook_event_name": "PreToolUse", "tool_name": "Bash",
        "tool_input": {"command", "description", "timeout", "run_in_background"},
        "tool_use_id"}
output {"hookSpecificOutput": {"hookEventName": "PreToolUse",
        "permissionDecision": "allow" | "deny" | "ask",
        "permissionDecisionReason": "...", "updatedInput": {...}}}
The transcript is JSON lines; user turns are {"type": "user", "message":
{"role": "user", "content": str | [{"type": "text", "text": ...}, ...]}}.

Standard library only: this runs once per command.
"""
from __future__ import annotations

import json
import os
import shlex
import sys

MAX_INPUT = 1 << 20            # hook JSON larger than this is refused
TASK_MESSAGES = 3              # latest user messages that make the task
TASK_CHARS = 2000
TRANSCRIPT_TAIL = 512 * 1024   # bytes read from the end of the transcript
HOOK_TIMEOUT_S = 30            # for the hook itself (it only rewrites)
MARK = " hook claude-code"     # how install/uninstall recognise caper's entry


def _answer(decision: str, reason: str, updated: dict | None = None) -> str:
    out = {"hookEventName": "PreToolUse", "permissionDecision": decision,
           "permissionDecisionReason": reason}
    if updated is not None:
        out["updatedInput"] = updated
    return json.dumps({"hookSpecificOutput": out})


def task_from_transcript(path: str | None) -> str | None:
    """The user's latest words: the last few user text messages, bounded."""
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
    texts: list[str] = []
    for line in tail.splitlines()[1 if size > TRANSCRIPT_TAIL else 0:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("type") != "user":
            continue
        content = (entry.get("message") or {}).get("content")
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):   # tool results are not the user's words
            text = "\n".join(b.get("text", "") for b in content
                             if isinstance(b, dict) and b.get("type") == "text")
        else:
            continue
        if text.strip():
            texts.append(text.strip())
    task = "\n".join(texts[-TASK_MESSAGES:])
    return task[-TASK_CHARS:] or None


def caper_command() -> list[str]:
    """How the rewritten command calls caper: this executable when it is
    caper's console script, else this Python with -m caper."""
    exe = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(exe) == "caper" and os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-m", "caper"]


def rewrite(hook: dict) -> str:
    """The hook's answer (JSON text) for one PreToolUse input."""
    if not isinstance(hook, dict):
        raise ValueError("the hook input is not a JSON object")
    if hook.get("tool_name") != "Bash":
        raise ValueError(f"caper gates the Bash tool, got {hook.get('tool_name')!r}")
    tool_input = hook.get("tool_input")
    if not isinstance(tool_input, dict) or not isinstance(tool_input.get("command"), str):
        raise ValueError("tool_input.command is missing or not a string")
    command = tool_input["command"]
    if not command.strip() or "\0" in command:
        raise ValueError("the command is empty or holds a NUL byte")
    session = hook.get("session_id")
    if not isinstance(session, str) or not session or len(session) > 200:
        raise ValueError("session_id is missing or malformed")
    argv = caper_command() + ["run", "--session", session]
    task = task_from_transcript(hook.get("transcript_path")
                                if isinstance(hook.get("transcript_path"), str) else None)
    if task:
        argv += ["--task", task]
    argv += ["-c", command]
    updated = {**tool_input, "command": shlex.join(argv)}
    updated.pop("run_in_background", None)   # held output needs the run to finish
    return _answer("allow", "caper: the command runs once in a sandbox and counts only if "
                            "its effects are approved", updated)


def hook_main(stdin=None, stdout=None) -> int:
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    try:
        raw = stdin.read(MAX_INPUT + 1)
        if len(raw) > MAX_INPUT:
            raise ValueError(f"the hook input is over {MAX_INPUT} bytes")
        answer = rewrite(json.loads(raw))
    except Exception as e:   # fail closed: deny, never crash (a crash runs it ungated)
        answer = _answer("deny", f"caper's hook could not gate this command ({e}); "
                                 "it was not run")
    stdout.write(answer + "\n")
    stdout.flush()
    return 0


# --- install / uninstall -------------------------------------------------------------------

def settings_path(scope: str, cwd: str | None = None) -> str:
    if scope == "user":
        return os.path.join(os.path.expanduser("~"), ".claude", "settings.json")
    return os.path.join(cwd or os.getcwd(), ".claude", "settings.json")


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
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.caper-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _without_caper(groups: list) -> list:
    out = []
    for g in groups:
        if isinstance(g, dict) and isinstance(g.get("hooks"), list):
            kept = [h for h in g["hooks"] if not (isinstance(h, dict) and
                                                   MARK in str(h.get("command", "")))]
            if kept:
                out.append({**g, "hooks": kept})
            elif not g["hooks"]:
                out.append(g)
        else:
            out.append(g)
    return out


def install(scope: str, cwd: str | None = None) -> str:
    path = settings_path(scope, cwd)
    doc = _load(path)
    hooks = doc.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise ValueError(f"{path}: 'hooks' is not an object; not touching it")
    pre = hooks.get("PreToolUse", [])
    if not isinstance(pre, list):
        raise ValueError(f"{path}: 'hooks.PreToolUse' is not a list; not touching it")
    # `|| exit 2`: if caper cannot even start (Python broken, caper removed),
    # exit 2 makes Claude Code block the call; any other status would let it run.
    command = shlex.join(caper_command() + ["hook", "claude-code"]) + " || exit 2"
    hooks["PreToolUse"] = _without_caper(pre) + [
        {"matcher": "Bash", "hooks": [{"type": "command", "command": command,
                                       "timeout": HOOK_TIMEOUT_S}]}]
    _save(path, doc)
    return path


def uninstall(scope: str, cwd: str | None = None) -> str:
    path = settings_path(scope, cwd)
    doc = _load(path)
    hooks = doc.get("hooks")
    if isinstance(hooks, dict) and isinstance(hooks.get("PreToolUse"), list):
        pre = _without_caper(hooks["PreToolUse"])
        if pre:
            hooks["PreToolUse"] = pre
        else:
            del hooks["PreToolUse"]
        if not hooks:
            del doc["hooks"]
        _save(path, doc)
    return path
