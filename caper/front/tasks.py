"""The task a run is judged against: the user's own words, carried out of
band from the agent.

The approver weighs a run's effects against the task, so the task must not
come from anything the agent writes. The hooks keep it in caper's state
directory (which only the user can write, see caper.state):

- `<state>/tasks/prompt-<h>.json`: the user's latest prompts in session h,
  recorded by the agent's own prompt event (Claude Code's and Codex's
  UserPromptSubmit, Gemini CLI's BeforeAgent) as the human typed them, and
  the session's project (the workspace of the directory the agent was
  started in, as the agent tells its hooks).
- `<state>/tasks/call-<id>.json`: one gated tool call: its session, the
  exact command, the task the hook found for it (None: none known) and the
  project that task was given for.

A task is the user's words about one project: a call that runs in another
workspace (Codex's exec_command takes a `workdir` from the model, Gemini's
run_shell_command a `dir_path`, and caper's workspace is that directory's)
has no task, the strictest case, whatever the agent's tool calls its
directory. `caper run --call` checks it against the workspace it is about
to judge, so no parameter of any agent's tool can carry a task elsewhere.

The wrapped command names the call (`caper run --session S --call ID -c X`),
never a task: `caper run` takes the task from the record, and only if the
record was made for that session and exactly that command X. A record
serves one run. Each record, prompt and call alike, carries an HMAC under
the state directory's record key (caper.state.record_key: pinned in the
kernel keyring, so a key file an agent's file tool replaced is put back and
what it MAC'd does not verify): the agent's shell never sees the state
directory (the sandbox hides it), and the hooks deny the agent's own file
tools there (caper.front.hooks.file_tool_answer). A prompt
record that is not caper's (no MAC, a wrong one, another owner) is no task,
the strictest case: it does not fall back to the transcript, which the agent
could have written to as well. The transcript is the fallback only when no
prompt record exists; a task found there is marked as such and never lowers
the policy's strictness (caper.judge.policy treats it as no task). A `--task` typed on caper's command line is what whoever
ran caper says: a human's or a script's own call, never a hooked agent's
(the hooks wrap every command but the exact `--call` form, so an agent's
`caper run --task ...` runs inside the sandbox, where caper cannot run).

Standard library and caper.state (light) only, but for project_of (the
hooks' prompt and call paths, which find a workspace): the hooks import it.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Callable

from caper.errors import ConfigError
from caper.state import record_key

DIR = "tasks"
PROMPTS_KEPT = 3            # the latest prompts that make the task
TASK_CHARS = 2000
CALL_MAX_AGE_S = 24 * 3600  # an unused call record older than this is dropped
PROMPT_MAX_AGE_S = 7 * 86400
_CALL_ID = re.compile(r"[0-9a-f]{32}\Z")


class TaskRecordError(Exception):
    """A call record is missing, malformed, or made for another call."""


def _dir(state: str) -> str:
    d = os.path.join(state, DIR)
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def _prompt_path(state: str, session: str) -> str:
    import hashlib   # here: `caper run --call`, on every hooked command, never needs it
    return os.path.join(_dir(state), "prompt-" + hashlib.sha256(session.encode()).hexdigest()[:32]
                        + ".json")


def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(doc).encode())
    finally:
        os.close(fd)
    os.rename(tmp, path)


def _read(path: str) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise TaskRecordError(f"{path} does not belong to you; refusing it")
        doc = json.loads(os.read(fd, 1 << 20))
    except ValueError as e:
        raise TaskRecordError(f"{path}: not a task record ({e})") from e
    finally:
        os.close(fd)
    if not isinstance(doc, dict):
        raise TaskRecordError(f"{path}: not a task record")
    return doc


def task_text(prompts: list[str]) -> str | None:
    """The task made of the latest prompts: the last few, bounded."""
    texts = [p.strip() for p in prompts if isinstance(p, str) and p.strip()]
    return "\n".join(texts[-PROMPTS_KEPT:])[-TASK_CHARS:] or None


_PROMPT_FIELDS = ("session", "prompts", "time", "project")


def _prompts(state: str, session: str) -> dict | None:
    """The prompt record of session, None if there is none; a record caper
    did not make (or made for another session) is TaskRecordError."""
    path = _prompt_path(state, session)
    doc = _read(path)
    if doc is None:
        return None
    import hmac
    if not isinstance(doc.get("mac"), str) or not hmac.compare_digest(
            doc["mac"], _mac(os.path.dirname(path), doc, _PROMPT_FIELDS)):
        raise TaskRecordError(f"{path}: the prompt record was not made by caper's hook")
    if doc.get("session") != session or not isinstance(doc.get("prompts"), list) or \
            not isinstance(doc.get("project"), (str, type(None))):
        raise TaskRecordError(f"{path}: the prompt record is for another session")
    return {"prompts": [p for p in doc["prompts"] if isinstance(p, str)],
            "project": doc["project"]}


def record_prompt(state: str, session: str, prompt: str, project: str | None) -> None:
    """The human typed `prompt` in `session` (the agent's prompt event),
    whose project is `project` (a workspace, see project_of; None: unknown,
    and no call then has a task). Another project than the session's last
    starts the prompts again: earlier words were about that one."""
    path = _prompt_path(state, session)
    try:
        kept = _prompts(state, session)
    except TaskRecordError:
        kept = None   # a record not caper's: the user's new words replace it
    prompts = kept["prompts"] if kept and kept["project"] == project else []
    doc = {"session": session, "prompts": (prompts + [prompt])[-PROMPTS_KEPT:],
           "time": time.time(), "project": project}
    _write(path, {**doc, "mac": _mac(os.path.dirname(path), doc, _PROMPT_FIELDS)})


def recorded_task(state: str, session: str) -> tuple[bool, str | None, str | None]:
    """Whether prompts were recorded for this session, the task they make,
    and the project they were given in; TaskRecordError if the record is
    not caper's."""
    doc = _prompts(state, session)
    if doc is None:
        return False, None, None
    return True, task_text(doc["prompts"]), doc["project"]


def project_of(directory: str) -> str:
    """The project a session started in `directory` works on: the workspace
    caper would find there (its git top level, else the directory)."""
    from caper.report.workspace import find_workspace
    return find_workspace(directory)


def same_project(project: str | None, workspace: str) -> bool:
    """Whether a run in `workspace` is in the session's `project`: the same
    workspace, or (the project is no repository) a directory inside it that
    is no repository of its own either."""
    if project is None:
        return False
    return workspace == project or (workspace.startswith(project.rstrip("/") + "/") and
                                    not os.path.lexists(os.path.join(workspace, ".git")))


def _key(d: str) -> bytes:
    try:
        return record_key(os.path.dirname(d))
    except ConfigError as e:
        raise TaskRecordError(str(e)) from e


_CALL_FIELDS = ("id", "session", "command", "task", "source", "created", "wrapped", "project")


def _mac(d: str, doc: dict, fields: tuple[str, ...]) -> str:
    import hashlib
    import hmac
    # The kind of record is in the MAC: a call record's fields never pass for a prompt's.
    body = json.dumps([fields] + [doc.get(k) for k in fields])
    return hmac.new(_key(d), body.encode(), hashlib.sha256).hexdigest()


def new_call(state: str, session: str, command: str, task: str | None, source: str,
             project: str | None, wrap: "Callable[[str], str] | None" = None) -> str:
    """Record one gated call, whose task was given for `project` (None:
    unknown, no task); its id goes into the wrapped command, wrap(id): the
    exact bytes the hook hands the agent, kept so that a resubmitted command
    passes only as those bytes, never with a flag the model added."""
    d = _dir(state)
    _expire(d)
    call = os.urandom(16).hex()
    doc = {"id": call, "session": session, "command": command, "task": task,
           "source": source, "created": time.time(), "wrapped": wrap(call) if wrap else None,
           "project": project}
    _write(os.path.join(d, f"call-{call}.json"), {**doc, "mac": _mac(d, doc, _CALL_FIELDS)})
    return call


def _call_path(state: str, call: str) -> str:
    if not isinstance(call, str) or not _CALL_ID.match(call):
        raise TaskRecordError(f"not a call id: {call!r}")
    return os.path.join(state, DIR, f"call-{call}.json")


def check_call(state: str, call: str, session: str, command: str,
               wrapped: str | None = None) -> dict:
    """The record of `call`, if it was made for this session and exactly this
    command (and, given, exactly this wrapped command) and has not expired;
    else TaskRecordError."""
    path = _call_path(state, call)
    doc = _read(path)
    if doc is None:
        raise TaskRecordError(f"no record of call {call} (used already, expired, or not made "
                              "by caper's hook)")
    if doc.get("id") != call or doc.get("session") != session or doc.get("command") != command:
        raise TaskRecordError(f"call {call} was recorded for another session or command")
    if wrapped is not None and doc.get("wrapped") != wrapped:
        raise TaskRecordError(f"call {call}: not the wrapped command the hook gave "
                              "(a flag added or changed)")
    if not isinstance(doc.get("task"), (str, type(None))) or \
            not isinstance(doc.get("project"), (str, type(None))) or \
            not isinstance(doc.get("created"), (int, float)) or \
            time.time() - doc["created"] > CALL_MAX_AGE_S:
        raise TaskRecordError(f"call {call}: the record is malformed or expired")
    import hmac
    if not isinstance(doc.get("mac"), str) or \
            not hmac.compare_digest(doc["mac"], _mac(os.path.dirname(path), doc, _CALL_FIELDS)):
        raise TaskRecordError(f"call {call}: the record was not made by caper's hook")
    return doc


def take_call(state: str, call: str, session: str, command: str,
              workspace: str) -> tuple[str | None, bool, str | None]:
    """The task recorded for this call, for a run in `workspace` (None: no
    task was known, or it was given for another project), whether it came
    from the transcript, and what to tell when the task was dropped; once:
    the record is removed, so it serves exactly one run."""
    doc = check_call(state, call, session, command)
    try:
        os.unlink(_call_path(state, call))
    except FileNotFoundError:
        raise TaskRecordError(f"call {call} was used by another run meanwhile") from None
    if doc["task"] is not None and not same_project(doc["project"], workspace):
        return None, False, (f"the task was given for {doc['project'] or 'no known project'}; "
                             f"this call runs in {workspace}, so it is judged with no task")
    return doc["task"], doc.get("source") == "transcript", None


def _expire(d: str) -> None:
    now = time.time()
    try:
        with os.scandir(d) as it:
            for e in it:
                age = now - e.stat(follow_symlinks=False).st_mtime
                if e.name == "key":
                    continue
                if age > (CALL_MAX_AGE_S if e.name.startswith("call-") else PROMPT_MAX_AGE_S):
                    try:
                        os.unlink(e.path)
                    except FileNotFoundError:
                        pass
    except OSError:
        pass   # expiry is housekeeping: a failure leaves old records, never wrong ones
