"""Where caper keeps its state: journals, locks, scratch space, sessions, and
the gate's socket. Light on purpose: the CLI's fast path imports it."""
from __future__ import annotations

import os

# How long caper keeps a run's version that could not be committed (the
# workspace changed meanwhile) for the user to take: then it is deleted.
KEPT_S = 7 * 86400


def default_state_dir(env: "Mapping[str, str] | None" = None) -> str:  # noqa: F821
    env = os.environ if env is None else env
    if env.get("CAPER_STATE_DIR"):
        return env["CAPER_STATE_DIR"]
    if os.geteuid() == 0:
        return "/var/lib/caper"
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"),
                                                     ".local", "state")
    return os.path.join(base, "caper")
