"""Filesystem primitives of the commit engine: directory fds opened one
component at a time with O_NOFOLLOW, the attributes commit carries over
(owner, mode, managed xattrs, what ACLs grant), opening a user's shut
directory for a moment, sparse copies, and deleting trees without following
a symlink or crossing a mount."""
from __future__ import annotations

import errno
import os
import stat
from collections import OrderedDict
from contextlib import contextmanager
from typing import Sequence

from caper.commit.journal import step
from caper.errors import CommitError
from caper.fs import mountinfo
from caper.fs.syscalls import open_quiet

MAX_OPEN_DIRS = 256                # directory fds kept open per tree
COPY_CHUNK = 1 << 20
# Directory levels the planner follows (its walks recurse, and every level
# costs an fd and a path component): a deeper tree is refused, not committed.
MAX_TREE_DEPTH = 256

OVERLAY_PREFIXES = ("trusted.overlay.", "user.overlay.")
_UNMANAGED_XATTRS = ("security.selinux",)      # labels belong to the host policy

# Measurement seams: every lstat and directory listing of the commit engine
# goes through these two names, so a test can count them (tests/test_commit.py
# wraps them).
_lstat = os.lstat
_scandir = os.scandir


def lstat(name, *, dir_fd: int | None = None) -> os.stat_result:
    return _lstat(name, dir_fd=dir_fd)


def scandir(path_or_fd):
    return _scandir(path_or_fd)


# --- syscalls Python lacks ------------------------------------------------------------

def proc_path(fd: int) -> str:
    """Path of an O_PATH fd: operations on it reach the object itself, even a symlink."""
    return f"/proc/self/fd/{fd}"


def mount_points() -> set[str]:
    """Every mount point of this mount namespace (a bind mount of the same
    filesystem has the same st_dev: only mountinfo shows it)."""
    try:
        return {m.point for m in mountinfo.read()}
    except OSError:
        return set()


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def fs_error(e: OSError, what: str, path: str) -> CommitError:
    return CommitError(f"{what}({path}): {e.strerror or os.strerror(e.errno)}", step=what, err=e.errno or 0)


# --- directory fds -------------------------------------------------------------------

class DirFds:
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
        self._root_fd = open_quiet(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
                fd = open_quiet(rel[-1], flags, dir_fd=parent)
            except PermissionError:
                if not self.own:
                    raise
                # EACCES, not ELOOP: a real directory, not a symlink to follow.
                mode = os.stat(rel[-1], dir_fd=parent, follow_symlinks=False).st_mode
                os.chmod(rel[-1], stat.S_IMODE(mode) | 0o700, dir_fd=parent)
                self._opened_up[self.path(rel)] = stat.S_IMODE(mode)
                fd = open_quiet(rel[-1], flags, dir_fd=parent)
            if self.own:
                mode = os.fstat(fd).st_mode
                if mode & 0o700 != 0o700:  # readable but not searchable: entries unreachable
                    os.fchmod(fd, stat.S_IMODE(mode) | 0o700)
                    self._opened_up.setdefault(self.path(rel), stat.S_IMODE(mode))
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CommitError(f"{self.path(rel)}: not a directory (a symlink?); refusing to follow it",
                                  step="open", err=e.errno) from e
            raise fs_error(e, "open", self.path(rel)) from e
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
            raise fs_error(e, "lstat", self.path(rel + (name,))) from e

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


def open_root(mount_point: str) -> DirFds:
    if not os.path.isabs(mount_point) or os.path.normpath(mount_point) != mount_point:
        raise CommitError(f"mount point must be an absolute normalised path: {mount_point!r}", step="config")
    if os.path.realpath(mount_point) != mount_point:
        raise CommitError(f"mount point {mount_point} goes through a symlink; refusing", step="config")
    try:
        return DirFds(mount_point)
    except OSError as e:
        raise fs_error(e, "open", mount_point) from e


# --- attributes ------------------------------------------------------------------------

def _managed(name: str) -> bool:
    return not name.startswith(OVERLAY_PREFIXES) and name not in _UNMANAGED_XATTRS


def managed_xattrs(path_or_fd) -> dict[str, bytes]:
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


def overlay_xattrs(path_or_fd, userxattr: bool) -> dict[str, bytes]:
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


def obj_fd(dfd: int, name: str) -> int:
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
def xattrs_writable(ofd: int):
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
    os.chmod(proc_path(ofd), mode | 0o200)
    try:
        yield
    finally:
        os.chmod(proc_path(ofd), mode)


def _set_owner(target, uid: int, gid: int) -> None:
    step("chown")
    try:
        os.chown(target, uid, gid)
    except PermissionError:
        if os.geteuid() == 0:
            raise       # rootless: the files are ours already


def apply_attrs(dfd: int, name: str, mode: int, uid: int, gid: int, xattrs: dict[str, bytes] | None,
                 times: tuple[int, int] | None, old_xattrs: dict[str, bytes] | None = None) -> None:
    """Owner, xattrs, mode, times of the entry `name` in `dfd`, never following it."""
    ofd = obj_fd(dfd, name)
    try:
        p = proc_path(ofd)
        st = os.fstat(ofd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            _set_owner(p, uid, gid)
        if xattrs is not None:
            _set_xattrs(p, xattrs, managed_xattrs(p) if old_xattrs is None else old_xattrs)
        if not stat.S_ISLNK(st.st_mode):
            step("chmod")
            os.chmod(p, stat.S_IMODE(mode))        # after chown, which clears set-id bits
        if times is not None:
            step("utime")
            os.utime(p, ns=times)
    finally:
        os.close(ofd)


def meta_of(p: str, st: os.stat_result) -> dict:
    return {"mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
            "xattrs": {k: v.hex() for k, v in managed_xattrs(p).items()}}


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


def everyone_writes(st: os.stat_result) -> list[str]:
    """A mode that lets every user of the machine write the entry: a file or
    directory with o+w (a sticky directory too: anyone may still plant
    entries in it). Symlinks' modes mean nothing."""
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & stat.S_IWOTH:
        return []
    return [f"write for every user (mode {stat.S_IMODE(st.st_mode):04o})"]


def new_grants(path_or_fd, st: os.stat_result) -> str:
    """A new entry's detail: what it grants other users and what runs it,
    its ACL entries and security.* xattrs (`grants`) and a mode everyone may
    write through; empty when nothing."""
    given = grants(managed_xattrs(path_or_fd)) + everyone_writes(st)
    return "grants " + ", ".join(given) if given else ""


def meta_diff(old: dict, new: dict) -> list[str]:
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


def set_meta(dfd: int, name: str, meta: dict) -> None:
    ofd = obj_fd(dfd, name)
    try:
        set_meta_fd(ofd, meta)
    finally:
        os.close(ofd)


def set_meta_fd(ofd: int, meta: dict) -> None:
    """Make owner, managed xattrs and mode of the inode open at ofd those of `meta`."""
    p = proc_path(ofd)
    st = os.fstat(ofd)
    if (st.st_uid, st.st_gid) != (meta["uid"], meta["gid"]):
        _set_owner(p, meta["uid"], meta["gid"])
    want, have = {k: bytes.fromhex(v) for k, v in meta["xattrs"].items()}, managed_xattrs(p)
    if want != have:
        with xattrs_writable(ofd):
            _set_xattrs(p, want, have)
    if stat.S_IMODE(os.fstat(ofd).st_mode) != meta["mode"]:
        step("chmod")
        os.chmod(p, meta["mode"])


# --- removing trees -----------------------------------------------------------------------

@contextmanager
def entered(dfd: int):
    """A directory of the user's own may shut its owner out (chmod 555, 600)
    where a native run had opened it for a moment (chmod u+w; edit; chmod
    u-w): an unprivileged commit opens it for the renames and deletions it
    does there, then shuts it again. (Root needs no such help; another
    owner's directory is not ours to open, and the change fails as it would
    natively.) A kill in between leaves it open: the journal lists the
    directories it opens (shut_dirs), and recovery shuts them again."""
    st = os.fstat(dfd)
    mode = stat.S_IMODE(st.st_mode)
    if os.geteuid() == 0 or st.st_uid != os.geteuid() or mode & 0o300 == 0o300:
        yield
        return
    fd = os.dup(dfd)            # the caller's fd may be closed meanwhile (DirFds is an LRU)
    try:
        os.fchmod(fd, mode | 0o300)
        try:
            yield
        finally:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def depth_ok(tree: "DirFds", rel: tuple) -> None:
    if len(rel) > MAX_TREE_DEPTH:
        raise CommitError(f"{tree.path(rel[:8])}/...: more than {MAX_TREE_DEPTH} directory "
                          "levels; caper does not commit trees this deep", step="plan")


DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
                # could not do either without chmod: see entered.
                if st.st_mode & 0o700 != 0o700 and (force or _own_shut(st)):
                    os.chmod(child, 0o700, dir_fd=fd)
                cfd = os.open(child, DIR_OPEN, dir_fd=fd)
                os.close(fd)
                fd = cfd
                if os.fstat(fd).st_ino != st.st_ino:
                    raise CommitError(f"{here}/{child}: replaced while it was deleted; refusing",
                                      step="rmtree")
                down.append((child, st.st_ino))
                continue
            # fd is empty now: up one level, and remove it there.
            done, _ = down.pop()
            pfd = os.open("..", DIR_OPEN, dir_fd=fd)
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


def exists(dfd: int, name: str) -> os.stat_result | None:
    try:
        return _lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return None


def same_data(a: int, b: int) -> bool:
    """Do the files open at a and b (at offset 0) hold the same bytes?"""
    while True:
        x, y = os.read(a, COPY_CHUNK), os.read(b, COPY_CHUNK)
        if x != y:
            return False
        if not x:
            return True


def copy_data(src: int, dst: int, size: int) -> int:
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


def no_other_links(dfd: int, name: str, depth: int = 0) -> bool:
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
        return all(no_other_links(cfd, n, depth + 1) for n in names)
    finally:
        os.close(cfd)
