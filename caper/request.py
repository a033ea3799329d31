"""One run's options, the same from every front door to the run.

Every way into a run builds a RunRequest: `caper.run`'s keywords, the API's
Gate, the CLI's `caper run` (through the gate or in its own process), the
gate's request handler, and so the MCP server and the agents' hooks, which
come in through these. The gate's wire protocol is `to_wire`/`from_wire`:
the option names are its field names.

OPTIONS is the one list of options: a line each, with the default and the
check. None given for an option means its default. A bad value is a
BadRequest that names the option; nothing has run then.

Standard library only, and cheap: the gate's client builds one per command
(no dataclass: it brings inspect along, ~8 ms of every hook's `caper run`).
"""
from __future__ import annotations

import os
from typing import Callable

from caper.errors import BadRequest
from caper.sandbox import DEFAULT_TIMEOUT_S
from caper.sandbox.inherit import Caller

APPROVERS = ("auto", "policy", "llm", "allow", "block")
BACKENDS = ("auto", "overlay", "btrfs")
ON_UNSURE = ("block", "allow", "ask")
MAX_SESSION_ID = 200


def check_session_id(sid) -> str:
    if not isinstance(sid, str) or not sid or len(sid) > MAX_SESSION_ID \
            or any(ord(ch) < 32 for ch in sid):
        raise BadRequest(f"bad session id {sid!r}: 1-{MAX_SESSION_ID} printable characters")
    return sid


def _command(v):
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(a, str) for a in v):
        return list(v)     # empty or NUL bytes: the sandbox's own checks (caper.sandbox.trace)
    raise BadRequest(f"command: a shell string or a list of strings, not {v!r}")


def _is(kind: type, name: str, what: str) -> Callable:
    def check(v):
        if not isinstance(v, kind):
            raise BadRequest(f"{name}: {what}, not {v!r}")
        return v
    return check


def _path(name: str) -> Callable:
    def check(v):
        try:
            return os.fspath(v)
        except TypeError:
            raise BadRequest(f"{name}: a path, not {v!r}") from None
    return check


def _approver(v):
    if isinstance(v, str):
        if v not in APPROVERS:
            raise BadRequest(f"unknown approver {v!r}; known: {', '.join(APPROVERS)}")
        return v
    if not callable(getattr(v, "decide", None)):   # caper.judge.Approver, from the API
        raise BadRequest(f"approver: a name ({', '.join(APPROVERS)}) or an Approver, not {v!r}")
    return v


def _backend(v):
    if v not in BACKENDS:
        raise BadRequest(f"unknown backend {v!r} (known: {', '.join(BACKENDS)})")
    return v


def _on_unsure(v):
    if v not in ON_UNSURE:
        raise BadRequest(f"on_unsure must be one of {', '.join(ON_UNSURE)}, not {v!r}")
    return v


def _timeout(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise BadRequest(f"timeout must be a positive number of seconds, not {v!r}")
    return float(v)


def _max_memory(v):
    # Only here: caper.sandbox.limits costs the gate's client ~25 ms, and a
    # size reaches the client parsed already (the CLI's --max-memory).
    from caper.sandbox.limits import parse_size
    try:
        return parse_size(v)
    except (TypeError, ValueError) as e:
        raise BadRequest(f"max_memory: {e}") from e


def _env(v):
    if not hasattr(v, "keys") or not all(isinstance(k, str) and isinstance(x, str)
                                         for k, x in v.items()):
        raise BadRequest("env: not a mapping of strings to strings")
    return v


def _caller(v):
    if not isinstance(v, Caller):
        raise BadRequest(f"caller: a caper.sandbox.inherit.Caller, not {v!r}")
    return v


def _allow_net(v):
    if not isinstance(v, (list, tuple)) or not all(isinstance(h, str) for h in v):
        raise BadRequest(f"allow_net: a list of HOST[:PORT] strings, not {v!r}")
    return tuple(v)


# name: (default, check, on the wire). None given means the default.
OPTIONS: dict[str, tuple[object, Callable, bool]] = {
    "command": (None, _command, True),
    "task": (None, _is(str, "task", "a string"), True),   # the user's words (evidence)
    "task_from_transcript": (False, _is(bool, "task_from_transcript", "true or false"), True),
    "approver": ("auto", _approver, True),
    "backend": ("auto", _backend, True),
    "timeout": (DEFAULT_TIMEOUT_S, _timeout, True),
    "workspace": (None, _path("workspace"), True),     # None: git's top level of cwd, else cwd
    "session": (None, check_session_id, True),
    "on_unsure": (None, _on_unsure, True),             # None: config.toml's
    "max_memory": (None, _max_memory, True),           # bytes; None: config.toml's, else caper's
    "caller": (None, _caller, True),                   # None: this process's, with cwd and env
    "allow_net": ((), _allow_net, True),               # HOST[:PORT]s through caper's proxy
    "cwd": (None, _path("cwd"), False),                # on the wire: the caller's
    "env": (None, _env, False),                        # on the wire: the caller's
}
# What the gate's protocol adds around the options (caper.front.gate).
ENVELOPE = ("build", "token")


class RunRequest:
    """What a caller asks of one run. Attributes: the OPTIONS, checked."""
    __slots__ = tuple(OPTIONS)

    def __init__(self, command, **options):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise BadRequest(f"unknown run option(s): {', '.join(unknown)}")
        options["command"] = command
        for name, (default, check, _) in OPTIONS.items():
            value = options.get(name)
            setattr(self, name, default if value is None else check(value))
        if self.command is None:
            raise BadRequest("no command")

    def replace(self, **changes) -> "RunRequest":
        """This request with some options changed (None: the default)."""
        return RunRequest(**{**{n: getattr(self, n) for n in OPTIONS}, **changes})

    @property
    def text(self) -> str:
        """The command as one line: what the approver and the history see."""
        return self.command if isinstance(self.command, str) else " ".join(self.command)

    def to_wire(self) -> dict:
        """The gate request's fields. The caller context travels whole (cwd
        and env in it), and the workspace absolute: the gate's cwd is /."""
        if not isinstance(self.approver, str):
            raise BadRequest("an Approver object cannot be sent to the gate: name one")
        caller = self.caller or Caller.here(cwd=self.cwd, env=self.env)
        doc = {n: getattr(self, n) for n, (_, _, wire) in OPTIONS.items() if wire}
        doc["caller"] = caller.to_json()
        if self.workspace is not None:
            doc["workspace"] = os.path.abspath(os.path.join(caller.cwd, self.workspace))
        return doc

    @classmethod
    def from_wire(cls, doc) -> "RunRequest":
        """A gate request's options (the envelope taken off); BadRequest if
        any is malformed or unknown: an option the gate does not know could
        be one the client counts on."""
        if not isinstance(doc, dict):
            raise BadRequest(f"a request is a JSON object, not {type(doc).__name__}")
        wire = {n for n, (_, _, on_wire) in OPTIONS.items() if on_wire}
        unknown = sorted(set(doc) - wire - set(ENVELOPE))
        if unknown:
            raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
        if "caller" not in doc:
            raise BadRequest("no caller: the request must carry the caller's context")
        try:
            caller = Caller.from_json(doc["caller"])
        except (KeyError, TypeError, ValueError) as e:
            raise BadRequest(f"caller: {e!r}") from e
        options = {n: doc.get(n) for n in wire}
        # A request that does not say where its task came from is treated as
        # the more doubtful kind (read from a file the agent can write).
        if options["task_from_transcript"] is None:
            options["task_from_transcript"] = True
        return cls(**{**options, "caller": caller, "cwd": caller.cwd, "env": caller.env})
