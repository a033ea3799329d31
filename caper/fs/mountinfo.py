"""/proc/self/mountinfo, read in one place (snapshot planning, the commit
engine's mount checks and the memory cgroup lookup all need it)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from caper.errors import CHROOT_HINT, SetupError

_ESCAPE = re.compile(rb"\\([0-7]{3})")


# The kernel's own filesystems: nothing of the user's is on them.
PSEUDO_FS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs",
    "tracefs", "bpf", "mqueue", "hugetlbfs", "fusectl", "configfs", "pstore", "binfmt_misc",
    "autofs", "efivarfs", "rpc_pipefs", "nsfs",
})


@dataclass(frozen=True, slots=True)
class MountEntry:
    point: str                      # the mount point, unescaped (may hold any byte)
    fstype: str
    read_only: bool                 # this mount's own "ro" flag
    super_options: frozenset[str]   # the filesystem's options (cgroup controllers ...)
    dev: str = ""                   # major:minor of the filesystem
    root: str = "/"                 # the directory of that filesystem mounted here (a bind's)


def _unescape(field: bytes) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo."""
    return os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), field))


def read(path: str = "/proc/self/mountinfo") -> list[MountEntry]:
    """Every mount of this mount namespace, in the kernel's order (parents first)."""
    out = []
    with open(path, "rb") as f:
        for line in f:
            left, _, right = line.rstrip(b"\n").partition(b" - ")
            fields, rfields = left.split(b" "), right.split(b" ")
            out.append(MountEntry(
                point=_unescape(fields[4]),
                fstype=rfields[0].decode(),
                read_only=b"ro" in fields[5].split(b","),
                super_options=frozenset(rfields[2].decode().split(",")) if len(rfields) > 2
                else frozenset(),
                dev=fields[2].decode(), root=_unescape(fields[3])))
    if not any(m.point == "/" for m in out):    # mounts above our / are not listed
        raise SetupError(f"no mount of {path} is at /: {CHROOT_HINT}", step="ROOT_VIEW")
    return out


def below(path: str, top: str) -> bool:
    """Is path top itself or inside it (as strings: no symlink is resolved)?"""
    return path == top or path.startswith(top.rstrip("/") + "/")


def containing(path: str, entries: list[MountEntry]) -> MountEntry:
    """The mount that holds path (after resolving its symlinks); of several
    on one point, the last mounted, which hides the others."""
    real = os.path.realpath(path)
    return max((m for m in reversed(entries) if below(real, m.point)), key=lambda m: len(m.point))


def aliases(path: str, entries: list[MountEntry]) -> list[str]:
    """The other paths that show directory `path`: through every mount of its
    filesystem whose root holds it (a bind mount of it or of a directory
    above it, a btrfs top level mounted elsewhere), checked by (st_dev,
    st_ino); and the mount points of its filesystem's mounts whose root lies
    inside it (a bind mount of a directory below it)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    home = containing(real, entries)
    inside = os.path.normpath(os.path.join(home.root, os.path.relpath(real, home.point)))
    out: list[str] = []
    for m in entries:
        if m.dev != home.dev:
            continue
        if below(m.root, inside) and m.root != inside:
            p = m.point
        elif below(inside, m.root):
            p = os.path.normpath(os.path.join(m.point, os.path.relpath(inside, m.root)))
            try:
                s = os.stat(p)
            except OSError:   # not reachable by this user, or hidden by another mount
                continue
            if (s.st_dev, s.st_ino) != (st.st_dev, st.st_ino):
                continue
        else:
            continue
        if not below(p, real) and p not in out:
            out.append(p)
    return out
