"""How caper starts itself: the command an agent's hook runs, the wrapped
command the hook hands back, the resident gate.

Always this Python, with -E (no PYTHONPATH, PYTHONHOME, PYTHONSTARTUP: a
developer's `PYTHONPATH=.` would import a caper/ that a run committed to the
workspace) and -P (no cwd on sys.path), running exactly this caper package,
by its directory. Standard library only: the hook imports it once per call.
"""
from __future__ import annotations

import os
import sys

# The directory holding this caper package (and caper_native beside it).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def caper_command() -> list[str]:
    """argv that runs this caper's CLI, whatever the caller's environment and cwd."""
    return [sys.executable, "-E", "-P", "-c",
            f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); "
            "from caper.front.cli import main; sys.exit(main())"]
