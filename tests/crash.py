"""Crash tests' kill switch: run a function in a child that SIGKILLs itself
at the N-th filesystem step of a commit engine (caper.journal.step)."""
from __future__ import annotations

import os
import signal
import traceback

from caper import journal


class _Killer:
    def __init__(self, at: int):
        self.at, self.n = at, 0

    def __call__(self, what: str) -> None:
        self.n += 1
        if self.n == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def killed_at(at: int, fn) -> bool:
    """Run fn in a child killed at its `at`-th step; True if it was killed.
    A child that finishes must finish cleanly."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            journal.fault_hook = _Killer(at)
            fn()
        except BaseException:  # noqa: BLE001 - reported by the exit code
            traceback.print_exc()
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the child failed"
    return False
