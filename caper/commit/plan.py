"""The commit plan: a read-only walk of the upper dirs that turns each entry
into a unit (one host path swapped atomically: create, replace, delete; or a
hard-linked file rewritten in place), a directory the run renamed (an
overlay redirect) into a move, a metadata change in place, or directory
times; with the host paths whose ctime says the host changed them during the
run (conflicts). Nothing at or below another caper state directory (one that
holds caper.state.MARKER on the host) is ever planned."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from caper.changes import CREATED, DELETED, META, MODIFIED, REPLACED, Change, Layer, file_type
from caper.commit.ctimes import changed_since
from caper.commit.fsops import (
    MAX_TREE_DEPTH, DirFds, depth_ok, fs_error, is_whiteout, lstat,
    meta_diff, meta_of, mount_points, new_grants, obj_fd, open_root, overlay_xattrs, privileges,
    proc_path, same_data, scandir,
)
from caper.errors import CommitError
from caper.fs import mountinfo
from caper.fs.syscalls import open_by_handle, open_quiet, open_regular
from caper.state import MARKER

COMPARE_MAX = 1 << 20             # bytes compared to tell a meta-only change from a write

# unit operations. REWRITE: new content written into the host's inode itself
# (a file with other hard links, written through one name), its old content
# kept at the stage name for an undo.
CREATE, REPLACE, DELETE, REWRITE = "create", "replace", "delete", "rewrite"


# --- the plan ---------------------------------------------------------------------------------

@dataclass
class Unit:
    op: str                       # create | replace | delete
    layer: int
    parent: tuple                 # host dir, relative to the mount point
    name: str
    upper: tuple | None = None    # new content, relative to the upper dir
    host_ino: int | None = None   # what the host had (replace, delete)
    tree: list | None = None      # new directory: [(rel below it, lstat)] pre-order
    origin: tuple | None = None   # (handle type, handle): a host inode with other hard links
                                  # that the new entry is (create, replace) or that gets new
                                  # data and attributes (rewrite)
    data: bool = False            # rewrite: new data (its old data kept at the stage name,
                                  # in the layer's root)
    from_index: bool = False      # rewrite: `upper` is in the overlay's index, not the upper dir
    meta: dict | None = None      # rewrite: old/new attributes and times
    stage: str = ""
    staged_ino: int | None = None

    def to_json(self) -> dict:
        return {"op": self.op, "layer": self.layer, "parent": list(self.parent), "name": self.name,
                "upper": None if self.upper is None else list(self.upper),
                "host_ino": self.host_ino, "stage": self.stage, "staged_ino": self.staged_ino,
                "origin": None if self.origin is None else [self.origin[0], self.origin[1].hex()],
                "data": self.data, "meta": self.meta}


@dataclass
class Move:
    """A directory the run renamed (overlay redirect_dir): the host's own
    directory is renamed, so what is below it keeps its inodes and links.
    `src` is where it is before the commit, `dst` where the run left it, both
    relative to the layer's mount point; `displaced`: the (empty) directory
    the rename replaced at dst, if any."""
    layer: int
    src: tuple
    dst: tuple
    ino: int
    displaced: int | None = None
    stage: str = ""               # its hidden name in the layer's root between the two renames

    def to_json(self) -> dict:
        return {"layer": self.layer, "src": list(self.src), "dst": list(self.dst), "ino": self.ino,
                "displaced": self.displaced, "stage": self.stage}


@dataclass
class NewDir:
    """A new directory that a moved one goes into: made (mkdir) before the
    moves, its other entries committed one by one."""
    layer: int
    rel: tuple
    ino: int | None = None        # once made


@dataclass
class MetaChange:
    layer: int
    rel: tuple
    ino: int
    old: dict
    new: dict


@dataclass
class TimesChange:
    layer: int
    rel: tuple
    old: tuple[int, int]
    new: tuple[int, int] | None


class LayerPlan:
    def __init__(self, index: int, layer: Layer, exclude: list[str], mounts: set[str]):
        self.index = index
        self.layer = layer
        self.exclude = exclude
        below = layer.mount_point.rstrip("/") + "/"
        self.mounts = {m for m in mounts if m.startswith(below)}   # mounts the overlay did not show
        self.host = open_root(layer.mount_point)
        try:
            self.up = DirFds(layer.upper, own=True)
        except OSError as e:
            self.host.close()
            raise fs_error(e, "open", layer.upper) from e
        self.dev = self.host.dev
        self.can_link = True
        self.index_dir: DirFds | None = None           # the overlay's index (index=on): see Layer.work
        if layer.work and not layer.userxattr:
            try:
                self.index_dir = DirFds(os.path.join(layer.work, "index"), own=True)
            except FileNotFoundError:
                pass
            except OSError as e:
                self.close()
                raise fs_error(e, "open", os.path.join(layer.work, "index")) from e
        self.moved_to: dict[tuple, tuple] = {}     # dst -> src of each Move
        self.moved_from: set[tuple] = set()
        self.new_dirs: set[tuple] = set()          # NewDir.rel
        self.rewritten: set[int] = set()           # host inodes a REWRITE unit writes
        # linked host inodes at a name the upper names (written, replaced, deleted) -> that name
        self.seen_linked: dict[int, tuple[tuple, str]] = {}
        self.pending_links: list[tuple] = []       # see _UpperWalk._linked
        self.state_dirs: list[str] = []            # host dirs the walk met holding MARKER

    def source(self, rel: tuple) -> tuple | None:
        """Where the host entry that the run saw at `rel` is before the
        commit's moves; None: nowhere (moved away, or below a new directory)."""
        if not self.moved_to and not self.new_dirs:
            return rel
        src: tuple = ()
        absent = False
        for i, name in enumerate(rel):
            here = rel[:i + 1]
            if here in self.moved_to:           # a moved directory, even below a new one
                src, absent = self.moved_to[here], False
            elif absent or here in self.new_dirs:
                absent = True
            else:
                src = src + (name,)
                absent = src in self.moved_from
        return None if absent else src

    def host_fd(self, rel: tuple) -> int:
        """The fd of the host directory the run saw at `rel` (see source)."""
        src = self.source(rel)
        if src is None:
            raise CommitError(f"{self.host.path(rel)}: not on the host before the commit", step="plan")
        return self.host.fd(src)

    def host_lstat(self, rel: tuple, name: str) -> os.stat_result | None:
        """The host entry the run saw at rel/name (see source), or None."""
        src = self.source(rel + (name,))
        if src is None:
            return None
        return self.host.lstat(src[:-1], src[-1])

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
        if self.index_dir is not None:
            self.index_dir.close()


@dataclass
class Plan:
    layers: list[LayerPlan]
    units: list[Unit] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    new_dirs: list[NewDir] = field(default_factory=list)
    metas: list[MetaChange] = field(default_factory=list)
    times: list[TimesChange] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    shut: list[dict] = field(default_factory=list)   # see shut_dirs
    since_ns: int | None = None   # the run's start: a host ctime at or after it is a change
    relinked: set = field(default_factory=set)   # host inodes caper's own link or rename touched

    def close(self) -> None:
        for lp in self.layers:
            lp.close()


class _UpperWalk:
    """Read-only walk of the upper dirs.  `since_ns` None: no conflict checks."""

    def __init__(self, layers: Sequence[Layer], exclude: Iterable[str], since_ns: int | None):
        self.since = since_ns
        excl = sorted({os.path.normpath(os.path.abspath(e)) for e in exclude})
        mounts = [os.path.normpath(l.mount_point) for l in layers]
        if len(set(mounts)) != len(mounts):
            raise CommitError(f"two layers cover the same mount point: {mounts}", step="config")
        lps = []
        all_mounts = mount_points()
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
                lps.append(LayerPlan(len(lps), layer, excl + nested, all_mounts))
        except BaseException:
            for lp in lps:
                lp.close()
            raise
        self.plan = Plan(lps, since_ns=since_ns)

    def run(self) -> Plan:
        try:
            for lp in self.plan.layers:
                root = lp.host.lstat((), ".")
                self.plan.times.append(TimesChange(lp.index, (), (root.st_atime_ns, root.st_mtime_ns), None))
                start = len(self.plan.changes)
                self._find_moves(lp)
                self._walk(lp, (), (), opaque=False)
                self._settle_links(lp)
                self._index_rewrites(lp)
                self._no_state_changes(lp, self.plan.changes[start:])
        except BaseException:
            self.plan.close()
            raise
        return self.plan

    # -- helpers
    @staticmethod
    def _no_state_changes(lp: LayerPlan, changes: Sequence[Change]) -> None:
        """CASE(*, state-dir): caper's state directories that caper does not
        know of (the same user's other CAPER_STATE_DIR: a script's, CI's),
        so does not hide, are known by their MARKER on the host: a change at
        or below one is refused, and so is a new or changed MARKER (a run
        never makes a state directory)."""
        for c in changes:
            if os.path.basename(c.path) == MARKER:
                raise CommitError(f"{c.path}: the run made or changed caper's state directory "
                                  "marker; a run never makes a state directory, refusing",
                                  step="plan")
            for d in lp.state_dirs:
                if mountinfo.below(c.path, d):
                    raise CommitError(f"{c.path}: inside {d}, a caper state directory (it holds "
                                      f"{MARKER}); a run never changes one, refusing", step="plan")

    def _conflict(self, hp: str, st: os.stat_result) -> None:
        # CASE(*, changed-on-host): ctime at/after the snapshot (caper.commit.ctimes)
        if self.since is not None and changed_since(st.st_ctime_ns, self.since):
            self.plan.conflicts.append(hp)

    def _upper_marks(self, lp: LayerPlan, urel: tuple, ust: os.stat_result) -> dict[str, bytes]:
        if stat.S_ISLNK(ust.st_mode):
            return {}
        ofd = obj_fd(lp.up.fd(urel[:-1]), urel[-1])
        try:
            marks = overlay_xattrs(proc_path(ofd), lp.layer.userxattr)
        finally:
            os.close(ofd)
        up = lp.up.path(urel)
        # CASE(metacopy, *): a metacopy file (metacopy=on) has its data elsewhere:
        # refused, never half-applied (caper mounts with metacopy=off).
        if "metacopy" in marks:
            raise CommitError(f"{up}: overlay metacopy xattr (metacopy mounts are not supported)",
                              step="plan")
        if "redirect" in marks and (not stat.S_ISDIR(ust.st_mode) or urel not in lp.moved_to):
            raise CommitError(f"{up}: overlay redirect xattr where the plan has no move", step="plan")
        if "opaque" in marks and marks["opaque"] != b"y":
            raise CommitError(f"{up}: unsupported overlay opaque value {marks['opaque']!r}", step="plan")
        return marks

    # -- directories the run renamed
    def _find_moves(self, lp: LayerPlan) -> None:
        """Every upper directory with a redirect (the run renamed a directory
        that was on the host): resolved to the host directory it names, as
        the overlay did, shallowest first (a relative redirect names an entry
        of its parent's source). userxattr mounts have none: the kernel refuses
        redirect_dir=on with userxattr."""
        if lp.layer.userxattr:
            return
        found: list[tuple[tuple, bytes]] = []

        def scan(urel: tuple) -> None:
            depth_ok(lp.up, urel)
            with scandir(lp.up.fd(urel)) as it:
                names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
            for n in names:
                u = urel + (n,)
                marks = overlay_xattrs(proc_path(lp.up.fd(u)), False)
                if "redirect" in marks:
                    found.append((u, marks["redirect"]))
                scan(u)

        scan(())
        for dst, redirect in sorted(found, key=lambda f: len(f[0])):
            if redirect.startswith(b"/"):
                src: tuple | None = tuple(os.fsdecode(c) for c in redirect.split(b"/") if c)
            else:
                parent = lp.source(dst[:-1])
                src = None if parent is None else parent + (os.fsdecode(redirect),)
            self._move(lp, dst, src, redirect)

    def _move(self, lp: LayerPlan, dst: tuple, src: tuple | None, redirect: bytes) -> None:
        dp = lp.host.path(dst)
        if not src or any(c in ("", ".", "..") or "/" in c for c in src):
            raise CommitError(f"{lp.up.path(dst)}: overlay redirect {redirect!r} names no host "
                              "directory; refusing", step="plan")
        sp = lp.host.path(src)
        if src[:-1] not in lp.moved_from and lp.source(src[:-1]) == src[:-1] \
                and not self._hidden_in_upper(lp, src):
            # the run's view still showed the source (no whiteout, nothing over it)
            raise CommitError(f"{lp.up.path(dst)}: overlay redirect to {sp}, which the run still "
                              "saw in its place; refusing", step="plan")
        try:
            sst = lp.host.lstat(src[:-1], src[-1])
        except CommitError:
            sst = None
        if sst is None or not stat.S_ISDIR(sst.st_mode):
            # CASE(moved-dir, changed-on-host): its source went during the run
            self.plan.conflicts.append(sp)
            return
        self._conflict(sp, sst)
        # CASE(moved-dir, mount)  CASE(moved-dir, excluded): a rename would carry
        # a mount or one of caper's own paths along: refused
        if sst.st_dev != lp.dev:
            raise CommitError(f"{sp}: {lp.boundary(sp)}; refusing to rename it", step="plan")
        lp.check_mount(sp, below=True)
        if lp.host.lstat(src, MARKER) is not None:
            # CASE(moved-dir, state-dir): caper's state is never moved by a run
            raise CommitError(f"{sp}: a caper state directory (it holds {MARKER}); the run "
                              "renamed it, refusing", step="plan")
        for p in (sp, dp):
            if lp.excluded(p) or lp.excluded_below(p):
                raise CommitError(f"{p}: the run renamed a directory from or to here, which holds "
                                  "a path caper keeps out of commits; refusing", step="plan")
        # What the rename replaced at dst: an empty directory there (rename(2)
        # replaces nothing else); a path that is itself moved away is not in the way.
        parent = lp.source(dst[:-1])
        displaced = None
        if parent is not None and parent + (dst[-1],) not in lp.moved_from:
            try:
                displaced = lp.host.lstat(parent, dst[-1])
            except CommitError:
                displaced = None          # its parent is new: nothing there
        if displaced is not None:
            if not stat.S_ISDIR(displaced.st_mode):
                raise CommitError(f"{dp}: the run renamed a directory onto this "
                                  f"{file_type(displaced.st_mode)}; refusing", step="plan")
            self._doomed(lp, dst[:-1], dst[-1], displaced, replacing=True)
        lp.moved_to[dst] = src
        lp.moved_from.add(src)
        self.plan.moves.append(Move(lp.index, src, dst, sst.st_ino,
                                    None if displaced is None else displaced.st_ino))
        self.plan.changes.append(Change(sp, DELETED, "dir", None, f"renamed to {dp}"))
        self.plan.changes.append(Change(dp, CREATED if displaced is None else REPLACED, "dir",
                                        None if displaced is None else "dir", f"renamed from {sp}"))

    @staticmethod
    def _hidden_in_upper(lp: LayerPlan, rel: tuple) -> bool:
        """Does the upper hide or replace the host entry at rel (a whiteout or another entry)?"""
        try:
            return lp.up.lstat(rel[:-1], rel[-1]) is not None
        except CommitError:
            return False                  # its directory is not in the upper

    def _receives_move(self, lp: LayerPlan, rel: tuple) -> bool:
        return any(len(d) > len(rel) and d[:len(rel)] == rel for d in lp.moved_to)

    # -- the walk
    def _walk(self, lp: LayerPlan, urel: tuple, hrel: tuple, opaque: bool) -> None:
        """Upper dir `urel` over the host dir `hrel` (which exists).  `opaque`:
        the host's entries are hidden (this dir or one above is opaque)."""
        depth_ok(lp.host, hrel)
        src = lp.source(hrel)
        if src is not None and lp.host.lstat(src, MARKER) is not None:
            lp.state_dirs.append(lp.host.path(hrel))      # see _no_state_changes
        with scandir(lp.up.fd(urel)) as it:
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
            ust = lstat(name, dir_fd=lp.up.fd(urel))
            hst = lp.host_lstat(hrel, name)
            if hst is not None and stat.S_ISREG(hst.st_mode) and hst.st_nlink > 1:
                lp.seen_linked.setdefault(hst.st_ino, (hrel, name))     # see _linked
            fmt = stat.S_IFMT(ust.st_mode)
            if is_whiteout(ust):
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
                if hst is None and self._receives_move(lp, u):
                    # CASE(dir-with-moved, none): a new directory a renamed one goes into
                    self._new_dir(lp, u, ust)
                elif hst is None:
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
                linked = None
                if fmt == stat.S_IFREG:
                    linked = self._linked_origin(lp, self._upper_marks(lp, u, ust))
                if linked is not None:
                    # CASE(linked-file, *): a copy of a host file with other hard
                    # links (index=on kept them together in the run)
                    self._linked(lp, u, hrel, name, ust, hst, *linked)
                else:
                    self._leaf(lp, u, hrel, name, ust, hst)
            else:
                # CASE(device, *): the sandbox cannot make devices; never committed
                raise CommitError(f"{lp.up.path(u)}: a {file_type(ust.st_mode)} in the upper dir; refusing",
                                  step="plan")
        if opaque:
            with scandir(lp.host_fd(hrel)) as it:
                host_names = sorted(e.name for e in it)
            for name in host_names:
                if name in kept or lp.excluded(lp.host.path(hrel + (name,))):
                    continue
                hst = lp.host_lstat(hrel, name)
                if hst is not None:
                    self._delete(lp, hrel, name, hst)

    def _privileges(self, lp: LayerPlan, u: tuple, ust: os.stat_result) -> tuple[str, ...]:
        return privileges_of(lp.up, u, ust)

    def _link_detail(self, lp: LayerPlan, u: tuple, ust: os.stat_result) -> str:
        """A new entry's detail: a symlink's target; what its ACLs,
        security.* xattrs and mode grant, which commit carries over with it."""
        if stat.S_ISLNK(ust.st_mode):
            return "-> " + os.readlink(u[-1], dir_fd=lp.up.fd(u[:-1]))
        fd = obj_fd(lp.up.fd(u[:-1]), u[-1]) if u else None
        try:
            return new_grants(proc_path(fd) if fd is not None else lp.up.path(u), ust)
        finally:
            if fd is not None:
                os.close(fd)

    def _unit(self, lp, op, u, hrel, name, hst, ust=None, tree=None) -> Unit:
        unit = Unit(op, lp.index, hrel, name, u, None if hst is None else hst.st_ino, tree)
        self.plan.units.append(unit)
        return unit

    def _leaf(self, lp, u, hrel, name, ust, hst) -> None:
        """A non-directory of the upper over the host entry hst (or none)."""
        hp = lp.host.path(hrel + (name,))
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

    def _linked_origin(self, lp: LayerPlan, marks: dict[str, bytes]) -> tuple[tuple, os.stat_result] | None:
        """The host inode an upper file was copied up from (its overlay origin,
        a file handle), if that inode has other hard links: ((handle type,
        handle), its lstat); None for anything else (a plain copy does)."""
        fh = marks.get("origin")
        # struct ovl_fb {u8 version, magic 0xfb, len, flags, type; uuid[16]; fid[]}
        if fh is None or len(fh) < 21 or fh[1] != 0xFB or fh[2] != len(fh):
            return None
        handle = (fh[4], bytes(fh[21:]))
        try:
            fd = open_by_handle(lp.host.fd(()), handle[0], handle[1], os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return None            # gone from the host, or not the layer's filesystem
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_dev != lp.dev or st.st_nlink < 2:
            return None
        return handle, st

    def _linked(self, lp, u, hrel, name, ust, hst, handle: tuple, ost: os.stat_result) -> None:
        """An upper file that is the host inode `ost`, which has other hard
        links. At its own name: its new data and attributes are written into
        that inode, as a native write through one name changes them for all.
        At another name (the run renamed or linked it there), that name
        becomes one more link to it, once the walk has seen the inode at a
        name the run deleted (settle_links): a file handle alone is not
        trusted to name a file of this tree."""
        if hst is not None and hst.st_ino == ost.st_ino:
            lp.seen_linked[ost.st_ino] = (hrel, name)
            self._rewrite(lp, u, hrel, name, ust, handle, ost)
        else:
            lp.pending_links.append((u, hrel, name, ust, hst, handle, ost))

    def _settle_links(self, lp: LayerPlan) -> None:
        for u, hrel, name, ust, hst, handle, ost in lp.pending_links:
            if ost.st_ino not in lp.seen_linked:
                self._leaf(lp, u, hrel, name, ust, hst)       # a copy of its own, as without index
                continue
            hp = lp.host.path(hrel + (name,))
            if hst is not None:
                self._doomed(lp, hrel, name, hst, replacing=True)
            unit = self._unit(lp, CREATE if hst is None else REPLACE, u, hrel, name, hst, ust)
            unit.origin = handle
            self.plan.changes.append(Change(hp, CREATED if hst is None else REPLACED, "file",
                                            None if hst is None else file_type(hst.st_mode),
                                            "one more hard link of a file that was there before the run",
                                            privileges=self._privileges(lp, u, ust)))
            self._rewrite(lp, u, hrel, name, ust, handle, ost, in_place=False)

    def _index_rewrites(self, lp: LayerPlan) -> None:
        """CASE(linked-index, *): a hard-linked file the run wrote through a
        name it then deleted or renamed onto: its new data is only in the
        overlay's index (named by the hex of its origin's file handle), and
        its other names on the host get it, as natively."""
        if lp.index_dir is None:
            return
        with scandir(lp.index_dir.fd(())) as it:
            names = sorted(e.name for e in it)
        for n in names:
            ist = lstat(n, dir_fd=lp.index_dir.fd(()))
            try:
                origin = bytes.fromhex(n)
            except ValueError:
                continue
            linked = self._linked_origin(lp, {"origin": origin}) if stat.S_ISREG(ist.st_mode) else None
            if linked is None or linked[1].st_ino in lp.rewritten or linked[1].st_ino not in lp.seen_linked:
                continue                        # written by a name the walk saw, or not this tree's
            hrel, name = lp.seen_linked[linked[1].st_ino]
            self._rewrite(lp, (n,), hrel, name, ist, *linked, source=lp.index_dir)

    def _rewrite(self, lp, u, hrel, name, ust, handle: tuple, ost: os.stat_result,
                 in_place: bool = True, source: DirFds | None = None) -> None:
        """CASE(linked-file, *): the new data and attributes of a host inode
        with other links, from the upper file u (of `source`: the upper dir,
        or the overlay's index)."""
        hp = lp.host.path(hrel + (name,))
        if ost.st_ino in lp.rewritten:
            return
        lp.rewritten.add(ost.st_ino)
        source = source or lp.up
        fd = open_by_handle(lp.host.fd(()), handle[0], handle[1], os.O_RDONLY | os.O_CLOEXEC)
        uo = os.open(u[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=source.fd(u[:-1]))
        try:
            data = ust.st_size != ost.st_size or not same_data(uo, fd)
            old_m, new_m = meta_of(proc_path(fd), ost), meta_of(proc_path(uo), ust)
        finally:
            os.close(fd)
            os.close(uo)
        details = meta_diff(old_m, new_m)
        if not data and not details and ust.st_mtime_ns == ost.st_mtime_ns:
            return
        self._conflict(hp, ost)
        unit = self._unit(lp, REWRITE, u, hrel, name, ost, ust)
        unit.origin, unit.data, unit.from_index = handle, data, source is lp.index_dir
        unit.meta = {"old": old_m, "new": new_m,
                     "old_times": [ost.st_atime_ns, ost.st_mtime_ns],
                     "new_times": [ust.st_atime_ns, ust.st_mtime_ns]}
        if not in_place:
            return                  # the new name's change says it already
        if ust.st_mtime_ns != ost.st_mtime_ns and not data:
            details.append("mtime")
        if source is lp.index_dir:
            details.insert(0, "written through this name, which the run then removed: the file's "
                              "other hard links have the new version")
        self.plan.changes.append(Change(hp, MODIFIED if data else META, "file", None, "; ".join(details),
                                        privileges=privileges_of(source, u, ust)))

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
            self.plan.metas.append(MetaChange(lp.index, rel, hst.st_ino, old_m, new_m))
            self.plan.times.append(TimesChange(lp.index, rel, (hst.st_atime_ns, hst.st_mtime_ns),
                                          (ust.st_atime_ns, ust.st_mtime_ns)))
        else:
            self._unit(lp, REPLACE, u, hrel, name, hst, ust)
        # Without index=on (rootless) a write through one name copied it up
        # alone: the new inode leaves the host file's other links behind.
        split = kind == MODIFIED and stat.S_ISREG(hst.st_mode) and hst.st_nlink > 1
        self.plan.changes.append(Change(hp, kind, new_t, None, detail,
                                        privileges=self._privileges(lp, u, ust), links_split=split))

    def _leaf_diff(self, lp, u, hrel, name, ust, hst) -> tuple[str, str, dict, dict] | None:
        """(kind, detail, host's meta, upper's meta) of an upper entry over a host
        entry of the same type, or None if equal."""
        if stat.S_ISLNK(ust.st_mode):
            new = os.readlink(u[-1], dir_fd=lp.up.fd(u[:-1]))
            old = os.readlink(name, dir_fd=lp.host_fd(hrel))
            if new != old:
                return MODIFIED, f"-> {new}", {}, {}
        same_content = True
        if stat.S_ISREG(ust.st_mode):
            # Reading both is only worth it to tell a chmod/touch (meta) from a write:
            # a big file whose mtime moved counts as modified unread.
            same_content = (ust.st_size == hst.st_size
                            and (ust.st_mtime_ns == hst.st_mtime_ns or ust.st_size <= COMPARE_MAX)
                            and self._same_bytes(lp, u, hrel, name))
        uo = obj_fd(lp.up.fd(u[:-1]), u[-1])
        ho = obj_fd(lp.host_fd(hrel), name)
        try:
            new_m, old_m = meta_of(proc_path(uo), ust), meta_of(proc_path(ho), hst)
        finally:
            os.close(uo)
            os.close(ho)
        details = meta_diff(old_m, new_m)
        if not same_content:     # and what a chmod in the same run changed, judged as a meta's
            return MODIFIED, "; ".join(details), old_m, new_m
        if ust.st_mtime_ns != hst.st_mtime_ns:
            details.append("mtime")
        if not details and ust.st_nlink == 1:
            return None
        return META, "; ".join(details), old_m, new_m

    def _same_bytes(self, lp, u, hrel, name) -> bool:
        a = os.open(u[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=lp.up.fd(u[:-1]))
        try:
            b = open_regular(name, lp.host_fd(hrel))   # swapped for a FIFO or device: not opened
        except OSError:
            os.close(a)
            return False
        try:
            return same_data(a, b)
        finally:
            os.close(a)
            os.close(b)

    def _dir_meta(self, lp, u, hrel, ust, hst) -> None:
        # the run's times, unless the host changed the directory's entries since
        host_touched = self.since is not None and hst.st_mtime_ns >= self.since
        self.plan.times.append(TimesChange(lp.index, hrel, (hst.st_atime_ns, hst.st_mtime_ns),
                                      None if host_touched else (ust.st_atime_ns, ust.st_mtime_ns)))
        uo = obj_fd(lp.up.fd(u[:-1]), u[-1])
        src = lp.source(hrel)
        ho = obj_fd(lp.host.fd(src[:-1]), src[-1])
        try:
            new, old = meta_of(proc_path(uo), ust), meta_of(proc_path(ho), hst)
        finally:
            os.close(uo)
            os.close(ho)
        details = meta_diff(old, new)
        if details:
            hp = lp.host.path(hrel)
            self._conflict(hp, hst)
            self.plan.metas.append(MetaChange(lp.index, hrel, hst.st_ino, old, new))
            self.plan.changes.append(Change(hp, META, "dir", None, "; ".join(details)))

    def _new_dir(self, lp, u, ust) -> None:
        """A new directory that a renamed one goes into: made before the moves,
        with the run's attributes; what else is in it is committed entry by entry."""
        lp.new_dirs.add(u)
        self.plan.new_dirs.append(NewDir(lp.index, u))
        self.plan.times.append(TimesChange(lp.index, u, (0, 0), (ust.st_atime_ns, ust.st_mtime_ns)))
        self.plan.changes.append(Change(lp.host.path(u), CREATED, "dir", None,
                                        self._link_detail(lp, u, ust)))
        self._walk(lp, u, u, opaque=False)

    def _new(self, lp, op, u, hrel, name, hst) -> None:
        """A directory from the upper replaces nothing (create) or a host non-directory."""
        hp = lp.host.path(hrel + (name,))
        if hst is not None:
            self._conflict(hp, hst)
        tree = []
        changes = [Change(hp, CREATED if hst is None else REPLACED, "dir",
                          None if hst is None else file_type(hst.st_mode),
                          self._link_detail(lp, u, lstat(u[-1], dir_fd=lp.up.fd(u[:-1]))))]

        def scan(trel: tuple) -> None:
            depth_ok(lp.host, hrel + (name,) + trel)
            ufd = lp.up.fd(u + trel)
            with scandir(ufd) as it:
                names = sorted(e.name for e in it)
            for n in names:
                cp = lp.host.path(hrel + (name,) + trel + (n,))
                if lp.excluded(cp):
                    continue
                st = lstat(n, dir_fd=lp.up.fd(u + trel))
                if is_whiteout(st):
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
        depth_ok(lp.host, hrel)
        hp = lp.host.path(hrel + (name,))
        if stat.S_ISDIR(hst.st_mode) and lp.excluded_below(hp):
            # CASE(whiteout, dir-with-excluded): keep the directory and what is
            # excluded below it, delete the rest
            with scandir(lp.host_fd(hrel + (name,))) as it:
                names = sorted(e.name for e in it)
            for n in names:
                if lp.excluded(lp.host.path(hrel + (name, n))):
                    continue
                st = lp.host_lstat(hrel + (name,), n)
                if st is not None:
                    self._delete(lp, hrel + (name,), n, st)
            return
        n = self._doomed(lp, hrel, name, hst, replacing=False)
        if stat.S_ISREG(hst.st_mode) and hst.st_nlink > 1:
            lp.seen_linked.setdefault(hst.st_ino, (hrel, name))      # an opaque dir's sweep
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
            with scandir(fd) as it:
                names = [e.name for e in it]
            if MARKER in names:
                # CASE(whiteout, state-dir): a tree holding caper's state is never removed
                raise CommitError(f"{where}: a caper state directory (it holds {MARKER}); the run "
                                  "deletes or replaces it, refusing", step="plan")
            for n in names:
                st = lstat(n, dir_fd=fd)
                p = where + "/" + n
                self._conflict(p, st)
                count += 1
                if stat.S_ISDIR(st.st_mode):
                    if st.st_dev != lp.dev:
                        raise CommitError(f"{p}: {lp.boundary(p)} below a directory the run deletes; "
                                          "refusing", step="plan")
                    cfd = open_quiet(n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     dir_fd=fd)
                    try:
                        count += walk(cfd, p, depth + 1)
                    finally:
                        os.close(cfd)
            return count

        dfd = open_quiet(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=lp.host_fd(hrel))
        try:
            return walk(dfd, hp, len(hrel) + 1)
        finally:
            os.close(dfd)


def privileges_of(tree: DirFds, u: tuple, ust: os.stat_result) -> tuple[str, ...]:
    if not stat.S_ISREG(ust.st_mode):
        return ()
    ofd = obj_fd(tree.fd(u[:-1]), u[-1])
    try:
        return privileges(proc_path(ofd), ust)
    finally:
        os.close(ofd)


def _untouched(upper: str) -> bool:
    """An upper dir the run never wrote to (an unreadable one counts as written)."""
    try:
        with scandir(upper) as it:
            return next(it, None) is None
    except OSError:
        return False


def make_plan(layers: Sequence[Layer], exclude: Iterable[str], since_ns: int | None) -> Plan:
    try:
        return _UpperWalk(layers, exclude, since_ns).run()
    except OSError as e:
        raise fs_error(e, "plan", e.filename or "?") from e


def plan_changes(layers: Sequence[Layer], exclude: Iterable[str] = ()) -> list[Change]:
    """What `commit` would do, without conflict checks or any change."""
    plan = make_plan(layers, exclude, None)
    plan.close()
    return plan.changes
