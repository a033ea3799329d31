"""caper.view.btrfs: the btrfs backend for the workspace.

    snap = BtrfsSnapshot.create(workspace, state_dir)   # writable snapshot, hidden beside it
    ...  the sandbox bind-mounts snap.path at the workspace path and runs the command ...
    snap.changed_paths()                                # what differs, as workspace paths
    snap.changes()                                      # the same as commit.Change, for reports
    snap.commit()   or   snap.discard()
    recover_btrfs(state_dir)                            # after a crash: finish or undo

The workspace must be the root of a btrfs subvolume, not a mount point, with no
subvolume nested below it (a snapshot is not recursive: a nested subvolume
would show as an empty directory, and commit would silently empty it).  The
snapshot is `<parent>/.caper-snap-<id>/tree`, in a 0700 directory beside the
workspace (what the run writes is nobody else's on the host while it runs), on
the same filesystem, so commit can swap the two subvolume roots with one
`renameat2(RENAME_EXCHANGE)` between the two directories.

**What changed.**  A snapshot shares every tree block with its source; btrfs
copies a block on write and stamps it with the transaction id.  After a sync
(so delayed inode items are in the tree), a tree search with `min_transid =
T + 1` (T: the transaction that created the snapshot) returns exactly the
leaves changed since, and every inode item carries the transid of its last
update.  The inodes changed on either side are compared item by item with
the other tree (inode fields minus atime/transid/sequence, xattr items, file
extent items: equal extent items mean shared extents, hence equal bytes);
directories are compared by their DIR_INDEX entries (name -> inode, index:
an index is never reused, so a deleted and recreated name differs).  Cost:
O(changed leaves), not O(files).  Atime-only updates (relatime reads) are not
changes.

**Conflict.**  Commit refuses (BtrfsConflict, nothing touched) when the
workspace side has a real change since T (same comparison, atime excluded),
or when an inode changed in the snapshot was also updated in the workspace
with a ctime at or after the snapshot's creation time (an atime-only update
leaves ctime older; same-clock-tick changes are conservatively conflicts).

**Journal.**  `state_dir/btrfs/<id>.json` (tmp + fsync + rename + fsync dir)
records the workspace, the snapshot path and the subvolume UUIDs; `<id>.lock`
is flocked by the live owner.  Phases: created (written, durably, before
the snapshot exists; the exchange needs no record of its own, and the record
goes once the old workspace is deleted), or created -> kept (a conflicting
run's version, left for the user, deleted by recover_btrfs once older than
caper.state.KEPT_S).  Recovery identifies everything by UUID, never by name
alone:

* created:   if the workspace path holds a subvolume whose parent is the
             workspace (the snapshot), the exchange happened: finish
             (post-state); else delete the snapshot (pre-state).
* prepared, applied: (written by earlier versions around the exchange) as created.

Limits: the window between the conflict check and the exchange is not closed
(a host write in that window is lost with the old subvolume); a process whose
cwd or open files are in the old workspace keeps the old subvolume (its
writes after commit are lost); a mount inside the old workspace makes its
delete fail (commit reports it; the state is post).
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
import struct
import time
from dataclasses import replace
from typing import Iterable

from caper.fs import mountinfo
from caper.changes import Change, file_type
from caper.commit.fsops import meta_diff, meta_of, new_grants, privileges
from caper.errors import BtrfsConflict, BtrfsError, ForgedJournal
from caper.commit.journal import SET_ASIDE, Journal, step
from caper.state import KEPT_S
from caper.fs.syscalls import RENAME_EXCHANGE, renameat2

try:
    import btrfsutil  # PyPI btrfsutil==6.10 (Debian 12: libbtrfsutil 6.2)
except ImportError:  # pragma: no cover - reported by _need_btrfsutil()
    btrfsutil = None

__all__ = ["is_subvolume", "BtrfsSnapshot", "BtrfsError", "BtrfsConflict", "recover_btrfs"]

SNAP_PREFIX = ".caper-snap-"
SNAPSHOT_NAME = "tree"
JOURNAL_DIR = "btrfs"
JOURNAL_VERSION = 1


# --- errors --------------------------------------------------------------------------------



def _oserr(call: str, obj: str, e: OSError) -> BtrfsError:
    err = e.errno or 0
    return BtrfsError(f"{call}({obj}): {os.strerror(err) if err else e} (errno {err})", step=call, err=err)


def _utilerr(call: str, obj: str, e: Exception) -> BtrfsError:
    err = getattr(e, "errno", 0) or 0
    return BtrfsError(f"{call}({obj}): {e} (errno {err})", step=call, err=err)


def _need_btrfsutil() -> None:
    if btrfsutil is None:
        raise BtrfsError("python module btrfsutil is missing (pip install btrfsutil==6.10)", step="import")


# --- syscalls and ioctls --------------------------------------------------------------------

def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (0x94 << 8) | nr


_SEARCH_KEY = struct.Struct("=7Q4I4Q")              # struct btrfs_ioctl_search_key (104 bytes)
_SEARCH_HDR = struct.Struct("=3Q2I")                # struct btrfs_ioctl_search_header (32 bytes)
_IOC_TREE_SEARCH_V2 = _iowr(17, _SEARCH_KEY.size + 8)
_IOC_INO_LOOKUP = _iowr(18, 4096)
_SEARCH_BUF = 64 * 1024                             # > any item in a 16K..64K leaf
_U64 = (1 << 64) - 1

INODE_ITEM, INODE_REF, INODE_EXTREF, XATTR_ITEM, DIR_INDEX, EXTENT_DATA = 1, 12, 13, 24, 96, 108
FIRST_FREE_OBJECTID = 256
_DIR_ITEM = struct.Struct("<QBQQHHB")              # location key, transid, data_len, name_len, type
_S_IFDIR = 0o040000


def _search(fd: int, min_key: tuple, max_key: tuple, min_transid: int = 0, tree: int = 0):
    """Yield (objectid, type, offset, leaf_transid, data) for every item of
    tree `tree` (0: the fd's subvolume) with key in [min_key, max_key] (tuple order) in a leaf
    written at or after min_transid."""
    (mino, mint, mino_off), (maxo, maxt, maxo_off) = min_key, max_key
    buf = bytearray(_SEARCH_KEY.size + 8 + _SEARCH_BUF)
    while True:
        _SEARCH_KEY.pack_into(buf, 0, tree, mino, maxo, mino_off, maxo_off, min_transid, _U64,
                              mint, maxt, 4096, 0, 0, 0, 0, 0)
        struct.pack_into("=Q", buf, _SEARCH_KEY.size, _SEARCH_BUF)
        fcntl.ioctl(fd, _IOC_TREE_SEARCH_V2, buf, True)
        nr = _SEARCH_KEY.unpack_from(buf, 0)[9]
        if nr == 0:
            return
        off = _SEARCH_KEY.size + 8
        last = None
        for _ in range(nr):
            transid, objid, koff, ktype, length = _SEARCH_HDR.unpack_from(buf, off)
            off += _SEARCH_HDR.size
            yield objid, ktype, koff, transid, bytes(buf[off:off + length])
            off += length
            last = (objid, ktype, koff)
        # continue after the last key
        o, t, k = last
        if k < _U64:
            k += 1
        elif t < 255:
            t, k = t + 1, 0
        elif o < _U64:
            o, t, k = o + 1, 0, 0
        else:
            return
        if (o, t, k) > (maxo, maxt, maxo_off):
            return
        mino, mint, mino_off = o, t, k


ROOT_TREE, ROOT_ITEM = 1, 132
_ROOT_OTIME = 339            # offset of otime in struct btrfs_root_item


def _otime_ns(path: str, subvol_id: int) -> int:
    """A subvolume's creation time in ns, from its root item (btrfsutil rounds it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for *_k, data in _search(fd, (subvol_id, ROOT_ITEM, 0), (subvol_id, ROOT_ITEM, _U64), tree=ROOT_TREE):
            sec, nsec = struct.unpack_from("<QI", data, _ROOT_OTIME)
            return sec * 10**9 + nsec
    finally:
        os.close(fd)
    raise BtrfsError(f"tree_search(root item {subvol_id} of {path}): not found (errno {errno.ENOENT})",
                     step="tree_search", err=errno.ENOENT)


def _ino_lookup(fd: int, ino: int) -> str | None:
    """Path of a directory inode relative to the subvolume root ('' for the root);
    None when the inode is not there."""
    buf = bytearray(4096)
    struct.pack_into("=QQ", buf, 0, 0, ino)
    try:
        fcntl.ioctl(fd, _IOC_INO_LOOKUP, buf, True)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    name = bytes(buf[16:]).split(b"\0", 1)[0]
    return os.fsdecode(name).rstrip("/")


# --- the tree comparison ------------------------------------------------------------------------

class _Tree:
    """One subvolume, read through the tree-search ioctl (needs CAP_SYS_ADMIN)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._dirs: dict[int, str | None] = {}

    def close(self) -> None:
        os.close(self.fd)

    def changed_inodes(self, since: int) -> dict[int, bytes]:
        """Inode number -> inode item, for inodes updated after transaction `since`."""
        out = {}
        for ino, typ, _off, _lt, data in _search(self.fd, (FIRST_FREE_OBJECTID, 0, 0), (_U64, 255, _U64),
                                                 since + 1):
            if typ == INODE_ITEM and struct.unpack_from("<Q", data, 8)[0] > since:
                out[ino] = data
        return out

    def items(self, ino: int, typ: int) -> list[tuple[int, bytes]]:
        return [(off, data) for _o, _t, off, _lt, data in _search(self.fd, (ino, typ, 0), (ino, typ, _U64))]

    def inode(self, ino: int) -> bytes | None:
        it = self.items(ino, INODE_ITEM)
        return it[0][1] if it else None

    def entries(self, ino: int) -> dict[bytes, tuple[int, int]]:
        """A directory's entries: name -> (inode or subvolume id, index)."""
        out = {}
        for index, data in self.items(ino, DIR_INDEX):
            objid, _kt, _ko, _tr, _dl, nlen, _ft = _DIR_ITEM.unpack_from(data, 0)
            out[data[_DIR_ITEM.size:_DIR_ITEM.size + nlen]] = (objid, index)
        return out

    def dir_path(self, ino: int) -> str | None:
        if ino not in self._dirs:
            self._dirs[ino] = _ino_lookup(self.fd, ino)
        return self._dirs[ino]

    def paths(self, ino: int) -> list[str]:
        """Every path (relative) of an inode: its INODE_REF and INODE_EXTREF items."""
        out = []
        for parent, data in self.items(ino, INODE_REF):
            off = 0
            while off < len(data):
                _index, nlen = struct.unpack_from("<QH", data, off)
                name = data[off + 10:off + 10 + nlen]
                off += 10 + nlen
                out.append(self._join(parent, name))
        for _hash, data in self.items(ino, INODE_EXTREF):
            off = 0
            while off < len(data):
                parent, _index, nlen = struct.unpack_from("<QQH", data, off)
                name = data[off + 18:off + 18 + nlen]
                off += 18 + nlen
                out.append(self._join(parent, name))
        return [p for p in out if p is not None]

    def _join(self, parent: int, name: bytes) -> str | None:
        d = self.dir_path(parent)
        if d is None:
            return None
        n = os.fsdecode(name)
        return f"{d}/{n}" if d else n

    def subtree(self, rel: str) -> list[str]:
        """rel and, if it is a directory, everything below it (no symlink followed)."""
        out = [rel]
        stack = [rel]
        while stack:
            d = stack.pop()
            try:   # O_NOATIME: the walk must not itself update the trees it compares
                fd = os.open(os.path.join(self.path, d),
                             os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NOATIME | os.O_CLOEXEC)
            except (NotADirectoryError, FileNotFoundError):
                continue
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                continue
            with os.scandir(fd) as it:
                for e in it:
                    r = f"{d}/{e.name}"
                    out.append(r)
                    if e.is_dir(follow_symlinks=False):
                        stack.append(r)
            os.close(fd)
        return out


def _ctime_ns(item: bytes) -> int:
    sec, nsec = struct.unpack_from("<QI", item, 124)
    return sec * 10**9 + nsec


def _gen(item: bytes) -> int:
    return struct.unpack_from("<Q", item, 0)[0]


def _mode(item: bytes) -> int:
    return struct.unpack_from("<I", item, 52)[0]


def _inode_view(item: bytes, is_dir: bool) -> bytes:
    """The inode item fields that make a change: generation, size, nbytes, uid,
    gid, mode, rdev, flags, mtime.  Not atime, transid, sequence, block_group;
    not ctime or nlink (a rename or a new link moves them: the names themselves
    are compared as directory entries).  For a directory not size/nbytes/mtime
    either (they move with its entries)."""
    if is_dir:
        return item[0:8] + item[44:72]
    return item[0:8] + item[16:32] + item[44:72] + item[136:148]


def _same_identity(a: bytes | None, b: bytes | None) -> bool:
    # inode numbers are reused across the two trees after the snapshot: the
    # inode generation (its creating transaction) tells them apart
    return a is not None and b is not None and _gen(a) == _gen(b) and \
        (_mode(a) & 0o170000) == (_mode(b) & 0o170000)


def _inode_differs(ino: int, a: _Tree, ia: bytes, b: _Tree, ib: bytes) -> bool:
    is_dir = (_mode(ia) & 0o170000) == _S_IFDIR
    if _inode_view(ia, is_dir) != _inode_view(ib, is_dir):
        return True
    if a.items(ino, XATTR_ITEM) != b.items(ino, XATTR_ITEM):
        return True
    return not is_dir and a.items(ino, EXTENT_DATA) != b.items(ino, EXTENT_DATA)


def _diff(ws: _Tree, snap: _Tree, inos: Iterable[int]) -> set[str]:
    """Relative paths that differ between the trees, given the inodes changed on
    either side (every other inode is shared, hence equal)."""
    out: set[str] = set()
    for ino in inos:
        iw, is_ = ws.inode(ino), snap.inode(ino)
        if not _same_identity(iw, is_):
            continue        # created, deleted or reused: its parent's entries differ
        if _inode_differs(ino, ws, iw, snap, is_):
            if (_mode(is_) & 0o170000) == _S_IFDIR:
                for t in (ws, snap):
                    p = t.dir_path(ino)
                    if p:
                        out.add(p)
            else:
                out.update(ws.paths(ino))
                out.update(snap.paths(ino))
        if (_mode(is_) & 0o170000) == _S_IFDIR:
            ew, es = ws.entries(ino), snap.entries(ino)
            if ew == es:
                continue
            dw, ds = ws.dir_path(ino), snap.dir_path(ino)
            for name in set(ew) | set(es):
                if ew.get(name) == es.get(name):
                    continue
                n = os.fsdecode(name)
                if name in ew and dw is not None:
                    out.update(ws.subtree(f"{dw}/{n}" if dw else n))
                if name in es and ds is not None:
                    out.update(snap.subtree(f"{ds}/{n}" if ds else n))
    return out


# --- public API -----------------------------------------------------------------------------------

def is_subvolume(path: str) -> bool:
    """True if `path` is the root of a btrfs subvolume.  False for anything else,
    including other filesystems and missing paths."""
    if btrfsutil is None:
        return False
    try:
        return bool(btrfsutil.is_subvolume(path))
    except (btrfsutil.BtrfsUtilError, OSError):
        return False


class _Journal(Journal):
    def __init__(self, state_dir: str, jid: str):
        super().__init__(state_dir, JOURNAL_DIR, jid)

    def read(self) -> dict | None:
        data = super().read()
        if data is not None and data.get("version") != JOURNAL_VERSION:
            raise BtrfsError(f"{self.path}: unknown journal version {data.get('version')!r}",
                             step="recover")
        return data


def _info(path: str):
    """SubvolumeInfo of the subvolume rooted at path, or None if path is not one."""
    try:
        if not btrfsutil.is_subvolume(path):
            return None
        return btrfsutil.subvolume_info(path)
    except btrfsutil.BtrfsUtilError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise _utilerr("subvolume_info", path, e) from e


def _delete(path: str, uuid_hex: str, what: str, nested: bool = False) -> bool:
    """Delete the subvolume at path if it is the one with this UUID; True if
    deleted. nested: with every subvolume below it (a run's snapshot, where
    the run may have made one: without, the delete fails with ENOTEMPTY and
    the snapshot, with all the run wrote, stays beside the workspace)."""
    info = _info(path)
    if info is None or info.uuid.hex() != uuid_hex:
        return False
    step("delete " + what)
    try:
        btrfsutil.delete_subvolume(path, recursive=nested)
    except btrfsutil.BtrfsUtilError as e:
        if not (nested and e.errno == errno.EROFS):
            raise _utilerr("delete_subvolume", path, e) from e
        _make_writable(path)       # a subvolume in it (or itself) was made read-only
        try:
            btrfsutil.delete_subvolume(path, recursive=True)
        except btrfsutil.BtrfsUtilError as again:
            raise _utilerr("delete_subvolume", path, again) from again
    return True


def _make_writable(path: str) -> None:
    """Clear the read-only flag of the subvolume at path and of every one
    below it: a read-only parent keeps its children from being unlinked."""
    try:
        btrfsutil.set_subvolume_read_only(path, False)
        for sub, _ in btrfsutil.SubvolumeIterator(path, top=0, post_order=False):
            btrfsutil.set_subvolume_read_only(os.path.join(path, sub), False)
    except btrfsutil.BtrfsUtilError as e:
        raise _utilerr("set_subvolume_read_only", path, e) from e


class BtrfsSnapshot:
    """A writable snapshot of a workspace subvolume, beside it (same parent)."""

    def __init__(self, workspace: str, path: str, state_dir: str, journal: _Journal,
                 ws_uuid: str, snap_uuid: str, since: int, otime_ns: int):
        self.workspace = workspace
        self.path = path
        self.state_dir = state_dir
        self.id = journal.id
        self.since = since               # the transaction that created the snapshot
        self._otime_ns = otime_ns        # its creation time (root item otime)
        self._journal = journal
        self._ws_uuid = ws_uuid
        self._snap_uuid = snap_uuid
        self._phase = "live"                 # -> swapped (commit) -> done

    # -- create -----------------------------------------------------------------------------
    @classmethod
    def create(cls, workspace: str, state_dir: str,
               entries: list[mountinfo.MountEntry] | None = None) -> "BtrfsSnapshot":
        """entries: the mount table, if the caller has read it."""
        _need_btrfsutil()
        ws = os.path.abspath(workspace)
        if os.path.realpath(ws) != ws:
            raise BtrfsError(f"create({workspace}): goes through a symlink; refusing", step="config",
                             err=errno.EINVAL)
        if not is_subvolume(ws):
            raise BtrfsError(f"create({ws}): not the root of a btrfs subvolume (errno {errno.EINVAL})",
                             step="config", err=errno.EINVAL)
        if ws in {m.point for m in (mountinfo.read() if entries is None else entries)}:
            raise BtrfsError(f"create({ws}): a mount point; its subvolume cannot be swapped by rename "
                             f"(errno {errno.EBUSY})", step="config", err=errno.EBUSY)
        try:
            nested = next(iter(btrfsutil.SubvolumeIterator(ws)), None)
        except btrfsutil.BtrfsUtilError as e:
            raise _utilerr("SubvolumeIterator", ws, e) from e
        if nested is not None:
            raise BtrfsError(f"create({ws}): nested subvolume {nested[0]!r} (id {nested[1]}); a snapshot "
                             f"would show it empty: refusing the btrfs backend (errno {errno.EXDEV})",
                             step="nested", err=errno.EXDEV)
        ws_info = _info(ws)
        state_dir = os.path.abspath(state_dir)
        journal = _Journal(state_dir, secrets.token_hex(6))
        journal.lock(block=True)
        snap = _snapshot_path(ws, journal.id)
        rec = {"version": JOURNAL_VERSION, "id": journal.id, "phase": "created", "workspace": ws,
               "snapshot": snap, "ws_uuid": ws_info.uuid.hex(), "snap_uuid": None}
        try:
            journal.write(rec)              # before the snapshot exists: recover can find it
            step("snapshot")
            try:
                # its own directory, closed to others: on the host, what the run
                # writes is not anyone's while it lasts (adv14a 03: a setuid
                # copy of a shell, run by another user from beside the workspace)
                os.mkdir(os.path.dirname(snap), 0o700)
            except OSError as e:
                raise _oserr("mkdir", os.path.dirname(snap), e) from e
            try:
                btrfsutil.create_snapshot(ws, snap)
            except btrfsutil.BtrfsUtilError as e:
                raise _utilerr("create_snapshot", f"{ws} -> {snap}", e) from e
            info = btrfsutil.subvolume_info(snap)
            otime_ns = _otime_ns(snap, info.id)
        except BaseException:
            try:
                _recover_one(journal, journal.read() or rec, KEPT_S)
            finally:
                journal.unlock()
            raise
        # The snapshot's UUID is not journaled: recovery knows it by its path and
        # its parent UUID (the workspace's); see _is_our_snapshot.
        return cls(ws, snap, state_dir, journal, ws_info.uuid.hex(), info.uuid.hex(), info.otransid, otime_ns)

    # -- inspect ------------------------------------------------------------------------------------
    def _trees(self) -> tuple[_Tree, _Tree]:
        try:
            btrfsutil.sync(self.path)           # delayed inode items into the tree
            return _Tree(self.workspace), _Tree(self.path)
        except btrfsutil.BtrfsUtilError as e:
            raise _utilerr("sync", self.path, e) from e
        except OSError as e:
            raise _oserr("open", self.workspace, e) from e

    def _abs(self, rels: Iterable[str]) -> list[str]:
        return sorted(self.workspace + "/" + r if r else self.workspace for r in rels)

    def changed_paths(self) -> list[str]:
        """Absolute workspace paths that differ between the workspace and the
        snapshot (created, modified, deleted, renamed from/to, with everything
        below a created or deleted directory; a directory itself only when its
        mode/owner/xattrs differ)."""
        self._check_live()
        ws, snap = self._trees()
        try:
            inos = set(snap.changed_inodes(self.since)) | set(ws.changed_inodes(self.since))
            return self._abs(_diff(ws, snap, inos))
        except OSError as e:
            raise _oserr("tree_search", self.path, e) from e
        finally:
            ws.close()
            snap.close()

    def changes(self) -> list[Change]:
        """changed_paths as report entries: created (only in the snapshot),
        deleted (only in the workspace), replaced (the type changed), else
        modified. A deleted directory is one entry that counts what it held,
        as in the overlay's plan: what is below it is counted, not looked at."""
        out: list[Change] = []
        held: dict[str, int] = {}           # deleted directory -> entries below it
        for p in self.changed_paths():      # sorted: a directory comes before what it holds
            top = self._deleted_above(p, held)
            if top is not None:
                held[top] += 1
                continue
            rel = os.path.relpath(p, self.workspace)
            old = _lstat_or_none(p)
            new = _lstat_or_none(os.path.join(self.path, rel))
            if old is None and new is None:
                continue
            if new is not None:
                runs = os.path.join(self.path, rel)
                granted = privileges(runs, new) if stat.S_ISREG(new.st_mode) else ()
                given = "" if stat.S_ISLNK(new.st_mode) else new_grants(runs, new)
            if old is None:
                out.append(Change(p, "created", file_type(new.st_mode), detail=given,
                                  privileges=granted))
            elif new is None:
                out.append(Change(p, "deleted", file_type(old.st_mode)))
                if stat.S_ISDIR(old.st_mode):
                    held[p] = 0
            elif stat.S_IFMT(old.st_mode) != stat.S_IFMT(new.st_mode):
                out.append(Change(p, "replaced", file_type(new.st_mode), file_type(old.st_mode),
                                  given, privileges=granted))
            else:
                # what a chmod, chown or setfacl changed, judged as the overlay's meta
                detail = "" if stat.S_ISLNK(new.st_mode) else "; ".join(
                    meta_diff(meta_of(p, old), meta_of(runs, new)))
                out.append(Change(p, "modified", file_type(new.st_mode), detail=detail,
                                  privileges=granted))
        return [replace(c, entries=held[c.path]) if c.path in held else c for c in out]

    def _deleted_above(self, path: str, held: dict[str, int]) -> str | None:
        """The highest deleted directory above path, if any."""
        top = None
        d = os.path.dirname(path)
        while len(d) > len(self.workspace):
            if d in held:
                top = d
            d = os.path.dirname(d)
        return top

    def _conflicts(self) -> list[str]:
        ws, snap = self._trees()
        try:
            wch = ws.changed_inodes(self.since)
            if not wch:
                return []
            sch = snap.changed_inodes(self.since)
            both = set(wch) & set(sch)
            out = _diff(ws, snap, set(wch) - both)
            for ino in both:
                item = ws.inode(ino)
                # Touched on both sides.  The workspace side is an atime update only
                # if its ctime is older than the snapshot's creation time (ctime moves
                # on every other change, from the same coarse clock, and cannot be
                # set): otherwise, conservatively, a conflict.
                if item is not None and _ctime_ns(item) < self._otime_ns:
                    continue
                if item is not None and (_mode(item) & 0o170000) == _S_IFDIR:
                    p = ws.dir_path(ino)
                    out.update([p] if p is not None else [])
                else:
                    out.update(ws.paths(ino))
            return self._abs(out)
        except OSError as e:
            raise _oserr("tree_search", self.workspace, e) from e
        finally:
            ws.close()
            snap.close()

    # -- commit / discard ----------------------------------------------------------------------------
    def commit(self) -> None:
        """Make the workspace path show the snapshot; delete the old workspace."""
        self.swap()
        self.finish()

    def swap(self) -> None:
        """Make the workspace path show the snapshot, durably.  The old
        workspace is then at self.path, until finish() deletes it."""
        self._check_live()
        conflicts = self._conflicts()
        if conflicts:
            shown = ", ".join(conflicts[:10]) + (f" (+{len(conflicts) - 10} more)" if len(conflicts) > 10 else "")
            raise BtrfsConflict(f"commit({self.workspace}): the workspace changed after the snapshot "
                                f"(transaction {self.since}): {shown}", conflicts)
        # No record before the exchange: recovery tells whether it happened by
        # the UUID at the workspace path (a subvolume whose parent is the
        # workspace: this snapshot), and finishes it if so.
        parent = os.path.dirname(self.workspace)
        try:
            pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise _oserr("open", parent, e) from e
        try:
            hfd = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            os.close(pfd)
            raise _oserr("open", os.path.dirname(self.path), e) from e
        try:
            step("exchange")
            try:
                renameat2(hfd, os.path.basename(self.path), os.path.basename(self.workspace),
                          RENAME_EXCHANGE, pfd)
            except OSError as e:
                raise _oserr("renameat2(RENAME_EXCHANGE)", f"{self.path} <-> {self.workspace}", e) from e
            self._phase = "swapped"
            step("sync")
            try:
                btrfsutil.sync(parent)          # one transaction commit: the exchange is on disk
            except btrfsutil.BtrfsUtilError as e:
                raise _utilerr("sync", parent, e) from e
        finally:
            os.close(pfd)
            os.close(hfd)

    @property
    def swapped(self) -> bool:
        """The workspace path shows the snapshot (finish() is due)."""
        return self._phase == "swapped"

    def finish(self) -> None:
        """After swap(): delete the old workspace and the record."""
        if not self.swapped:
            raise BtrfsError(f"finish({self.path}): not swapped (phase {self._phase})", step="state",
                             err=errno.EINVAL)
        self._phase = "done"
        try:
            _delete(self.path, self._ws_uuid, "old workspace")
            _remove_holder(self.path)
        except BtrfsError as e:
            self._journal.unlock()
            raise BtrfsError(f"commit({self.workspace}): applied, but deleting the old workspace failed: {e}; "
                             f"recover_btrfs({self.state_dir!r}) retries it", step=e.step, err=e.errno) from e
        self._journal.remove()

    def discard(self) -> None:
        """Rollback: delete the snapshot.  The workspace was never touched."""
        self._check_live()
        self._phase = "done"
        try:
            _delete(self.path, self._snap_uuid, "snapshot", nested=True)
            _remove_holder(self.path)
        except BaseException:
            self._journal.unlock()          # recover_btrfs retries it
            raise
        self._journal.remove()

    def keep(self) -> None:
        """Leave the snapshot for the user (a conflicting run's version):
        recover_btrfs deletes it once it is older than max_kept_s."""
        self._check_live()
        self._journal.write({**self._record("kept"), "kept_at": time.time()})
        self._phase = "done"
        self._journal.unlock()

    def _record(self, phase: str) -> dict:
        return {"version": JOURNAL_VERSION, "id": self.id, "phase": phase, "workspace": self.workspace,
                "snapshot": self.path, "ws_uuid": self._ws_uuid, "snap_uuid": self._snap_uuid}

    def _check_live(self) -> None:
        if self._phase != "live":
            raise BtrfsError(f"snapshot {self.path} already committed or discarded", step="state",
                             err=errno.EINVAL)

    def __repr__(self) -> str:
        return f"BtrfsSnapshot(workspace={self.workspace!r}, path={self.path!r}, since={self.since})"


# --- recovery ---------------------------------------------------------------------------------

def _snapshot_path(workspace: str, jid: str) -> str:
    """Where a run's snapshot is: in a 0700 directory of its own beside the
    workspace (the same parent, so that one rename exchanges them)."""
    return os.path.join(os.path.dirname(workspace), SNAP_PREFIX + jid, SNAPSHOT_NAME)


def _remove_holder(snap: str) -> None:
    """The snapshot's directory, once the snapshot (or the old workspace) in
    it is deleted; gone already is fine."""
    try:
        os.rmdir(os.path.dirname(snap))
    except FileNotFoundError:
        pass
    except OSError as e:
        raise _oserr("rmdir", os.path.dirname(snap), e) from e


def _is_our_snapshot(path: str, rec: dict) -> str | None:
    """UUID of the subvolume at path if it is this record's snapshot."""
    info = _info(path)
    if info is None:
        return None
    if rec.get("snap_uuid"):
        return info.uuid.hex() if info.uuid.hex() == rec["snap_uuid"] else None
    return info.uuid.hex() if info.parent_uuid.hex() == rec["ws_uuid"] else None


def _recover_one(journal: _Journal, rec: dict, max_kept_s: float) -> str | None:
    """Bring one record to the pre-state or the post-state, then drop it; a
    kept snapshot only once it is older than max_kept_s (else None).
    Idempotent."""
    ws, snap, phase = rec["workspace"], rec["snapshot"], rec["phase"]
    if phase == "kept" and time.time() - rec.get("kept_at", 0) <= max_kept_s:
        journal.unlock()
        return None
    if snap != _snapshot_path(ws, rec["id"]):
        raise BtrfsError(f"{journal.path}: snapshot path does not match the record", step="recover")
    exchanged = phase != "kept" and _is_our_snapshot(ws, rec) is not None
    if exchanged:
        _delete(snap, rec["ws_uuid"], "old workspace")
        what = f"{rec['id']}: commit finished ({ws} shows the snapshot; old workspace deleted)"
    else:
        uuid = _is_our_snapshot(snap, rec)
        if uuid is not None:
            _delete(snap, uuid, "snapshot", nested=True)
        what = f"{rec['id']}: rolled back (was {phase}; snapshot {'deleted' if uuid else 'absent'})"
    _remove_holder(snap)
    journal.remove()
    return what


def recover_btrfs(state_dir: str, max_kept_s: float = KEPT_S) -> list[str]:
    """Finish or undo every interrupted btrfs commit, and delete the snapshots of
    runs whose owner died, and kept snapshots older than max_kept_s.  Records
    held by a live owner are left alone.  With no records there is nothing to
    do, btrfsutil or not."""
    jdir = os.path.join(os.path.abspath(state_dir), JOURNAL_DIR)
    try:
        names = sorted(os.listdir(jdir))
    except FileNotFoundError:
        return []
    if names:
        _need_btrfsutil()
    ids = sorted({m.group(1) for m in map(re.compile(r"([0-9a-f]{12})\.(?:json|json\.tmp|lock)").fullmatch,
                                          names) if m})
    done = []
    for jid in ids:
        journal = _Journal(os.path.abspath(state_dir), jid)
        if not journal.lock(block=False):
            continue                        # a live snapshot or commit
        try:
            rec = journal.read()
            if rec is None:
                journal.remove()            # died before its first record: nothing exists
                continue
            what = _recover_one(journal, rec, max_kept_s)
            if what is not None:
                done.append(what)
        except ForgedJournal as e:
            journal.unlock(remove=True)
            done.append(f"{jid}: {SET_ASIDE}: {e}")
        except (OSError, BtrfsError, ValueError) as e:
            journal.unlock()
            done.append(f"{jid}: FAILED, record kept: {e}")
    return done


def _lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
