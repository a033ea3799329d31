"""The helper programs caper itself runs on the host (git, for the report),
found and started so that nothing of the workspace's is executed.

A user's PATH often holds an empty or relative entry ("", "."), which names
the current directory: caper works in the workspace, where an earlier run
may have committed a `./git`. So a helper is looked up only in absolute
directories that are not below the workspace, by its absolute path, with a
cwd and an environment that caper chooses (`helper_env`), never the
caller's whole environment.
"""
from __future__ import annotations

import os

from caper.fs.mountinfo import below

FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"


def safe_path(path: str | None, avoid: tuple[str, ...] = ()) -> str:
    """PATH without empty, relative or non-normal entries, and none below a
    directory in avoid (the workspace)."""
    keep: list[str] = []
    for d in (path or FALLBACK_PATH).split(os.pathsep):
        if not os.path.isabs(d):
            continue
        d = os.path.normpath(d)
        if d not in keep and not any(below(d, a) or below(os.path.realpath(d), a)
                                     for a in avoid):
            keep.append(d)
    return os.pathsep.join(keep) or FALLBACK_PATH


def find_program(name: str, path: str | None, avoid: tuple[str, ...] = ()) -> str | None:
    """The absolute path of the executable `name` in safe_path(path, avoid)."""
    for d in safe_path(path, avoid).split(os.pathsep):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            real = os.path.realpath(p)
            if not any(below(real, a) for a in avoid):
                return p
    return None


def helper_env(path: str, **extra: str) -> dict[str, str]:
    """The environment of a helper: the safe PATH, the user's HOME and
    config location (their own git settings), the C locale, and extra."""
    env = {"PATH": path, "LC_ALL": "C"}
    for k in ("HOME", "XDG_CONFIG_HOME"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    return {**env, **extra}
