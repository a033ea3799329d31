"""Whether the btrfs tests can run here, and mkfs.btrfs."""
from __future__ import annotations

import os
import shutil

import caper.view.btrfs as B

# A user's PATH often lacks the sbin directories: look there too.
MKFS_BTRFS = shutil.which("mkfs.btrfs", path=os.pathsep.join(
    [os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"]))


def why_not_btrfs() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop mount, snapshot and tree-search ioctls)"
    try:
        with open("/proc/filesystems") as f:
            if "btrfs" not in f.read():
                return "the kernel lacks btrfs (not in /proc/filesystems)"
    except OSError as e:
        return f"cannot read /proc/filesystems: {e}"
    if MKFS_BTRFS is None:
        return "mkfs.btrfs missing (apt-get install btrfs-progs)"
    if B.btrfsutil is None:
        return "python module btrfsutil missing (pip install '.[btrfs]')"
    return None
