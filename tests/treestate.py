"""A tree's state as a user would compare two trees: for each entry its type,
mode, data, sparse layout, symlink target, user xattrs and POSIX ACLs; which
names share an inode; and, for a directory, which directory of the tree
before it is (a rename keeps it; a copy or a new one is not it)."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

COMPARED_XATTRS = ("user.", "system.posix_acl_")

# struct posix_acl_xattr_header {u32 version = 2}; entries {u16 tag, u16 perm, u32 id}
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 1, 2, 4, 0x10, 0x20


def acl(mode: int, user: int, perm: int) -> bytes:
    """An access ACL: the owner, group and other bits of `mode`, and `perm` for `user`."""
    entries = [(_ACL_USER_OBJ, mode >> 6 & 7, 0xFFFFFFFF), (_ACL_USER, perm, user),
               (_ACL_GROUP_OBJ, mode >> 3 & 7, 0xFFFFFFFF), (_ACL_MASK, 7, 0xFFFFFFFF),
               (_ACL_OTHER, mode & 7, 0xFFFFFFFF)]
    return (2).to_bytes(4, "little") + b"".join(
        t.to_bytes(2, "little") + p.to_bytes(2, "little") + i.to_bytes(4, "little") for t, p, i in entries)


WAS = "user.treestate.was"      # marks each directory with its path before (a copy keeps it too)


def directories(root: Path) -> dict[str, int]:
    """Mark every directory below root with its path, and return path ->
    inode: a directory later is the one that was at that path when it has
    both the mark and the inode (an inode number alone may be reused)."""
    out = {}
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            rel = os.path.relpath(p, root)
            os.setxattr(p, WAS, rel.encode())
            out[rel] = os.lstat(p).st_ino
    return out


def _was(path: str, st: os.stat_result, dirs_before: dict[str, int]) -> str:
    try:
        rel = os.getxattr(path, WAS).decode()
    except OSError:
        return "new"
    return rel if dirs_before.get(rel) == st.st_ino else f"a copy of {rel}"


def _xattrs(path: str) -> dict[str, bytes]:
    names = [n for n in os.listxattr(path, follow_symlinks=False)
             if n.startswith(COMPARED_XATTRS) and n != WAS]
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in sorted(names)}


def _layout(path: str, size: int) -> tuple:
    """The data segments of a file (what is not a hole)."""
    out, off = [], 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:
                break
            off = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, off))
    finally:
        os.close(fd)
    return tuple(out)


def state(root: Path, dirs_before: dict[str, int]) -> dict[str, tuple]:
    """Every entry below root, by path. dirs_before: `directories(root)` taken
    before the change, to name each directory by where it was."""
    out: dict[str, tuple] = {}
    links: dict[int, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            mode = oct(stat.S_IMODE(st.st_mode))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode, _xattrs(p), _was(p, st, dirs_before))
            else:
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()[:16]
                out[rel] = ("file", mode, st.st_size, digest, _layout(p, st.st_size), _xattrs(p))
                if st.st_nlink > 1:
                    links.setdefault(st.st_ino, []).append(rel)
    for names in links.values():
        for n in names:
            out[n] += (("links", tuple(sorted(names))),)
    return out
