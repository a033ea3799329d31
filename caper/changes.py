"""The change types every stage shares: an overlay layer, and one change of the
host tree as the view lists it, the report shows it and the commit applies it."""
from __future__ import annotations

import stat
from dataclasses import dataclass

CREATED, MODIFIED, DELETED, REPLACED, META = "created", "modified", "deleted", "replaced", "meta"

_FTYPES = {
    stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket", stat.S_IFCHR: "chardev", stat.S_IFBLK: "blockdev",
}


def file_type(mode: int) -> str:
    return _FTYPES.get(stat.S_IFMT(mode), "other")


@dataclass(frozen=True)
class Layer:
    mount_point: str   # absolute host path the overlay covered, e.g. "/" or "/work/ws"
    upper: str         # the overlay's upper dir (absolute host path)
    userxattr: bool    # True: markers are user.overlay.*; False: trusted.overlay.*
    work: str = ""     # the overlay's work dir: with index=on, its index/ holds the copy-ups
                       # of hard-linked files, also those the run reached by no remaining name


@dataclass(frozen=True)
class Change:
    """One change of the host tree, for reports.

    kind: created | modified | deleted | replaced (the type changed) | meta
    (only mode/owner/xattrs/times).  ftype: the new type (the old one for
    deleted): file | dir | symlink | fifo | socket.  `entries` counts what a
    deleted directory held."""
    path: str
    kind: str
    ftype: str
    old_ftype: str | None = None
    detail: str = ""
    entries: int = 0
    privileges: tuple[str, ...] = ()  # of the new version: setuid, setgid, capabilities
    links_split: bool = False         # a new inode replaces a file that has other hard links
