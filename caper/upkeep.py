"""The state directory's housekeeping, in one place: every path that starts
work on a state directory (a run, `caper recover`) calls tidy() first, so
they cannot disagree about what is finished, undone or expired."""
from __future__ import annotations

from caper.commit.recover import recover
from caper.held import expire
from caper.state import KEPT_S
from caper.view.btrfs import recover_btrfs
from caper.view.overlay import collect_dead_runs, expire_kept


def tidy(state_dir: str) -> list[str]:
    """Finish or undo interrupted commits (overlay, then btrfs), remove the
    scratch of runs that died, and expire held runs and kept versions nobody
    took. Returns what it did, a line each."""
    done = recover(state_dir) + recover_btrfs(state_dir)
    done += [f"removed the scratch of a run that died: {p}" for p in collect_dead_runs(state_dir)]
    done += [f"expired a held run nobody applied: {i}" for i in expire(state_dir)]
    done += [f"removed a kept version nobody took: {p}" for p in expire_kept(state_dir, KEPT_S)]
    return done
