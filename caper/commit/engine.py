"""caper.commit.engine: apply the overlay upper dirs of an approved run to the real tree.

    plan = plan_changes(layers)                       # read-only: what commit would do
    result = commit(layers, state_dir=..., since_ns=snapshot_ns, exclude=[scratch])
    recover(state_dir)                                # after a crash: finish or undo

The stages, in order (`commit` lists them):

1. **plan** (read-only).  Walk every upper dir (never the host tree, except
   below a directory that is deleted or replaced) and turn each entry into a
   *unit* (one host path swapped atomically: create, replace, delete; or a
   file with other hard links rewritten in place, with its old data kept for
   an undo), a *move* (a directory the run renamed: an overlay redirect) or a
   *meta* change of a merged directory.  Every host path the commit would
   change is checked: a ctime at or after `since_ns` means the host changed it
   during the run, and the whole commit is refused with `CommitConflict`
   before anything is touched.
2. **journal**.  `state_dir/journal/<id>.json` lists every unit with the
   hidden name (`.caper-<id>-<n>`, next to its target, so on the same
   filesystem) that stages its new content or keeps its old one.  Written
   and fsynced before the first change; rewritten (tmp + rename + fsync) at
   each phase: prepared -> staged -> applied.
3. **stage**.  The moves first (every source to a hidden name in the
   layer's root, then each to its destination: the units name their targets
   where the run left them).  New content is built at the hidden names:
   hard-linked from the upper when it is on the same filesystem (fast, and
   the upper stays intact for an undo), copied otherwise (EXDEV); another
   name of a host file is a hard link to the host's inode (its overlay
   origin).  Overlay xattrs are stripped.
   The inode of each staged entry goes into the journal ("staged").
4. **swap**.  Each unit is one atomic `renameat2`: RENAME_EXCHANGE for a
   replacement (no moment without the path; the old version ends at the
   hidden name), RENAME_NOREPLACE for a creation and for moving a deleted
   entry aside.  Then the new mode/owner/xattrs of merged directories.
   `syncfs`, then the journal says "applied".
5. **finish**.  Move the old versions kept at the hidden names into the
   trash beside each upper dir (deleted with the run's scratch after caper
   has answered; in place where that is another mount, or where an old
   version has a link elsewhere), set the directories' times, empty the
   upper dirs (their files are the host's files now: writing through them
   again would change the host unseen), delete the journal.

A crash (kill -9, power loss after the syncs) at any point leaves a journal;
`recover` undoes a commit that had not reached "applied" (every step is
recognised by the inode at the target, so undo is idempotent) and finishes one
that had.  Either way the tree ends in exactly the pre-state or the post-state.

Every path below a layer's mount point is reached one component at a time
with O_NOFOLLOW from directory fds: a host symlink never redirects a write.

The case matrix, `CASE(<changed>, <host>)`, is labelled at the code that decides
each case; `scripts/check_commit_cases.py` checks that tests/test_commit.py
has a test for every label.

Exceptions (all `caper.errors.CaperError`):

* CommitError            the commit was refused or failed and was undone
  + CommitConflict       the host changed a path the run changed (.paths); nothing touched
  + CommitIncomplete     did not end cleanly; the journal is kept: run `recover(state_dir)`
"""
from __future__ import annotations

import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from caper.changes import Change, Layer
from caper.commit.journal import Journal, fsync_dir
from caper.commit.plan import Plan, make_plan
from caper.commit.recover import Recovery, empty_upper, load_journal, overlaps, stale_paths
from caper.commit.stage import (
    JOURNAL_DIR, STAGE_PREFIX, Stager, check_room, journal_at, journal_data, shut_dirs, swap, sync_layers,
)
from caper.commit.fsops import fs_error
from caper.errors import CaperError, CommitConflict, CommitError, CommitIncomplete

__all__ = ["CommitResult", "commit"]


# --- public types ---------------------------------------------------------------

@dataclass
class CommitResult:
    id: str
    changes: list[Change]
    counts: dict[str, int]          # Change.kind -> number
    units: int = 0                  # atomic swaps done
    linked: int = 0                 # entries staged by hard link from the upper
    copied: int = 0                 # entries staged by copy (other filesystem)
    bytes_copied: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)   # for the user: what they should do



# --- the entry points -------------------------------------------------------------------------------

def commit(layers: Sequence[Layer], *, state_dir: str, since_ns: int, exclude: Sequence[str] = ()) -> CommitResult:
    """Apply the upper dirs of `layers` to the host tree, all or nothing.

    The overlays must be unmounted (no process may still write to the upper
    dirs).  `since_ns`: the snapshot time (see caper.view.overlay); a host path
    the run changed whose ctime is at or after it raises CommitConflict.
    `exclude`: host paths never touched (state_dir is always excluded).

    On success the upper dirs are emptied (consumed).  On any CommitError the
    host tree is as before and the upper dirs are as they were."""
    t0 = time.perf_counter()
    state_dir = os.path.abspath(state_dir)
    jdir = os.path.join(state_dir, JOURNAL_DIR)
    if not os.path.isdir(jdir):
        try:
            os.makedirs(jdir, mode=0o700, exist_ok=True)
            fsync_dir(state_dir)
        except OSError as e:   # before any change: nothing to undo
            raise CommitError(f"mkdir({jdir}): {e.strerror} (errno {e.errno}); nothing was "
                              "committed", step="journal") from e
    # An interrupted commit that recover() could not complete leaves its own
    # paths in an unknown state, and only those: a commit elsewhere goes on.
    stale = stale_paths(state_dir)
    # 1. plan (read-only) and conflicts; the upper dirs are never committed into themselves
    plan = make_plan(layers, [*exclude, state_dir, *(l.upper for l in layers)], since_ns)
    try:
        notes = []
        if stale:
            mine = _plan_paths(plan)
            for jid, paths in stale.items():
                hit = sorted(p for p in mine if any(overlaps(p, q) for q in paths))
                if hit:
                    raise CommitError(f"{hit[0]}: an interrupted commit ({jid}) that could not be "
                                      f"completed left this path in an unknown state; run "
                                      f"`caper recover --state-dir {state_dir}`", step="journal")
                notes.append(f"an interrupted commit ({jid}) could not be completed; its paths "
                             f"({', '.join(sorted(paths)[:3])}{' ...' if len(paths) > 3 else ''}) "
                             f"stay as they are: run `caper recover --state-dir {state_dir}`")
        if plan.conflicts:
            paths = sorted(set(plan.conflicts))
            raise CommitConflict(f"{len(paths)} path(s) changed on the host during the run: "
                                 + ", ".join(paths[:10]) + (" ..." if len(paths) > 10 else ""), paths)
        jid = secrets.token_hex(6)
        counts = dict(Counter(c.kind for c in plan.changes))
        if not plan.units and not plan.metas and not plan.moves:
            for lp in plan.layers:
                empty_upper(lp.layer.upper)
            return CommitResult(jid, plan.changes, counts, seconds=time.perf_counter() - t0,
                                notes=notes)
        check_room(plan)
        for n, unit in enumerate(plan.units):
            unit.stage = f"{STAGE_PREFIX}{jid}-{n}"
        for n, move in enumerate(plan.moves):
            move.stage = f"{STAGE_PREFIX}{jid}-m{n}"
        plan.shut = shut_dirs(plan)
        journal = journal_at(state_dir, jid)
        journal.lock(block=True)
        stager = Stager(plan)
        try:
            # 2. journal, durable before the first change
            journal.write(journal_data(jid, "prepared", plan))
            # 3. the directories the run renamed, then new content at the hidden names
            stager.move_dirs()
            for unit in plan.units:
                stager.stage(unit)
            sync_layers(plan.layers)
            journal.write(journal_data(jid, "staged", plan))
            # 4. swap, then the applied mark
            swap(plan)
            sync_layers(plan.layers)
            journal.write(journal_data(jid, "applied", plan))
        except BaseException as exc:
            _undo_after_failure(journal, exc)
            raise
        # 5. finish: drop the old versions, set directory times. Applied already:
        # the commit stands even if this fails, and recover() completes it.
        _replay(journal, "finish", lambda e: CommitIncomplete(
            f"commit {jid} is applied but cleaning up failed ({e}); run recover({state_dir!r})",
            journal.path, applied=True))
        return CommitResult(jid, plan.changes, counts, units=len(plan.units), linked=stager.stats.linked,
                            copied=stager.stats.copied, bytes_copied=stager.stats.bytes,
                            seconds=time.perf_counter() - t0, notes=notes)
    finally:
        plan.close()


def _replay(journal: Journal, action: str, failure: Callable[[Exception], CommitError]) -> None:
    """Run the journal's recovery `action` ("finish" or "undo"), then drop the
    journal; if that fails, release it for recover() and raise failure(e)."""
    rec = None
    try:
        rec = Recovery(load_journal(journal))
        getattr(rec, action)()
        journal.remove()
    except Exception as e:
        journal.unlock()
        raise failure(e) from e
    finally:
        if rec is not None:
            rec.close()


def _undo_after_failure(journal: Journal, exc: BaseException) -> None:
    """Roll back a commit that failed before its applied mark; then the caller re-raises
    (as CommitError unless it is one already or a BaseException like KeyboardInterrupt)."""
    if not os.path.exists(journal.path):                # failed before the first change
        journal.remove()
    else:
        _replay(journal, "undo", lambda e: CommitIncomplete(
            f"commit {journal.id} failed ({exc}) and undoing it failed too ({e}); run recover()",
            journal.path, applied=False))
    if isinstance(exc, OSError):
        raise fs_error(exc, "commit", exc.filename or "?") from exc
    if isinstance(exc, Exception) and not isinstance(exc, CaperError):
        raise CommitError(f"commit failed and was undone: {type(exc).__name__}: {exc}", step="commit") from exc


def _plan_paths(plan: Plan) -> set[str]:
    return ({plan.layers[u.layer].host.path(u.parent + (u.name,)) for u in plan.units}
            | {plan.layers[m.layer].host.path(m.rel) for m in plan.metas}
            | {plan.layers[m.layer].host.path(p) for m in plan.moves for p in (m.src, m.dst)})
