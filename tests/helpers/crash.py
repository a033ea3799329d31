"""Crash tests' kill switch: run a function in a child that SIGKILLs itself
at the N-th filesystem step of a commit engine (caper.commit.journal.step)."""
from __future__ import annotations

import os
import signal
import traceback

from caper.commit import journal


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


def kill_sweep(commit, recover, reset, check, picks=None) -> tuple[list[str], int]:
    """The crash matrix of a commit engine. Kill `commit` at its 1st, 2nd ...
    step until it runs through; after each kill, `recover` must give an
    outcome (`check` returns "pre" or "post") and be idempotent. Then, for
    each commit kill point k in `picks(outcomes)` (default: all), kill
    `recover` too, at each of its steps, and require the same outcome.
    `reset` restores the pre-state before every attempt. Returns the
    outcome per commit kill point and the number of nested recoveries."""
    outcomes = []
    n = 0
    while True:
        n += 1
        reset()
        if not killed_at(n, commit):
            assert check("no kill") == "post"
            break
        recover()
        outcomes.append(check(f"killed at step {n}"))
        assert recover() == []                       # idempotent: nothing left to do
    nested = 0
    for k in (picks(outcomes) if picks else range(1, len(outcomes) + 1)):
        m = 0
        while True:
            m += 1
            reset()
            assert killed_at(k, commit)
            if not killed_at(m, recover):
                break
            nested += 1
            recover()
            assert check(f"commit killed at {k}, recover at {m}") == outcomes[k - 1]
    return outcomes, nested
