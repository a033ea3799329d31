"""The conflict threshold of a snapshot: a host change made before it has a
ctime below it, a change made after it a ctime at or above it.

The kernel stamps ctimes from its coarse clock, which lags the real time by
more than one 4 ms tick here. The portable threshold is the real time at
the snapshot, and the command must not start before the coarse clock has
caught up with it (median 4.8 ms of waiting measured here): then a file the
agent saved just before the run is not taken for an edit during it, and an
edit during the run is never missed.

Linux 6.13+ "multigrain" filesystems (ext4, xfs, btrfs, tmpfs, ...) need no
wait. Once a fine-grained ctime has been handed out, every later ctime on
any multigrain filesystem is at least that value (the kernel's global
timestamp floor), while every earlier one is below it. So the threshold is
the fine-grained ctime caper provokes on a probe file of its own, and the
command starts at once. That a filesystem type honours the floor is not
assumed from a list: it is shown once per process, on a file caper writes
in a directory of that type (its state directory, where the btrfs backend
snapshots the workspace, the temp directory, /var/tmp, /dev/shm, and last
the directories the command is expected to write in). A writable mount of a
type caper has no such directory on keeps the wait. /var/tmp is what shows
the root filesystem's type on a host whose /tmp is a tmpfs.

A filesystem that stores whole seconds (ext4 with 128-byte inodes; FAT,
two) cannot tell a change just before the snapshot from one just after: a
ctime of exactly .000000000 is compared with the threshold rounded down to
an even second (changed_since), which errs towards calling it a conflict.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Iterable

from caper.fs import mountinfo

CLOCK_REALTIME_COARSE = 5  # linux/time.h; the os module does not name it
SECOND_NS = 1_000_000_000
_COARSEST_NS = 2 * SECOND_NS   # FAT's granularity, the coarsest Linux writes
_TRIES = 4

# fstype -> shown to honour the floor (True) or shown not to (False), per process
_floor_shown: dict[str, bool] = {}


@dataclass(frozen=True, slots=True)
class Threshold:
    since_ns: int        # a host path with ctime >= since_ns changed after the snapshot
    not_before_ns: int   # 0, or: hold the command until CLOCK_REALTIME_COARSE reaches this


def take(state_dir: str, fstypes: Iterable[str], entries: list[mountinfo.MountEntry],
         own_dirs: Iterable[str] = ()) -> Threshold:
    """The threshold for a snapshot whose writable host mounts are of
    fstypes; state_dir holds the probe file. own_dirs: more directories
    caper writes in anyway (where the btrfs backend makes its snapshot, then
    where the command is expected to write), for showing the floor on their
    filesystems' types."""
    fd = os.open(os.path.join(state_dir, "ctime-probe"),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    candidates = (state_dir, tempfile.gettempdir(), "/var/tmp", "/dev/shm", *own_dirs)
    try:
        # The floor first: a probe file made and removed changes its
        # directory, and that change must fall below the threshold.
        if all(_honours_floor(t, candidates, fd, entries) for t in set(fstypes)):
            fine = fine_ctime(fd)
            if fine is not None:
                return Threshold(fine, 0)
    finally:
        os.close(fd)
    now = time.time_ns()
    return Threshold(now, now)


def fine_ctime(fd: int) -> int | None:
    """Change fd's inode so that the kernel stamps it from its fine clock,
    and return that ctime; None where it only stamps coarse times."""
    for _ in range(_TRIES):
        os.fstat(fd)            # a queried ctime is what makes the next one fine-grained
        before = time.time_ns()
        os.fchmod(fd, 0o600)    # any change stamps the ctime
        ctime = os.fstat(fd).st_ctime_ns
        if ctime >= before:
            return ctime
    return None


def _honours_floor(fstype: str, candidates: tuple[str, ...], probe_fd: int,
                   entries: list[mountinfo.MountEntry]) -> bool:
    if fstype not in _floor_shown:
        for directory in candidates:
            try:
                if mountinfo.containing(directory, entries).fstype == fstype:
                    shown = _show_floor(directory, probe_fd)
                    if shown is not None:
                        _floor_shown[fstype] = shown
                        break
            except OSError:
                continue
    return _floor_shown.get(fstype, False)


def _show_floor(directory: str, probe_fd: int) -> bool | None:
    """A fresh file in directory, changed right after a fine-grained stamp,
    while the coarse clock is still behind that stamp: is its ctime at
    least the stamp? None when the coarse clock caught up every time."""
    for _ in range(_TRIES):
        fd, path = tempfile.mkstemp(prefix=".caper-ctime-", dir=directory)
        try:
            stamp = fine_ctime(probe_fd)
            if stamp is None:
                return False
            os.fchmod(fd, 0o600)
            coarse = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
            ctime = os.fstat(fd).st_ctime_ns
        finally:
            os.close(fd)
            os.unlink(path)
        if coarse < stamp:
            return ctime >= stamp
    return None


def changed_since(ctime_ns: int, since_ns: int) -> bool:
    """Is a host path with this ctime changed at or after the threshold?"""
    if ctime_ns % SECOND_NS == 0:   # whole seconds (once in 10^9 by chance: then merely strict)
        since_ns -= since_ns % _COARSEST_NS
    return ctime_ns >= since_ns
