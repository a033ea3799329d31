"""caper.commit.engine: apply the overlay upper dirs of an approved run to the real tree.

    plan = plan_changes(layers)                       # read-only: what commit would do
    result = commit(layers, state_dir=..., since_ns=snapshot_ns, exclude=[scratch])
    recover(state_dir)                                # after a crash: finish or undo

The stages, in order (`commit` lists them):

1. **plan** (read-only).  Walk every upper dir (never the host tree, except
   below a directory that is deleted or replaced) and turn each entry into a
   *unit* (one host path swapped atomically: create, replace, delete) or a
   *meta* change of a merged directory.  Every host path the commit would
   change is checked: a ctime at or after `since_ns` means the host changed it
   during the run, and the whole commit is refused with `CommitConflict`
   before anything is touched.
2. **journal**.  `state_dir/journal/<id>.json` lists every unit with the
   hidden name (`.caper-<id>-<n>`, next to its target, so on the same
   filesystem) that stages its new content or keeps its old one.  Written
   and fsynced before the first change; rewritten (tmp + rename + fsync) at
   each phase: prepared -> staged -> applied.
3. **stage**.  New content is built at the hidden names: hard-linked from the
   upper when it is on the same filesystem (fast, and the upper stays intact
   for an undo), copied otherwise (EXDEV).  Overlay xattrs are stripped.
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

import errno
import json
import os
import re
import secrets
import stat
import time
from collections import Counter, OrderedDict
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from caper.changes import CREATED, DELETED, META, MODIFIED, REPLACED, Change, Layer, file_type
from caper.fs import mountinfo
from caper.commit.ctimes import changed_since
from caper.errors import CaperError, CommitConflict, CommitError, CommitIncomplete
from caper.commit.journal import Journal, fsync_dir, step
from caper.fs.syscalls import RENAME_EXCHANGE, RENAME_NOREPLACE, open_regular, renameat2, syncfs

__all__ = [
    "Layer", "Change", "CommitResult", "CommitError", "CommitConflict", "CommitIncomplete",
    "commit", "recover", "plan_changes",
]

# --- named defaults -----------------------------------------------------------

STAGE_PREFIX = ".caper-"          # hidden names: .caper-<id>-<n>
JOURNAL_DIR = "journal"
TRASH_DIR = "trash"                # beside each upper dir: see _Trash
JOURNAL_VERSION = 1
MAX_OPEN_DIRS = 256                # directory fds kept open per tree
COPY_CHUNK = 1 << 20
COMPARE_MAX = 1 << 20             # bytes compared to tell a meta-only change from a write
# Directory levels the planner follows (its walks recurse, and every level
# costs an fd and a path component): a deeper tree is refused, not committed.
MAX_TREE_DEPTH = 256

# unit operations
CREATE, REPLACE, DELETE = "create", "replace", "delete"

_OVERLAY_PREFIXES = ("trusted.overlay.", "user.overlay.")
_UNMANAGED_XATTRS = ("security.selinux",)      # labels belong to the host policy


# Measurement seams: every lstat and directory listing goes through these
# names, so a test can count them (tests/test_commit.py wraps them).
_lstat = os.lstat
_scandir = os.scandir


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


# --- syscalls Python lacks ------------------------------------------------------------

def _proc(fd: int) -> str:
    """Path of an O_PATH fd: operations on it reach the object itself, even a symlink."""
    return f"/proc/self/fd/{fd}"


def _mount_points() -> set[str]:
    """Every mount point of this mount namespace (a bind mount of the same
    filesystem has the same st_dev: only mountinfo shows it)."""
    try:
        return {m.point for m in mountinfo.read()}
    except OSError:
        return set()


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _error(e: OSError, what: str, path: str) -> CommitError:
    return CommitError(f"{what}({path}): {e.strerror or os.strerror(e.errno)}", step=what, err=e.errno or 0)


# --- directory fds -------------------------------------------------------------------

class _Dirs:
    """Directory fds below one root, each opened one component at a time with
    O_NOFOLLOW from its parent's fd.  A bounded LRU: an fd returned by `fd()`
    is valid until the next call to `fd()`, so callers fetch it at each use."""

    def __init__(self, root: str, own: bool = False):
        self.root = root
        # own: a tree of caper's (an upper dir). A directory there that the
        # command made unsearchable is opened by giving its owner rwx back
        # (root needs no such help); its mode was read before, by lstat.
        self.own = own and os.geteuid() != 0
        self._opened_up: dict[str, int] = {}   # path -> the mode it had, to give back
        self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._open: OrderedDict[tuple, int] = OrderedDict()
        self.dev = os.fstat(self._root_fd).st_dev

    def path(self, rel: Sequence[str]) -> str:
        if not rel:
            return self.root
        return self.root.rstrip("/") + "/" + "/".join(rel)

    def fd(self, rel: tuple) -> int:
        if not rel:
            return self._root_fd
        fd = self._open.get(rel)
        if fd is not None:
            self._open.move_to_end(rel)
            return fd
        parent = self.fd(rel[:-1])
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(rel[-1], flags, dir_fd=parent)
            except PermissionError:
                if not self.own:
                    raise
                # EACCES, not ELOOP: a real directory, not a symlink to follow.
                mode = os.stat(rel[-1], dir_fd=parent, follow_symlinks=False).st_mode
                os.chmod(rel[-1], stat.S_IMODE(mode) | 0o700, dir_fd=parent)
                self._opened_up[self.path(rel)] = stat.S_IMODE(mode)
                fd = os.open(rel[-1], flags, dir_fd=parent)
            if self.own:
                mode = os.fstat(fd).st_mode
                if mode & 0o700 != 0o700:  # readable but not searchable: entries unreachable
                    os.fchmod(fd, stat.S_IMODE(mode) | 0o700)
                    self._opened_up.setdefault(self.path(rel), stat.S_IMODE(mode))
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CommitError(f"{self.path(rel)}: not a directory (a symlink?); refusing to follow it",
                                  step="open", err=e.errno) from e
            raise _error(e, "open", self.path(rel)) from e
        self._open[rel] = fd
        while len(self._open) > MAX_OPEN_DIRS:
            _, old = self._open.popitem(last=False)
            os.close(old)
        return fd

    def true_mode(self, rel: tuple, st_mode: int) -> int:
        """st_mode as the command left it, before fd() opened the directory up."""
        given = self._opened_up.get(self.path(rel))
        return st_mode if given is None else (st_mode & ~0o7777) | given

    def lstat(self, rel: tuple, name: str) -> os.stat_result | None:
        try:
            return _lstat(name, dir_fd=self.fd(rel))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise _error(e, "lstat", self.path(rel + (name,))) from e

    def reset(self) -> None:
        """Close every fd but the root's (after entries were renamed)."""
        while self._open:
            os.close(self._open.popitem()[1])

    def close(self) -> None:
        self.reset()
        os.close(self._root_fd)
        # Modes given back deepest first, so each parent is still searchable.
        for path, mode in reversed(self._opened_up.items()):
            try:
                os.chmod(path, mode)
            except OSError:
                pass  # committed and emptied, or removed with the scratch dir
        self._opened_up.clear()


def _open_root(mount_point: str) -> _Dirs:
    if not os.path.isabs(mount_point) or os.path.normpath(mount_point) != mount_point:
        raise CommitError(f"mount point must be an absolute normalised path: {mount_point!r}", step="config")
    if os.path.realpath(mount_point) != mount_point:
        raise CommitError(f"mount point {mount_point} goes through a symlink; refusing", step="config")
    try:
        return _Dirs(mount_point)
    except OSError as e:
        raise _error(e, "open", mount_point) from e


# --- attributes ------------------------------------------------------------------------

def _managed(name: str) -> bool:
    return not name.startswith(_OVERLAY_PREFIXES) and name not in _UNMANAGED_XATTRS


def _xattrs_of(path_or_fd) -> dict[str, bytes]:
    """The xattrs commit carries over (all but overlay markers and security labels)."""
    try:
        names = os.listxattr(path_or_fd)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EPERM, errno.EACCES):
            return {}
        raise
    out = {}
    for n in names:
        if _managed(n):
            try:
                out[n] = os.getxattr(path_or_fd, n)
            except OSError as e:
                if e.errno not in (errno.ENODATA, errno.EPERM, errno.EACCES, errno.ENOTSUP):
                    raise
    return out


def _overlay_xattrs(path_or_fd, userxattr: bool) -> dict[str, bytes]:
    """This layer's overlay markers on an upper entry, keyed without the prefix."""
    prefix = "user.overlay." if userxattr else "trusted.overlay."
    try:
        names = os.listxattr(path_or_fd)
    except OSError:
        return {}
    return {n[len(prefix):]: os.getxattr(path_or_fd, n) for n in names if n.startswith(prefix)}


def privileges(path_or_fd, st: os.stat_result) -> tuple[str, ...]:
    """What a file would grant whoever runs it: setuid, setgid (with group
    execute; without it the bit means mandatory locking) and file
    capabilities (the security.capability xattr). Directories: none (setgid
    there only picks the group of new entries)."""
    if not stat.S_ISREG(st.st_mode):
        return ()
    out = []
    if st.st_mode & stat.S_ISUID:
        out.append("setuid")
    if st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IXGRP:
        out.append("setgid")
    try:
        if "security.capability" in os.listxattr(path_or_fd):
            out.append("capabilities")
    except OSError as e:
        if e.errno not in (errno.ENOTSUP, errno.EPERM, errno.EACCES):
            raise
    return tuple(out)


def _obj_fd(dfd: int, name: str) -> int:
    return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)


def _set_xattrs(target, new: dict[str, bytes], old: dict[str, bytes]) -> None:
    """Make the managed xattrs of `target` exactly `new` (old: what it has)."""
    for n in old:
        if n not in new:
            step("removexattr")
            try:
                os.removexattr(target, n)
            except OSError as e:
                if e.errno != errno.ENODATA and not n.startswith("security."):
                    raise
    for n, v in new.items():
        if old.get(n) != v:
            step("setxattr")
            try:
                os.setxattr(target, n, v)
            except OSError as e:
                # file capabilities and other security.* may be refused: not ours to force
                if not (n.startswith("security.") and e.errno in (errno.EPERM, errno.ENOTSUP, errno.EINVAL)):
                    raise


@contextmanager
def _xattrs_writable(ofd: int):
    """user.* xattrs need write permission on the inode: an unprivileged
    commit gives its owner u+w while it changes them on a read-only file of
    the user's own (the staged copy, or its old version), as `chmod u+w;
    setfattr; chmod u-w` would natively. Not a symlink's (their xattrs are
    not the user's to set) nor another owner's."""
    st = os.fstat(ofd)
    mode = stat.S_IMODE(st.st_mode)
    if (os.geteuid() == 0 or st.st_uid != os.geteuid() or mode & 0o200
            or stat.S_ISLNK(st.st_mode)):
        yield
        return
    step("chmod")
    os.chmod(_proc(ofd), mode | 0o200)
    try:
        yield
    finally:
        os.chmod(_proc(ofd), mode)


def _set_owner(target, uid: int, gid: int) -> None:
    step("chown")
    try:
        os.chown(target, uid, gid)
    except PermissionError:
        if os.geteuid() == 0:
            raise       # rootless: the files are ours already


def _apply_attrs(dfd: int, name: str, mode: int, uid: int, gid: int, xattrs: dict[str, bytes] | None,
                 times: tuple[int, int] | None, old_xattrs: dict[str, bytes] | None = None) -> None:
    """Owner, xattrs, mode, times of the entry `name` in `dfd`, never following it."""
    ofd = _obj_fd(dfd, name)
    try:
        p = _proc(ofd)
        st = os.fstat(ofd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            _set_owner(p, uid, gid)
        if xattrs is not None:
            _set_xattrs(p, xattrs, _xattrs_of(p) if old_xattrs is None else old_xattrs)
        if not stat.S_ISLNK(st.st_mode):
            step("chmod")
            os.chmod(p, stat.S_IMODE(mode))        # after chown, which clears set-id bits
        if times is not None:
            step("utime")
            os.utime(p, ns=times)
    finally:
        os.close(ofd)


def _meta_of(p: str, st: os.stat_result) -> dict:
    return {"mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
            "xattrs": {k: v.hex() for k, v in _xattrs_of(p).items()}}


_ACLS = {"system.posix_acl_access": "acl", "system.posix_acl_default": "default acl"}
_ACL_TAG = {1: "user:", 2: "user:", 4: "group:", 8: "group:", 0x10: "mask:", 0x20: "other:"}
_NAMED = (2, 8)           # ACL_USER, ACL_GROUP: entries naming another user or group


def grants(xattrs: dict[str, bytes]) -> list[str]:
    """What these xattrs grant, as the user would read it: each POSIX ACL
    entry that names a user or group (`acl user:1001:rwx`: another user may
    write there; the owner, group and other entries are the mode, shown as
    such), and every security.* attribute (`security.capability`: the file
    gives privileges to whoever runs it)."""
    out = []
    for name, value in sorted(xattrs.items()):
        if name in _ACLS:
            # struct posix_acl_xattr_header {u32 version}; entries {u16 tag, u16 perm, u32 id}
            entries = [(int.from_bytes(value[i:i + 2], "little"),
                        int.from_bytes(value[i + 2:i + 4], "little"),
                        int.from_bytes(value[i + 4:i + 8], "little"))
                       for i in range(4, len(value) - 7, 8)]
            for tag, perm, eid in entries:
                if tag in _NAMED:
                    rwx = "".join(c if perm & b else "-" for c, b in (("r", 4), ("w", 2), ("x", 1)))
                    out.append(f"{_ACLS[name]} {_ACL_TAG[tag]}{eid}:{rwx}")
        elif name.startswith("security."):
            out.append(name)
    return out


def _meta_diff(old: dict, new: dict) -> list[str]:
    out = []
    if old["mode"] != new["mode"]:
        out.append(f"mode {old['mode']:04o}->{new['mode']:04o}")
    if (old["uid"], old["gid"]) != (new["uid"], new["gid"]):
        out.append(f"owner {old['uid']}:{old['gid']}->{new['uid']}:{new['gid']}")
    if old["xattrs"] != new["xattrs"]:
        keys = set(old["xattrs"]) | set(new["xattrs"])
        changed = sorted(k for k in keys if old["xattrs"].get(k) != new["xattrs"].get(k))
        out.append("xattrs " + ",".join(changed))
        given = grants({k: bytes.fromhex(new["xattrs"][k]) for k in changed if k in new["xattrs"]})
        if given:
            out.append("grants " + ", ".join(given))
    return out


def _set_meta(dfd: int, name: str, meta: dict) -> None:
    ofd = _obj_fd(dfd, name)
    try:
        p = _proc(ofd)
        st = os.fstat(ofd)
        if (st.st_uid, st.st_gid) != (meta["uid"], meta["gid"]):
            _set_owner(p, meta["uid"], meta["gid"])
        want, have = {k: bytes.fromhex(v) for k, v in meta["xattrs"].items()}, _xattrs_of(p)
        if want != have:
            with _xattrs_writable(ofd):
                _set_xattrs(p, want, have)
        if stat.S_IMODE(os.fstat(ofd).st_mode) != meta["mode"]:
            step("chmod")
            os.chmod(p, meta["mode"])
    finally:
        os.close(ofd)


# --- removing trees -----------------------------------------------------------------------

@contextmanager
def _entered(dfd: int):
    """A directory of the user's own may shut its owner out (chmod 555, 600)
    where a native run had opened it for a moment (chmod u+w; edit; chmod
    u-w): an unprivileged commit opens it for the renames and deletions it
    does there, then shuts it again. (Root needs no such help; another
    owner's directory is not ours to open, and the change fails as it would
    natively.) A kill in between leaves it open: the journal lists the
    directories it opens (_shut_dirs), and recovery shuts them again."""
    st = os.fstat(dfd)
    mode = stat.S_IMODE(st.st_mode)
    if os.geteuid() == 0 or st.st_uid != os.geteuid() or mode & 0o300 == 0o300:
        yield
        return
    fd = os.dup(dfd)            # the caller's fd may be closed meanwhile (_Dirs is an LRU)
    try:
        os.fchmod(fd, mode | 0o300)
        try:
            yield
        finally:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _depth_ok(tree: "_Dirs", rel: tuple) -> None:
    if len(rel) > MAX_TREE_DEPTH:
        raise CommitError(f"{tree.path(rel[:8])}/...: more than {MAX_TREE_DEPTH} directory "
                          "levels; caper does not commit trees this deep", step="plan")


_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def rmtree_at(dfd: int, name: str, dev: int, where: str, force: bool = False) -> int:
    """Delete `name` in `dfd` and all below it, never following a symlink and
    never crossing into another filesystem.  Returns the entries removed.
    force: open up directories shut by chmod first (caper's own scratch).

    Iterative, with one directory open at a time: a tree may be deeper than
    Python's stack and than PATH_MAX (a run can make 3,000 levels).  The way
    back up is "..", checked against the (dev, inode) it came down from."""
    try:
        st = _lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        step("unlink")
        os.unlink(name, dir_fd=dfd)
        return 1
    down: list[tuple[str, int]] = []     # (name, inode) of each directory entered
    fd, n = os.dup(dfd), 0
    try:
        while True:
            child = name if not down else None
            if child is None:
                with _scandir(fd) as it:
                    names = [e.name for e in it]
                for c in names:
                    cst = _lstat(c, dir_fd=fd)
                    if stat.S_ISDIR(cst.st_mode):
                        child, st = c, cst
                        break
                    step("unlink")
                    os.unlink(c, dir_fd=fd)
                    n += 1
            if child is not None:            # go down into it
                here = f"{where}/{name}" if len(down) < 2 else f"{where}/{name}/..."
                if st.st_dev != dev:
                    raise CommitError(f"{here}/{child}: a mount point; refusing to delete "
                                      "below it", step="rmtree")
                # A directory of the user's own that shuts them out (chmod 555)
                # is opened to be emptied, as a native rm -rf run by its owner
                # could not do either without chmod: see _entered.
                if st.st_mode & 0o700 != 0o700 and (force or _own_shut(st)):
                    os.chmod(child, 0o700, dir_fd=fd)
                cfd = os.open(child, _DIR_OPEN, dir_fd=fd)
                os.close(fd)
                fd = cfd
                if os.fstat(fd).st_ino != st.st_ino:
                    raise CommitError(f"{here}/{child}: replaced while it was deleted; refusing",
                                      step="rmtree")
                down.append((child, st.st_ino))
                continue
            # fd is empty now: up one level, and remove it there.
            done, _ = down.pop()
            pfd = os.open("..", _DIR_OPEN, dir_fd=fd)
            os.close(fd)
            fd = pfd
            top = os.fstat(dfd)
            above = (dev, down[-1][1]) if down else (top.st_dev, top.st_ino)
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) != above:
                raise CommitError(f"{where}/{name}: moved while it was deleted; refusing",
                                  step="rmtree")
            step("rmdir")
            os.rmdir(done, dir_fd=fd)
            n += 1
            if not down:
                return n
    finally:
        os.close(fd)


def _own_shut(st: os.stat_result) -> bool:
    """A directory of this unprivileged user's that shuts them out."""
    return os.geteuid() != 0 and st.st_uid == os.geteuid() and st.st_mode & 0o300 != 0o300


def _exists(dfd: int, name: str) -> os.stat_result | None:
    try:
        return _lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return None


# --- the plan ---------------------------------------------------------------------------------

@dataclass
class _Unit:
    op: str                       # create | replace | delete
    layer: int
    parent: tuple                 # host dir, relative to the mount point
    name: str
    upper: tuple | None = None    # new content, relative to the upper dir
    host_ino: int | None = None   # what the host had (replace, delete)
    tree: list | None = None      # new directory: [(rel below it, lstat)] pre-order
    stage: str = ""
    staged_ino: int | None = None

    def to_json(self) -> dict:
        return {"op": self.op, "layer": self.layer, "parent": list(self.parent), "name": self.name,
                "upper": None if self.upper is None else list(self.upper),
                "host_ino": self.host_ino, "stage": self.stage, "staged_ino": self.staged_ino}


@dataclass
class _Meta:
    layer: int
    rel: tuple
    ino: int
    old: dict
    new: dict


@dataclass
class _Times:
    layer: int
    rel: tuple
    old: tuple[int, int]
    new: tuple[int, int] | None


class _LayerPlan:
    def __init__(self, index: int, layer: Layer, exclude: list[str], mounts: set[str]):
        self.index = index
        self.layer = layer
        self.exclude = exclude
        below = layer.mount_point.rstrip("/") + "/"
        self.mounts = {m for m in mounts if m.startswith(below)}   # mounts the overlay did not show
        self.host = _open_root(layer.mount_point)
        try:
            self.up = _Dirs(layer.upper, own=True)
        except OSError as e:
            self.host.close()
            raise _error(e, "open", layer.upper) from e
        self.dev = self.host.dev
        self.can_link = True

    def excluded(self, hp: str) -> bool:
        return any(mountinfo.below(hp, e) for e in self.exclude)

    def excluded_below(self, hp: str) -> bool:
        return any(e.startswith(hp.rstrip("/") + "/") for e in self.exclude)

    def check_mount(self, hp: str, below: bool) -> None:
        """CASE(*, mount): refuse a host path that is a mount point (or has one below
        it, for a tree the commit removes): the overlay showed what is under it."""
        if hp in self.mounts or (below and any(m.startswith(hp + "/") for m in self.mounts)):
            raise CommitError(f"{hp}: a mount point is at or below this path on the host; refusing",
                              step="plan")

    def boundary(self, hp: str) -> str:
        """What a directory on another st_dev than its layer's mount is."""
        if hp in self.mounts:
            return "a mount point on the host"
        # btrfs gives each subvolume its own st_dev; the overlay spans them,
        # one commit does not (renames between subvolumes fail with EXDEV).
        return ("a btrfs subvolume on the host, or another filesystem, not mounted there (the "
                "overlay backend commits within one; as root, a workspace that is a subvolume "
                "takes the btrfs backend)")

    def close(self) -> None:
        self.host.close()
        self.up.close()


@dataclass
class _Plan:
    layers: list[_LayerPlan]
    units: list[_Unit] = field(default_factory=list)
    metas: list[_Meta] = field(default_factory=list)
    times: list[_Times] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    shut: list[dict] = field(default_factory=list)   # see _shut_dirs

    def close(self) -> None:
        for lp in self.layers:
            lp.close()


class _Planner:
    """Read-only walk of the upper dirs.  `since_ns` None: no conflict checks."""

    def __init__(self, layers: Sequence[Layer], exclude: Iterable[str], since_ns: int | None):
        self.since = since_ns
        excl = sorted({os.path.normpath(os.path.abspath(e)) for e in exclude})
        mounts = [os.path.normpath(l.mount_point) for l in layers]
        if len(set(mounts)) != len(mounts):
            raise CommitError(f"two layers cover the same mount point: {mounts}", step="config")
        lps = []
        all_mounts = _mount_points()
        try:
            for layer in layers:
                if _untouched(layer.upper):
                    # Nothing to commit, and nothing to open: its mount may have
                    # gone from the host during the run (a busy host's mounts come
                    # and go), and rootless there are dozens of such layers.
                    continue
                # other layers' mount points below this one are theirs, not ours
                nested = [m for m in mounts if m != layer.mount_point
                          and m.startswith(layer.mount_point.rstrip("/") + "/")]
                lps.append(_LayerPlan(len(lps), layer, excl + nested, all_mounts))
        except BaseException:
            for lp in lps:
                lp.close()
            raise
        self.plan = _Plan(lps)

    def run(self) -> _Plan:
        try:
            for lp in self.plan.layers:
                root = lp.host.lstat((), ".")
                self.plan.times.append(_Times(lp.index, (), (root.st_atime_ns, root.st_mtime_ns), None))
                self._walk(lp, (), (), opaque=False)
        except BaseException:
            self.plan.close()
            raise
        return self.plan

    # -- helpers
    def _conflict(self, hp: str, st: os.stat_result) -> None:
        # CASE(*, changed-on-host): ctime at/after the snapshot (caper.commit.ctimes)
        if self.since is not None and changed_since(st.st_ctime_ns, self.since):
            self.plan.conflicts.append(hp)

    def _upper_marks(self, lp: _LayerPlan, urel: tuple, ust: os.stat_result) -> dict[str, bytes]:
        if stat.S_ISLNK(ust.st_mode):
            return {}
        ofd = _obj_fd(lp.up.fd(urel[:-1]), urel[-1])
        try:
            marks = _overlay_xattrs(_proc(ofd), lp.layer.userxattr)
        finally:
            os.close(ofd)
        up = lp.up.path(urel)
        # CASE(redirect, *): a renamed merged dir (redirect_dir=on) or a metacopy
        # file (metacopy=on) has its data elsewhere: refused, never half-applied.
        for key in ("redirect", "metacopy"):
            if key in marks:
                raise CommitError(f"{up}: overlay {key} xattr (redirect_dir/metacopy mounts are not supported)",
                                  step="plan")
        if "opaque" in marks and marks["opaque"] != b"y":
            raise CommitError(f"{up}: unsupported overlay opaque value {marks['opaque']!r}", step="plan")
        return marks

    # -- the walk
    def _walk(self, lp: _LayerPlan, urel: tuple, hrel: tuple, opaque: bool) -> None:
        """Upper dir `urel` over the host dir `hrel` (which exists).  `opaque`:
        the host's entries are hidden (this dir or one above is opaque)."""
        _depth_ok(lp.host, hrel)
        with _scandir(lp.up.fd(urel)) as it:
            names = sorted(e.name for e in it)
        kept: set[str] = set()
        for name in names:
            hp = lp.host.path(hrel + (name,))
            if lp.excluded(hp):
                # CASE(*, excluded): caper's own dirs, other layers' mount points
                kept.add(name)
                continue
            lp.check_mount(hp, below=False)
            u = urel + (name,)
            ust = _lstat(name, dir_fd=lp.up.fd(urel))
            hst = lp.host.lstat(hrel, name)
            fmt = stat.S_IFMT(ust.st_mode)
            if _is_whiteout(ust):
                if opaque:
                    continue                    # hidden anyway; the sweep below deletes it
                if hst is None:
                    continue                    # CASE(whiteout, none): already gone
                # CASE(whiteout, file)  CASE(whiteout, symlink)  CASE(whiteout, dir)
                self._delete(lp, hrel, name, hst)
                continue
            kept.add(name)
            if fmt == stat.S_IFDIR:
                marks = self._upper_marks(lp, u, ust)
                is_opaque = marks.get("opaque") == b"y"
                if hst is None:
                    # CASE(dir, none)  CASE(opaque, none): a new tree
                    self._new(lp, CREATE, u, hrel, name, None)
                elif stat.S_ISDIR(hst.st_mode):
                    if hst.st_dev != lp.dev:
                        # CASE(*, mount): another filesystem mounted on the host since
                        raise CommitError(f"{hp}: {lp.boundary(hp)}; refusing to commit below it",
                                          step="plan")
                    # CASE(dir, dir): merged: keep what the upper does not mention
                    # CASE(opaque, dir): the host's entries go, the upper's stay
                    self._dir_meta(lp, u, hrel + (name,), ust, hst)
                    self._walk(lp, u, hrel + (name,), opaque or is_opaque)
                elif opaque or is_opaque:
                    # CASE(opaque, file)  CASE(opaque, symlink): type change
                    self._new(lp, REPLACE, u, hrel, name, hst)
                else:
                    # CASE(dir, file)  CASE(dir, symlink): overlayfs marks a directory
                    # made over a deleted host entry opaque; a plain one here means the
                    # host changed or the upper is not from this tree.  Never follow.
                    raise CommitError(f"{hp}: the run saw a directory here but the host has a "
                                      f"{file_type(hst.st_mode)}; refusing", step="plan")
            elif fmt in (stat.S_IFREG, stat.S_IFLNK, stat.S_IFIFO, stat.S_IFSOCK):
                if fmt == stat.S_IFREG:
                    self._upper_marks(lp, u, ust)
                if hst is None:
                    # CASE(file, none)  CASE(symlink, none)  CASE(fifo, none)
                    self._unit(lp, CREATE, u, hrel, name, None, ust)
                    self.plan.changes.append(Change(hp, CREATED, file_type(ust.st_mode), None,
                                                    self._link_detail(lp, u, ust),
                                                    privileges=self._privileges(lp, u, ust)))
                elif stat.S_ISDIR(hst.st_mode):
                    # CASE(file, dir)  CASE(symlink, dir): the host tree goes
                    n = self._doomed(lp, hrel, name, hst, replacing=True)
                    self._unit(lp, REPLACE, u, hrel, name, hst, ust)
                    self.plan.changes.append(Change(hp, REPLACED, file_type(ust.st_mode), "dir",
                                                    self._link_detail(lp, u, ust), n,
                                                    self._privileges(lp, u, ust)))
                else:
                    # CASE(file, file)  CASE(file, symlink)  CASE(symlink, file)  CASE(symlink, symlink)
                    self._replace_leaf(lp, u, hrel, name, ust, hst)
            else:
                # CASE(device, *): the sandbox cannot make devices; never committed
                raise CommitError(f"{lp.up.path(u)}: a {file_type(ust.st_mode)} in the upper dir; refusing",
                                  step="plan")
        if opaque:
            with _scandir(lp.host.fd(hrel)) as it:
                host_names = sorted(e.name for e in it)
            for name in host_names:
                if name in kept or lp.excluded(lp.host.path(hrel + (name,))):
                    continue
                hst = lp.host.lstat(hrel, name)
                if hst is not None:
                    self._delete(lp, hrel, name, hst)

    def _privileges(self, lp: _LayerPlan, u: tuple, ust: os.stat_result) -> tuple[str, ...]:
        if not stat.S_ISREG(ust.st_mode):
            return ()
        ofd = _obj_fd(lp.up.fd(u[:-1]), u[-1])
        try:
            return privileges(_proc(ofd), ust)
        finally:
            os.close(ofd)

    def _link_detail(self, lp: _LayerPlan, u: tuple, ust: os.stat_result) -> str:
        """A new entry's detail: a symlink's target; what its ACLs and
        security.* xattrs grant, which commit carries over with it."""
        if stat.S_ISLNK(ust.st_mode):
            return "-> " + os.readlink(u[-1], dir_fd=lp.up.fd(u[:-1]))
        fd = _obj_fd(lp.up.fd(u[:-1]), u[-1]) if u else None
        try:
            given = grants(_xattrs_of(_proc(fd) if fd is not None else lp.up.path(u)))
        finally:
            if fd is not None:
                os.close(fd)
        return "grants " + ", ".join(given) if given else ""

    def _unit(self, lp, op, u, hrel, name, hst, ust=None, tree=None) -> _Unit:
        unit = _Unit(op, lp.index, hrel, name, u, None if hst is None else hst.st_ino, tree)
        self.plan.units.append(unit)
        return unit

    def _replace_leaf(self, lp, u, hrel, name, ust, hst) -> None:
        hp = lp.host.path(hrel + (name,))
        new_t, old_t = file_type(ust.st_mode), file_type(hst.st_mode)
        if new_t != old_t:
            self._conflict(hp, hst)
            self._unit(lp, REPLACE, u, hrel, name, hst, ust)
            self.plan.changes.append(Change(hp, REPLACED, new_t, old_t, self._link_detail(lp, u, ust),
                                            privileges=self._privileges(lp, u, ust)))
            return
        diff = self._leaf_diff(lp, u, hrel, name, ust, hst)
        if diff is None:
            return                                  # copied up but unchanged: nothing to do
        self._conflict(hp, hst)
        kind, detail, old_m, new_m = diff
        if kind == META and stat.S_ISREG(ust.st_mode) and ust.st_nlink == 1:
            # CASE(file-meta, file): a chmod or touch changes the host's inode in
            # place, as natively: its hard links follow, and no write permission
            # on the file or its directory is needed (a read-only git object).
            rel = hrel + (name,)
            self.plan.metas.append(_Meta(lp.index, rel, hst.st_ino, old_m, new_m))
            self.plan.times.append(_Times(lp.index, rel, (hst.st_atime_ns, hst.st_mtime_ns),
                                          (ust.st_atime_ns, ust.st_mtime_ns)))
        else:
            self._unit(lp, REPLACE, u, hrel, name, hst, ust)
        self.plan.changes.append(Change(hp, kind, new_t, None, detail,
                                        privileges=self._privileges(lp, u, ust)))

    def _leaf_diff(self, lp, u, hrel, name, ust, hst) -> tuple[str, str, dict, dict] | None:
        """(kind, detail, host's meta, upper's meta) of an upper entry over a host
        entry of the same type, or None if equal."""
        if stat.S_ISLNK(ust.st_mode):
            new = os.readlink(u[-1], dir_fd=lp.up.fd(u[:-1]))
            old = os.readlink(name, dir_fd=lp.host.fd(hrel))
            if new != old:
                return MODIFIED, f"-> {new}", {}, {}
        same_content = True
        if stat.S_ISREG(ust.st_mode):
            # Reading both is only worth it to tell a chmod/touch (meta) from a write:
            # a big file whose mtime moved counts as modified unread.
            same_content = (ust.st_size == hst.st_size
                            and (ust.st_mtime_ns == hst.st_mtime_ns or ust.st_size <= COMPARE_MAX)
                            and self._same_bytes(lp, u, hrel, name))
        uo = _obj_fd(lp.up.fd(u[:-1]), u[-1])
        ho = _obj_fd(lp.host.fd(hrel), name)
        try:
            new_m, old_m = _meta_of(_proc(uo), ust), _meta_of(_proc(ho), hst)
        finally:
            os.close(uo)
            os.close(ho)
        if not same_content:
            return MODIFIED, "", old_m, new_m
        details = _meta_diff(old_m, new_m)
        if ust.st_mtime_ns != hst.st_mtime_ns:
            details.append("mtime")
        if not details and ust.st_nlink == 1:
            return None
        return META, "; ".join(details), old_m, new_m

    def _same_bytes(self, lp, u, hrel, name) -> bool:
        a = os.open(u[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=lp.up.fd(u[:-1]))
        try:
            b = open_regular(name, lp.host.fd(hrel))   # swapped for a FIFO or device: not opened
        except OSError:
            os.close(a)
            return False
        try:
            while True:
                x, y = os.read(a, COPY_CHUNK), os.read(b, COPY_CHUNK)
                if x != y:
                    return False
                if not x:
                    return True
        finally:
            os.close(a)
            os.close(b)

    def _dir_meta(self, lp, u, hrel, ust, hst) -> None:
        # the run's times, unless the host changed the directory's entries since
        host_touched = self.since is not None and hst.st_mtime_ns >= self.since
        self.plan.times.append(_Times(lp.index, hrel, (hst.st_atime_ns, hst.st_mtime_ns),
                                      None if host_touched else (ust.st_atime_ns, ust.st_mtime_ns)))
        uo = _obj_fd(lp.up.fd(u[:-1]), u[-1])
        ho = _obj_fd(lp.host.fd(hrel[:-1]), hrel[-1])
        try:
            new, old = _meta_of(_proc(uo), ust), _meta_of(_proc(ho), hst)
        finally:
            os.close(uo)
            os.close(ho)
        details = _meta_diff(old, new)
        if details:
            hp = lp.host.path(hrel)
            self._conflict(hp, hst)
            self.plan.metas.append(_Meta(lp.index, hrel, hst.st_ino, old, new))
            self.plan.changes.append(Change(hp, META, "dir", None, "; ".join(details)))

    def _new(self, lp, op, u, hrel, name, hst) -> None:
        """A directory from the upper replaces nothing (create) or a host non-directory."""
        hp = lp.host.path(hrel + (name,))
        if hst is not None:
            self._conflict(hp, hst)
        tree = []
        changes = [Change(hp, CREATED if hst is None else REPLACED, "dir",
                          None if hst is None else file_type(hst.st_mode),
                          self._link_detail(lp, u, _lstat(u[-1], dir_fd=lp.up.fd(u[:-1]))))]

        def scan(trel: tuple) -> None:
            _depth_ok(lp.host, hrel + (name,) + trel)
            ufd = lp.up.fd(u + trel)
            with _scandir(ufd) as it:
                names = sorted(e.name for e in it)
            for n in names:
                cp = lp.host.path(hrel + (name,) + trel + (n,))
                if lp.excluded(cp):
                    continue
                st = _lstat(n, dir_fd=lp.up.fd(u + trel))
                if _is_whiteout(st):
                    # CASE(*, changed-on-host): a whiteout means the dir had lower entries:
                    # it existed at the snapshot and the host deleted it during the run
                    if hst is None and self.since is not None:
                        self.plan.conflicts.append(hp)
                    continue
                fmt = stat.S_IFMT(st.st_mode)
                if fmt == stat.S_IFDIR:
                    self._upper_marks(lp, u + trel + (n,), st)
                elif fmt == stat.S_IFREG:
                    self._upper_marks(lp, u + trel + (n,), st)
                elif fmt not in (stat.S_IFLNK, stat.S_IFIFO, stat.S_IFSOCK):
                    raise CommitError(f"{lp.up.path(u + trel + (n,))}: a {file_type(st.st_mode)} "
                                      f"in the upper dir; refusing", step="plan")
                tree.append((trel + (n,), st))
                changes.append(Change(cp, CREATED, file_type(st.st_mode), None,
                                      self._link_detail(lp, u + trel + (n,), st),
                                      privileges=self._privileges(lp, u + trel + (n,), st)))
                if fmt == stat.S_IFDIR:
                    scan(trel + (n,))

        scan(())
        self._unit(lp, op, u, hrel, name, hst, tree=tree)
        self.plan.changes.extend(changes)

    def _delete(self, lp, hrel, name, hst) -> None:
        _depth_ok(lp.host, hrel)
        hp = lp.host.path(hrel + (name,))
        if stat.S_ISDIR(hst.st_mode) and lp.excluded_below(hp):
            # CASE(whiteout, dir-with-excluded): keep the directory and what is
            # excluded below it, delete the rest
            with _scandir(lp.host.fd(hrel + (name,))) as it:
                names = sorted(e.name for e in it)
            for n in names:
                if lp.excluded(lp.host.path(hrel + (name, n))):
                    continue
                st = lp.host.lstat(hrel + (name,), n)
                if st is not None:
                    self._delete(lp, hrel + (name,), n, st)
            return
        n = self._doomed(lp, hrel, name, hst, replacing=False)
        self._unit(lp, DELETE, None, hrel, name, hst)
        self.plan.changes.append(Change(hp, DELETED, file_type(hst.st_mode), None, "", n))

    def _doomed(self, lp, hrel, name, hst, replacing: bool) -> int:
        """Check a host entry (and the tree below it) that the commit removes:
        conflicts, mount points, excluded paths.  Returns the entries below it."""
        hp = lp.host.path(hrel + (name,))
        self._conflict(hp, hst)
        if not stat.S_ISDIR(hst.st_mode):
            return 0
        if replacing and lp.excluded_below(hp):
            raise CommitError(f"{hp}: the run replaced this directory, which holds an excluded path; refusing",
                              step="plan")
        if hst.st_dev != lp.dev:
            raise CommitError(f"{hp}: {lp.boundary(hp)}; refusing to delete it", step="plan")
        lp.check_mount(hp, below=True)

        def walk(fd: int, where: str, depth: int) -> int:
            if depth > MAX_TREE_DEPTH:
                raise CommitError(f"{hp}: more than {MAX_TREE_DEPTH} directory levels below "
                                  "a directory the run deletes; refusing", step="plan")
            count = 0
            with _scandir(fd) as it:
                names = [e.name for e in it]
            for n in names:
                st = _lstat(n, dir_fd=fd)
                p = where + "/" + n
                self._conflict(p, st)
                count += 1
                if stat.S_ISDIR(st.st_mode):
                    if st.st_dev != lp.dev:
                        raise CommitError(f"{p}: {lp.boundary(p)} below a directory the run deletes; "
                                          "refusing", step="plan")
                    cfd = os.open(n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    try:
                        count += walk(cfd, p, depth + 1)
                    finally:
                        os.close(cfd)
            return count

        dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=lp.host.fd(hrel))
        try:
            return walk(dfd, hp, len(hrel) + 1)
        finally:
            os.close(dfd)


def _untouched(upper: str) -> bool:
    """An upper dir the run never wrote to (an unreadable one counts as written)."""
    try:
        with _scandir(upper) as it:
            return next(it, None) is None
    except OSError:
        return False


def _make_plan(layers: Sequence[Layer], exclude: Iterable[str], since_ns: int | None) -> _Plan:
    try:
        return _Planner(layers, exclude, since_ns).run()
    except OSError as e:
        raise _error(e, "plan", e.filename or "?") from e


def plan_changes(layers: Sequence[Layer], exclude: Iterable[str] = ()) -> list[Change]:
    """What `commit` would do, without conflict checks or any change."""
    plan = _make_plan(layers, exclude, None)
    plan.close()
    return plan.changes


# --- the journal ---------------------------------------------------------------------------

def _journal(state_dir: str, jid: str) -> Journal:
    return Journal(state_dir, JOURNAL_DIR, jid)


def _journal_data(jid: str, phase: str, plan: _Plan) -> dict:
    return {
        "version": JOURNAL_VERSION, "id": jid, "phase": phase,
        "layers": [{"mount_point": lp.layer.mount_point, "upper": lp.layer.upper, "dev": lp.dev}
                   for lp in plan.layers],
        "units": [u.to_json() for u in plan.units],
        "metas": [{"layer": m.layer, "rel": list(m.rel), "ino": m.ino, "old": m.old, "new": m.new}
                  for m in plan.metas],
        "times": [{"layer": t.layer, "rel": list(t.rel), "old": list(t.old),
                   "new": None if t.new is None else list(t.new)} for t in plan.times],
        "shut": plan.shut,
    }


def _shut_dirs(plan: _Plan) -> list[dict]:
    """The user's own directories the commit will open for a moment (see
    _entered), with their modes: a kill while one is open leaves it open,
    and recovery shuts it again from this record."""
    if os.geteuid() == 0:
        return []
    out, seen = [], set()
    for u in plan.units:
        if (u.layer, u.parent) in seen:
            continue
        seen.add((u.layer, u.parent))
        st = os.fstat(plan.layers[u.layer].host.fd(u.parent))
        if st.st_uid == os.geteuid() and st.st_mode & 0o300 != 0o300:
            out.append({"layer": u.layer, "rel": list(u.parent), "mode": stat.S_IMODE(st.st_mode),
                        "ino": st.st_ino})
    return out


# --- stage, swap, finish, undo --------------------------------------------------------------------

@dataclass
class _Stats:
    linked: int = 0
    copied: int = 0
    bytes: int = 0


class _Stager:
    def __init__(self, plan: _Plan):
        self.plan = plan
        self.stats = _Stats()
        self.hardlinks: dict[tuple[int, int], tuple[int, tuple, str]] = {}   # upper inode -> staged copy

    def stage(self, unit: _Unit) -> None:
        lp = self.plan.layers[unit.layer]
        if unit.op == DELETE:
            return
        with _entered(lp.host.fd(unit.parent)):
            self._stage(lp, unit)
        unit.staged_ino = _lstat(unit.stage, dir_fd=lp.host.fd(unit.parent)).st_ino

    def _stage(self, lp: _LayerPlan, unit: _Unit) -> None:
        if unit.tree is None:
            self._entry(lp, unit.upper, unit.parent, unit.stage)
        else:
            base = unit.parent + (unit.stage,)
            step("mkdir")
            os.mkdir(unit.stage, 0o700, dir_fd=lp.host.fd(unit.parent))
            dirs: list[tuple] = [()]
            for trel, st in unit.tree:
                if stat.S_ISDIR(st.st_mode):
                    step("mkdir")
                    os.mkdir(trel[-1], 0o700, dir_fd=lp.host.fd(base + trel[:-1]))
                    dirs.append(trel)
                else:
                    self._entry(lp, unit.upper + trel, base + trel[:-1], trel[-1])
            for trel in reversed(dirs):                # children first, so their times stay
                hrel = base + trel
                self._attrs_from_upper(lp, unit.upper + trel, hrel[:-1], hrel[-1])

    def _attrs_from_upper(self, lp: _LayerPlan, u: tuple, hparent: tuple, name: str) -> None:
        ust = _lstat(u[-1], dir_fd=lp.up.fd(u[:-1]))
        uo = _obj_fd(lp.up.fd(u[:-1]), u[-1])
        try:
            xattrs = _xattrs_of(_proc(uo))
        finally:
            os.close(uo)
        _apply_attrs(lp.host.fd(hparent), name, lp.up.true_mode(u, ust.st_mode), ust.st_uid,
                     ust.st_gid, xattrs, (ust.st_atime_ns, ust.st_mtime_ns))

    def _entry(self, lp: _LayerPlan, u: tuple, hparent: tuple, name: str) -> None:
        """Stage the upper's non-directory `u` as `name` in the host dir `hparent`."""
        ust = _lstat(u[-1], dir_fd=lp.up.fd(u[:-1]))
        if lp.can_link:
            try:
                step("link")
                os.link(u[-1], name, src_dir_fd=lp.up.fd(u[:-1]), dst_dir_fd=lp.host.fd(hparent),
                        follow_symlinks=False)
            except OSError as e:
                if e.errno == errno.EXDEV:
                    lp.can_link = False                # CASE(*, other-fs): copy instead
                elif e.errno not in (errno.EMLINK, errno.EPERM):
                    raise
            else:
                self.stats.linked += 1
                self._strip_overlay(lp, hparent, name)
                return
        key = (ust.st_dev, ust.st_ino)
        if ust.st_nlink > 1 and key in self.hardlinks:
            sl, sparent, sname = self.hardlinks[key]
            slp = self.plan.layers[sl]
            src_fd = os.dup(slp.host.fd(sparent))
            try:
                step("link")
                os.link(sname, name, src_dir_fd=src_fd, dst_dir_fd=lp.host.fd(hparent), follow_symlinks=False)
                return
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EMLINK):
                    raise
            finally:
                os.close(src_fd)
        self._copy(lp, u, ust, hparent, name)
        self.stats.copied += 1
        if ust.st_nlink > 1:
            self.hardlinks[key] = (lp.index, hparent, name)

    def _strip_overlay(self, lp, hparent, name) -> None:
        ofd = _obj_fd(lp.host.fd(hparent), name)
        try:
            p = _proc(ofd)
            marks = [n for n in os.listxattr(p) if n.startswith(_OVERLAY_PREFIXES)]
            if marks:
                with _xattrs_writable(ofd):
                    for n in marks:
                        step("removexattr")
                        os.removexattr(p, n)
        finally:
            os.close(ofd)

    def _copy(self, lp, u, ust, hparent, name) -> None:
        ufd = lp.up.fd(u[:-1])
        uo = _obj_fd(ufd, u[-1])
        try:
            xattrs = _xattrs_of(_proc(uo))
        finally:
            os.close(uo)
        times = (ust.st_atime_ns, ust.st_mtime_ns)
        if stat.S_ISREG(ust.st_mode):
            src = os.open(u[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=ufd)
            try:
                step("create")
                dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=lp.host.fd(hparent))
                try:
                    step("write")
                    self.stats.bytes += _copy_data(src, dst, ust.st_size)
                finally:
                    os.close(dst)
            finally:
                os.close(src)
        elif stat.S_ISLNK(ust.st_mode):
            target = os.readlink(u[-1], dir_fd=ufd)
            step("symlink")
            os.symlink(target, name, dir_fd=lp.host.fd(hparent))
        else:                                           # fifo, socket
            step("mknod")
            os.mknod(name, stat.S_IFMT(ust.st_mode) | 0o600, dir_fd=lp.host.fd(hparent))
        _apply_attrs(lp.host.fd(hparent), name, ust.st_mode, ust.st_uid, ust.st_gid, xattrs, times)


def _check_room(plan: _Plan) -> None:
    """A layer whose upper dir is on another filesystem than its host tree is
    committed by copying: refuse before staging anything what will not fit
    (the blocks the run's files hold, which a sparse copy also needs)."""
    need: dict[int, list] = {}          # host dev -> [bytes, entries, a layer on it]
    for unit in plan.units:
        lp = plan.layers[unit.layer]
        if unit.upper is None or lp.up.dev == lp.dev:
            continue
        if unit.tree is None:
            sts = [_lstat(unit.upper[-1], dir_fd=lp.up.fd(unit.upper[:-1]))]
        else:
            sts = [st for _, st in unit.tree]
        n = need.setdefault(lp.dev, [0, 0, lp])
        n[0] += sum(st.st_blocks * 512 for st in sts if stat.S_ISREG(st.st_mode))
        n[1] += len(sts)
    for size, entries, lp in need.values():
        v = os.fstatvfs(lp.host.fd(()))
        free, inodes = v.f_bavail * v.f_frsize, v.f_favail if v.f_files else entries
        if size > free or entries > inodes:
            raise CommitError(f"{lp.layer.mount_point}: the run's new files need {size:,} bytes "
                              f"and {entries:,} inodes there, {free:,} bytes and {inodes:,} "
                              "inodes are free; nothing was committed", step="space")


def _copy_data(src: int, dst: int, size: int) -> int:
    """Copy the data of src into dst; a hole stays a hole (SEEK_DATA/SEEK_HOLE),
    so `truncate -s 8G` costs the host nothing.  Returns the bytes copied."""
    total = off = 0
    while off < size:
        try:
            start = os.lseek(src, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:      # nothing but a hole up to the end
                break
            raise
        end = os.lseek(src, start, os.SEEK_HOLE)
        total += _copy_range(src, dst, start, end - start)
        off = end
    os.ftruncate(dst, size)
    return total


def _copy_range(src: int, dst: int, off: int, count: int) -> int:
    done = 0
    try:
        while done < count:
            n = os.copy_file_range(src, dst, min(count - done, COPY_CHUNK * 64), off + done,
                                   off + done)
            if n == 0:
                return done
            done += n
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    while done < count:
        buf = os.pread(src, min(count - done, COPY_CHUNK), off + done)
        if not buf:
            break
        view = memoryview(buf)
        while view:
            n = os.pwrite(dst, view, off + done)
            view = view[n:]
            done += n
    return done


def _unit_path(lp_host: _Dirs, u: dict) -> str:
    return lp_host.path(tuple(u["parent"]) + (u["name"],))


def _swap(plan: _Plan) -> None:
    """Step 4: each unit is one atomic rename; then merged dirs' attributes."""
    for lp in plan.layers:
        lp.host.reset()
    for unit in plan.units:
        lp = plan.layers[unit.layer]
        pfd = lp.host.fd(unit.parent)
        cur = _exists(pfd, unit.name)
        hp = lp.host.path(unit.parent + (unit.name,))
        if unit.op == CREATE:
            if cur is not None:
                raise CommitConflict(f"{hp} appeared on the host during the commit", [hp])
        elif cur is None or cur.st_ino != unit.host_ino:
            raise CommitConflict(f"{hp} changed on the host during the commit", [hp])
        try:
            with _entered(pfd):
                if unit.op == CREATE:
                    step("rename")
                    renameat2(pfd, unit.stage, unit.name, RENAME_NOREPLACE)
                elif unit.op == REPLACE:
                    step("exchange")
                    renameat2(pfd, unit.stage, unit.name, RENAME_EXCHANGE)
                else:
                    step("rename")
                    renameat2(pfd, unit.name, unit.stage, RENAME_NOREPLACE)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOENT):     # lost a race with a host process
                raise CommitConflict(f"{hp} changed on the host during the commit", [hp]) from e
            raise _error(e, "renameat2", hp) from e
    for m in plan.metas:
        lp = plan.layers[m.layer]
        pfd = lp.host.fd(m.rel[:-1])
        cur = _exists(pfd, m.rel[-1])
        if cur is None or cur.st_ino != m.ino:
            hp = lp.host.path(m.rel)
            raise CommitConflict(f"{hp} changed on the host during the commit", [hp])
        _set_meta(pfd, m.rel[-1], m.new)


def _sync(plan_layers) -> None:
    seen = set()
    for lp in plan_layers:
        if lp.dev not in seen:
            seen.add(lp.dev)
            syncfs(lp.host.fd(()))


class _Recovery:
    """Undo or finish a commit from its journal.  Every step checks the state
    first, so running it again after a crash in the middle is safe."""

    def __init__(self, data: dict):
        self.data = data
        self.notes: list[str] = []
        self.hosts: list[_Dirs | None] = []
        for l in data["layers"]:
            try:
                d = _open_root(l["mount_point"])
            except CommitError as e:
                raise CommitError(f"cannot reopen layer {l['mount_point']}: {e}") from e
            if d.dev != l["dev"]:
                d.close()
                raise CommitError(f"{l['mount_point']}: another filesystem is mounted there now", step="recover")
            self.hosts.append(d)

    def close(self) -> None:
        for d in self.hosts:
            if d is not None:
                d.close()

    def undo(self) -> None:
        phase = self.data["phase"]
        for u in reversed(self.data["units"]):
            host = self.hosts[u["layer"]]
            parent = tuple(u["parent"])
            try:
                pfd = host.fd(parent)
            except CommitError:
                continue                            # the parent is gone: nothing of ours there
            with _entered(pfd):
                self._undo_unit(host, pfd, u, phase)
        if phase != "prepared":
            for m in reversed(self.data["metas"]):
                host = self.hosts[m["layer"]]
                rel = tuple(m["rel"])
                pfd = host.fd(rel[:-1])
                cur = _exists(pfd, rel[-1])
                if cur is not None and cur.st_ino == m["ino"]:
                    _set_meta(pfd, rel[-1], m["old"])
        self._times("old")
        self._reshut(applied=False)
        self._sync()

    def _undo_unit(self, host: _Dirs, pfd: int, u: dict, phase: str) -> None:
        name, stage = u["name"], u["stage"]
        if u["op"] == DELETE:
            if _exists(pfd, stage) is not None:
                if _exists(pfd, name) is None:
                    step("rename")
                    renameat2(pfd, stage, name, RENAME_NOREPLACE)
                else:
                    self.notes.append(f"{_unit_path(host, u)} exists again; old version kept at {stage}")
            return
        cur = _exists(pfd, name)
        if phase != "prepared" and cur is not None and cur.st_ino == u["staged_ino"]:
            if u["op"] == CREATE:
                step("rename")
                renameat2(pfd, name, stage, RENAME_NOREPLACE)
            else:
                step("exchange")
                renameat2(pfd, stage, name, RENAME_EXCHANGE)
        rmtree_at(pfd, stage, host.dev, host.path(tuple(u["parent"])))

    def finish(self) -> None:
        trash = [_Trash(l["upper"]) for l in self.data["layers"]]
        try:
            for u in self.data["units"]:
                host = self.hosts[u["layer"]]
                parent = tuple(u["parent"])
                pfd = host.fd(parent)
                stage = u["stage"]
                with _entered(pfd):
                    if _exists(pfd, stage) is None:
                        continue
                    if u["op"] == REPLACE:
                        cur = _exists(pfd, u["name"])
                        if cur is None or cur.st_ino != u["staged_ino"]:
                            self.notes.append(f"{_unit_path(host, u)} is not the committed version; "
                                              f"{stage} kept")
                            continue
                    if not trash[u["layer"]].take(pfd, stage):
                        rmtree_at(pfd, stage, host.dev, host.path(parent))
            self._times("new")
            self._reshut(applied=True)
            for l in self.data["layers"]:
                _empty_upper(l["upper"])
            self._sync()
        finally:
            for t in trash:
                t.close()

    def _reshut(self, applied: bool) -> None:
        """Shut the directories a killed commit left open (_shut_dirs): to
        the mode they had, or, applied, to the mode the run gave them."""
        new = {(m["layer"], tuple(m["rel"])): m["new"]["mode"] for m in self.data["metas"]}
        for d in self.data.get("shut", []):
            key = (d["layer"], tuple(d["rel"]))
            want = new.get(key, d["mode"]) if applied else d["mode"]
            try:
                fd = self.hosts[d["layer"]].fd(key[1])
            except CommitError:
                continue                            # gone: nothing to shut
            st = os.fstat(fd)
            left_open = st.st_ino == d["ino"] and stat.S_IMODE(st.st_mode) == d["mode"] | 0o300
            if left_open and want != d["mode"] | 0o300:
                step("chmod")
                os.fchmod(fd, want)

    def _sync(self) -> None:
        """Make the cleanup durable before the journal goes."""
        seen = set()
        for d in self.hosts:
            if d.dev not in seen:
                seen.add(d.dev)
                syncfs(d.fd(()))

    def _times(self, which: str) -> None:
        """The times of merged directories (which the renames in them moved)
        and of files changed in place."""
        for t in self.data["times"]:
            ts = t[which]
            if ts is None:
                continue
            host = self.hosts[t["layer"]]
            rel = tuple(t["rel"])
            try:
                ofd = _obj_fd(host.fd(rel[:-1]), rel[-1]) if rel else os.dup(host.fd(()))
            except (CommitError, FileNotFoundError):
                continue                            # gone: nothing of ours to set
            try:
                st = os.fstat(ofd)
                if (st.st_atime_ns, st.st_mtime_ns) == tuple(ts):
                    continue
                step("utime")
                try:
                    os.utime(_proc(ofd), ns=tuple(ts))
                except PermissionError:
                    # A directory of another owner (a layer's root such as /tmp): its
                    # times follow the renames in it, as a native run's would.
                    if os.geteuid() == 0 or st.st_uid == os.geteuid():
                        raise
            finally:
                os.close(ofd)


class _Trash:
    """Where finish() puts the old versions: a directory beside the upper,
    in the run's scratch, which caper deletes after it has answered
    (caper.view.overlay). Deleting files that are on disk costs ~100 us each on
    some filesystems, and the user's tree is clean as soon as they are
    renamed away. Not an old version with a hard link elsewhere: unlinking
    it later would change the ctime of a host file after the commit, which
    the next run would take for an edit. Where the scratch is on another
    mount (EXDEV), finish() deletes in place as before."""

    def __init__(self, upper: str):
        self.fd: int | None = None
        try:
            path = os.path.join(os.path.dirname(upper), TRASH_DIR)
            with suppress(FileExistsError):
                os.mkdir(path, 0o700)
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            pass                 # the scratch is gone (recover after a crash): delete in place

    def take(self, dfd: int, name: str) -> bool:
        if self.fd is None or not _no_other_links(dfd, name):
            return False
        try:
            step("rename")
            renameat2(dfd, name, name, RENAME_NOREPLACE, new_dfd=self.fd)
            return True
        except OSError as e:
            if e.errno in (errno.EXDEV, errno.EEXIST, errno.EACCES):
                return False
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _no_other_links(dfd: int, name: str, depth: int = 0) -> bool:
    """Is every non-directory at or below name linked only once?"""
    if depth > MAX_TREE_DEPTH:
        return False   # unknown, so not proven: the caller takes the safe way
    st = _lstat(name, dir_fd=dfd)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_nlink == 1
    cfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        with _scandir(cfd) as it:
            names = [e.name for e in it]
        return all(_no_other_links(cfd, n, depth + 1) for n in names)
    finally:
        os.close(cfd)


def _empty_upper(upper: str) -> None:
    """A committed upper dir is consumed: its files are now the host's files
    (hard links), and writing through it again would change the host unseen."""
    try:
        fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        dev = os.fstat(fd).st_dev
        with _scandir(fd) as it:
            names = [e.name for e in it]
        with _entered(fd):      # rootless, the root of a layer over another's dir is r-x
            for n in names:
                rmtree_at(fd, n, dev, upper)
    finally:
        os.close(fd)


def _load(path: str) -> dict:
    with open(path, "rb") as f:
        data = json.loads(f.read())
    if data.get("version") != JOURNAL_VERSION:
        raise CommitError(f"{path}: unknown journal version {data.get('version')!r}", step="recover")
    for item in data["units"] + data["metas"] + data["times"] + data.get("shut", []):
        names = item.get("parent", []) + item.get("rel", []) + [item.get("name", "x"), item.get("stage", "x")]
        if any(not n or n in (".", "..") or "/" in n or "\0" in n for n in names):
            raise CommitError(f"{path}: bad path component in the journal", step="recover")
        if "stage" in item and not item["stage"].startswith(STAGE_PREFIX):
            raise CommitError(f"{path}: bad staging name in the journal", step="recover")
    return data


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
        os.makedirs(jdir, mode=0o700, exist_ok=True)
        fsync_dir(state_dir)
    # An interrupted commit that recover() could not complete leaves its own
    # paths in an unknown state, and only those: a commit elsewhere goes on.
    stale = _stale_paths(state_dir)
    # 1. plan (read-only) and conflicts; the upper dirs are never committed into themselves
    plan = _make_plan(layers, [*exclude, state_dir, *(l.upper for l in layers)], since_ns)
    try:
        notes = []
        if stale:
            mine = _plan_paths(plan)
            for jid, paths in stale.items():
                hit = sorted(p for p in mine if any(_overlap(p, q) for q in paths))
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
        if not plan.units and not plan.metas:
            for lp in plan.layers:
                _empty_upper(lp.layer.upper)
            return CommitResult(jid, plan.changes, counts, seconds=time.perf_counter() - t0,
                                notes=notes)
        _check_room(plan)
        for n, unit in enumerate(plan.units):
            unit.stage = f"{STAGE_PREFIX}{jid}-{n}"
        plan.shut = _shut_dirs(plan)
        journal = _journal(state_dir, jid)
        journal.lock(block=True)
        stager = _Stager(plan)
        try:
            # 2. journal, durable before the first change
            journal.write(_journal_data(jid, "prepared", plan))
            # 3. stage new content at the hidden names
            for unit in plan.units:
                stager.stage(unit)
            _sync(plan.layers)
            journal.write(_journal_data(jid, "staged", plan))
            # 4. swap, then the applied mark
            _swap(plan)
            _sync(plan.layers)
            journal.write(_journal_data(jid, "applied", plan))
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
        rec = _Recovery(_load(journal.path))
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
        raise _error(exc, "commit", exc.filename or "?") from exc
    if isinstance(exc, Exception) and not isinstance(exc, CaperError):
        raise CommitError(f"commit failed and was undone: {type(exc).__name__}: {exc}", step="commit") from exc


_JOURNAL_NAME = re.compile(r"([0-9a-f]{12})\.(?:json|json\.tmp|lock)")


def _abandoned(state_dir: str) -> list[str]:
    """Journals no live commit holds: recover() must run before the next commit."""
    out = []
    jdir = os.path.join(state_dir, JOURNAL_DIR)
    for n in sorted(os.listdir(jdir)):
        m = _JOURNAL_NAME.fullmatch(n)
        if m and n.endswith(".json"):
            j = _journal(state_dir, m.group(1))
            if j.lock(block=False):
                # Its owner may have finished between our listing and our lock.
                alive = os.path.exists(j.path)
                j.unlock(remove=not alive)
                if alive:
                    out.append(m.group(1))
    return out


def _stale_paths(state_dir: str) -> dict[str, set[str]]:
    """The host paths of each abandoned journal."""
    out = {}
    for jid in _abandoned(state_dir):
        try:
            data = _load(_journal(state_dir, jid).path)
            roots = [l["mount_point"] for l in data["layers"]]
            out[jid] = ({_join(roots[u["layer"]], u["parent"] + [u["name"]]) for u in data["units"]}
                        | {_join(roots[m["layer"]], m["rel"]) for m in data["metas"]})
        except (OSError, ValueError, KeyError, IndexError, TypeError, CommitError):
            out[jid] = {"/"}      # unreadable: it may cover anything
    return out


def _plan_paths(plan: _Plan) -> set[str]:
    return ({plan.layers[u.layer].host.path(u.parent + (u.name,)) for u in plan.units}
            | {plan.layers[m.layer].host.path(m.rel) for m in plan.metas})


def _join(root: str, rel: list[str]) -> str:
    return root.rstrip("/") + "/" + "/".join(rel) if rel else root


def _overlap(a: str, b: str) -> bool:
    return mountinfo.below(a, b) or mountinfo.below(b, a)


def recover(state_dir: str) -> list[str]:
    """Finish or undo every interrupted commit in `state_dir`.  Returns what it did."""
    jdir = os.path.join(os.path.abspath(state_dir), JOURNAL_DIR)
    done: list[str] = []
    try:
        names = sorted(os.listdir(jdir))
    except FileNotFoundError:
        return done
    ids = {m.group(1) for m in map(_JOURNAL_NAME.fullmatch, names) if m}
    for jid in sorted(ids):
        journal = _journal(os.path.abspath(state_dir), jid)
        if not journal.lock(block=False):
            done.append(f"{jid}: in progress in another process; left alone")
            continue
        if not os.path.exists(journal.path):
            journal.remove()                # never reached its first change, or already done
            done.append(f"{jid}: no journal (nothing to do); removed")
            continue
        rec = None
        try:
            data = _load(journal.path)
            rec = _Recovery(data)
            if data["phase"] == "applied":
                rec.finish()
                what = f"{jid}: finished (applied, {len(data['units'])} units)"
            else:
                rec.undo()
                what = f"{jid}: undone (was {data['phase']}, {len(data['units'])} units)"
            journal.remove()
            done.append(what + "".join(f"; {n}" for n in rec.notes))
        except (OSError, CommitError, ValueError) as e:
            journal.unlock()
            done.append(f"{jid}: FAILED, journal kept: {e}")
        finally:
            if rec is not None:
                rec.close()
    return done
