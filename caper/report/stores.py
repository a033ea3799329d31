"""Credential stores known by what they hold, not by their name.

git's configuration is a credential store when a remote URL carries a token
(`https://user:ghp_...@github.com/...`) or an `http.extraheader` sets an
Authorization header; the file `credential.helper = store --file F` names,
and git's XDG store, always are. Claude Code's settings are one when their
`env` block holds a key (by its name or its value's shape). Found on the host
before each run (caper.transaction), each joins the run's credential
locations with its kind, so reading it is a credential read like any other.
git reading its own configuration is the exception caper.report.build makes
for GIT_CONFIG.
"""
from __future__ import annotations

import json
import os
import re

from caper.fs.syscalls import open_quiet
from caper.report.secrets import (MAX_SECRET_FILE, SHAPES, ProtectedPattern, credential_var,
                                  placeholder)

GIT_CONFIG = "git-config-token"
GIT_STORE = "git-credentials"
AGENT_SETTINGS = "agent-settings-env"
# Kinds whose values are their secrets only (secret_values), not every
# setting of the file (secrets.values_in would redact `origin`, `main` ...).
BY_CONTENT = frozenset({GIT_CONFIG, AGENT_SETTINGS})

_EXTRAHEADER = re.compile(r"(?im)^\s*extraheader\s*=\s*\"?\s*(?:authorization\s*:\s*)?(.*?)\"?\s*$")
_STORE_FILE = re.compile(r"(?im)^\s*helper\s*=\s*\"?\s*store\b.*?--file(?:=|\s+)(\S+?)\"?\s*$")


def secret_values(kind: str, data: bytes) -> list[str]:
    """The secrets a store of this kind holds (its values to redact): for
    git's configuration the token shapes and extraheader values, for agent
    settings the env block's credential variables; [] for other kinds."""
    if len(data) > MAX_SECRET_FILE or b"\0" in data[:8192]:
        return []
    text = data.decode("utf-8", "replace")
    found: list[str] = []
    if kind == GIT_CONFIG:
        for _, rx, anchors in SHAPES:
            if any(a in text.lower() for a in anchors):
                found += [m.group(0) for m in rx.finditer(text)]
        found += [v.strip() for v in _EXTRAHEADER.findall(text)]
    elif kind == AGENT_SETTINGS:
        try:
            env = json.loads(text).get("env")
        except (ValueError, AttributeError, RecursionError):
            env = None
        if isinstance(env, dict):
            found += [v for k, v in env.items() if isinstance(v, str) and credential_var(k, v)]
    return [v for v in dict.fromkeys(found) if v and not placeholder(v)]


def _read(path: str) -> bytes | None:
    """A small regular file's bytes, its last component not followed."""
    try:
        fd = open_quiet(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return None
        return os.read(fd, MAX_SECRET_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


MAX_SUBMODULE_CONFIGS = 64


def _submodule_configs(workspace: str) -> list[str]:
    """The config files of .git/modules/** (nested submodules too), at most
    MAX_SUBMODULE_CONFIGS, without following symlinks."""
    out, todo = [], [os.path.join(workspace, ".git", "modules")]
    while todo and len(out) < MAX_SUBMODULE_CONFIGS:
        d = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.name == "config" and e.is_file(follow_symlinks=False):
                out.append(e.path)
            elif e.is_dir(follow_symlinks=False) and e.name not in ("objects", "refs", "logs",
                                                                      "hooks", "info"):
                todo.append(e.path)
    return out[:MAX_SUBMODULE_CONFIGS]


def stores(home: str | None, workspace: str | None,
           xdg_config: str | None) -> tuple[ProtectedPattern, ...]:
    """The host's files that are credential stores by content, now, as
    credential patterns (by path and real path)."""
    xdg = xdg_config or (os.path.join(home, ".config") if home else None)
    git = [p for p in (workspace and os.path.join(workspace, ".git", "config"),
                       home and os.path.join(home, ".gitconfig"),
                       xdg and os.path.join(xdg, "git", "config")) if p]
    # Submodules' own configs (actions/checkout writes its auth header there).
    git += _submodule_configs(workspace) if workspace else []
    settings = [os.path.join(d, ".claude", name) for d in (home, workspace) if d
                for name in ("settings.json", "settings.local.json")]
    found: list[tuple[str, str]] = [(os.path.join(xdg, "git", "credentials"), GIT_STORE)] \
        if xdg else []
    for path in git:
        data = _read(path)
        if data is None:
            continue
        if secret_values(GIT_CONFIG, data):
            found.append((path, GIT_CONFIG))
        for f in _STORE_FILE.findall(data.decode("utf-8", "replace")):
            f = home.rstrip("/") + f[1:] if f.startswith("~/") and home else f
            if os.path.isabs(f):
                found.append((os.path.normpath(f), GIT_STORE))
    for path in settings:
        data = _read(path)
        if data is not None and secret_values(AGENT_SETTINGS, data):
            found.append((path, AGENT_SETTINGS))
    out: dict[str, str] = {}
    for path, kind in found:
        for p in (path, os.path.realpath(path)):
            if not any(c in p for c in "*?"):     # a glob pattern: * and ? would widen it
                out.setdefault(p, kind)
    return tuple(ProtectedPattern(p, k) for p, k in out.items())
