"""How caper starts itself: the command an agent's hook runs, the wrapped
command the hook hands back, the resident gate.

The native client (csrc/client.c, built beside the native core) where it was
built for this Python: `caper hook` and `caper run` at the cost of an exec,
through the gate. Else this Python, with -E (no PYTHONPATH, PYTHONHOME,
PYTHONSTARTUP: a developer's `PYTHONPATH=.` would import a caper/ that a run
committed to the workspace) and -P (no cwd on sys.path), running exactly
this caper package, by its directory. Standard library only: the hook
imports it once per call.
"""
from __future__ import annotations

import os
import sys

# The directory holding this caper package (and caper_native beside it).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT = os.path.join(PACKAGE_ROOT, "caper_native", "caper-client")


def python_command() -> list[str]:
    """argv that runs this caper's CLI in this Python, whatever the caller's
    environment and cwd."""
    return [sys.executable, "-E", "-P", "-c",
            f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); "
            "from caper.front.cli import main; sys.exit(main())"]


def _same_python(a: str, b: str) -> bool:
    """One interpreter of one environment: python and python3 of a venv are
    (bin/caper starts python3, the build ran python); another venv's python
    resolves to the same binary but is not."""
    return a == b or (os.path.dirname(a) == os.path.dirname(b)
                      and os.path.realpath(a) == os.path.realpath(b))


def caper_command() -> list[str]:
    """argv that runs this caper's CLI: the native client when it was built
    for this Python (it hands what the gate does not take to python_command),
    else python_command."""
    try:
        with open(CLIENT + ".python") as f:
            built_for = f.read().strip()
    except OSError:
        built_for = None
    if built_for and _same_python(built_for, sys.executable) and os.access(CLIENT, os.X_OK):
        return [CLIENT]
    return python_command()
