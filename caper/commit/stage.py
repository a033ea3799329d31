"""Stage and swap: the journal record of a plan, new content built at hidden
names beside its targets (hard-linked from the upper, or copied), and the
atomic renames that apply it."""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from caper.commit.fsops import (
    OVERLAY_PREFIXES, apply_attrs, copy_data, entered, exists, fs_error, lstat, managed_xattrs,
    obj_fd, proc_path, set_meta, set_meta_fd, xattrs_writable,
)
from caper.commit.ctimes import changed_since
from caper.commit.journal import Journal, step
from caper.commit.plan import CREATE, DELETE, REPLACE, REWRITE, LayerPlan, Plan, Unit
from caper.errors import CommitConflict, CommitError
from caper.fs.syscalls import RENAME_EXCHANGE, RENAME_NOREPLACE, open_by_handle, renameat2, syncfs

STAGE_PREFIX = ".caper-"          # hidden names: .caper-<id>-<n>
JOURNAL_DIR = "journal"
JOURNAL_VERSION = 1


# --- the journal ---------------------------------------------------------------------------

def journal_at(state_dir: str, jid: str) -> Journal:
    return Journal(state_dir, JOURNAL_DIR, jid)


def journal_data(jid: str, phase: str, plan: Plan) -> dict:
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
        "moves": [m.to_json() for m in plan.moves],
        "new_dirs": [{"layer": d.layer, "rel": list(d.rel), "ino": d.ino} for d in plan.new_dirs],
    }


def shut_dirs(plan: Plan) -> list[dict]:
    """The user's own directories the commit will open for a moment (see
    entered), with their modes: a kill while one is open leaves it open,
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


class Stager:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.stats = _Stats()
        self.hardlinks: dict[tuple[int, int], tuple[int, tuple, str]] = {}   # upper inode -> staged copy

    def move_dirs(self) -> None:
        """The directories the run renamed, before anything is staged (the
        units name their targets where the run left them): every source to
        its hidden name in the layer's root, deepest first, so that none is
        below another still to move; then, shallowest first, the new
        directories they go into and each at its destination."""
        plan = self.plan
        for m in sorted(plan.moves, key=lambda m: -len(m.src)):
            lp = plan.layers[m.layer]
            pfd = _parent_of(lp, m.src, m.ino)
            step("rename")
            renameat2(pfd, m.src[-1], m.stage, RENAME_NOREPLACE, new_dfd=lp.host.fd(()))
            lp.host.reset()
        places = [(len(m.dst), 1, m) for m in plan.moves] + [(len(d.rel), 0, d) for d in plan.new_dirs]
        for _, is_move, item in sorted(places, key=lambda p: p[:2]):
            lp = plan.layers[item.layer]
            if not is_move:
                step("mkdir")
                os.mkdir(item.rel[-1], 0o700, dir_fd=lp.host.fd(item.rel[:-1]))
                item.ino = lstat(item.rel[-1], dir_fd=lp.host.fd(item.rel[:-1])).st_ino
                self._attrs_from_upper(lp, item.rel, item.rel[:-1], item.rel[-1])
                continue
            pfd = lp.host.fd(item.dst[:-1])
            cur = exists(pfd, item.dst[-1])
            if (cur is None) != (item.displaced is None) or (cur is not None and cur.st_ino != item.displaced):
                hp = lp.host.path(item.dst)
                raise CommitConflict(f"{hp} changed on the host during the commit", [hp])
            if item.displaced is None:
                step("rename")
                renameat2(lp.host.fd(()), item.stage, item.dst[-1], RENAME_NOREPLACE, new_dfd=pfd)
            else:            # the displaced directory takes the hidden name; finish drops it
                step("exchange")
                renameat2(lp.host.fd(()), item.stage, item.dst[-1], RENAME_EXCHANGE, new_dfd=pfd)
            lp.host.reset()

    def stage(self, unit: Unit) -> None:
        lp = self.plan.layers[unit.layer]
        if unit.op == DELETE or unit.op == REWRITE and not unit.data:
            return
        if unit.op == REWRITE:          # the inode's old data, for an undo, in the layer's root
            src = open_by_handle(lp.host.fd(()), *unit.origin, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._copy_fd(src, lp.host.fd(()), unit.stage)
            finally:
                os.close(src)
            unit.staged_ino = lstat(unit.stage, dir_fd=lp.host.fd(())).st_ino
            return
        with entered(lp.host.fd(unit.parent)):
            self._stage(lp, unit)
        unit.staged_ino = lstat(unit.stage, dir_fd=lp.host.fd(unit.parent)).st_ino

    def _stage(self, lp: LayerPlan, unit: Unit) -> None:
        if unit.origin is not None:   # one more name of a host inode
            ofd = open_by_handle(lp.host.fd(()), *unit.origin, os.O_PATH | os.O_CLOEXEC)
            try:
                step("link")
                os.link(proc_path(ofd), unit.stage, dst_dir_fd=lp.host.fd(unit.parent),
                        follow_symlinks=True)
                self.plan.relinked.add(os.fstat(ofd).st_ino)
            finally:
                os.close(ofd)
        elif unit.tree is None:
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

    def _attrs_from_upper(self, lp: LayerPlan, u: tuple, hparent: tuple, name: str) -> None:
        ust = lstat(u[-1], dir_fd=lp.up.fd(u[:-1]))
        uo = obj_fd(lp.up.fd(u[:-1]), u[-1])
        try:
            xattrs = managed_xattrs(proc_path(uo))
        finally:
            os.close(uo)
        apply_attrs(lp.host.fd(hparent), name, lp.up.true_mode(u, ust.st_mode), ust.st_uid,
                     ust.st_gid, xattrs, (ust.st_atime_ns, ust.st_mtime_ns))

    def _entry(self, lp: LayerPlan, u: tuple, hparent: tuple, name: str) -> None:
        """Stage the upper's non-directory `u` as `name` in the host dir `hparent`."""
        ust = lstat(u[-1], dir_fd=lp.up.fd(u[:-1]))
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
        ofd = obj_fd(lp.host.fd(hparent), name)
        try:
            p = proc_path(ofd)
            marks = [n for n in os.listxattr(p) if n.startswith(OVERLAY_PREFIXES)]
            if marks:
                with xattrs_writable(ofd):
                    for n in marks:
                        step("removexattr")
                        os.removexattr(p, n)
        finally:
            os.close(ofd)

    def _copy_fd(self, src: int, dfd: int, name: str) -> None:
        """A new file `name` in dfd (mode 0600) with the data of src, holes kept."""
        step("create")
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                      dir_fd=dfd)
        try:
            step("write")
            self.stats.bytes += copy_data(src, dst, os.fstat(src).st_size)
        finally:
            os.close(dst)

    def _copy(self, lp, u, ust, hparent, name) -> None:
        ufd = lp.up.fd(u[:-1])
        uo = obj_fd(ufd, u[-1])
        try:
            xattrs = managed_xattrs(proc_path(uo))
        finally:
            os.close(uo)
        times = (ust.st_atime_ns, ust.st_mtime_ns)
        if stat.S_ISREG(ust.st_mode):
            src = os.open(u[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=ufd)
            try:
                self._copy_fd(src, lp.host.fd(hparent), name)
            finally:
                os.close(src)
        elif stat.S_ISLNK(ust.st_mode):
            target = os.readlink(u[-1], dir_fd=ufd)
            step("symlink")
            os.symlink(target, name, dir_fd=lp.host.fd(hparent))
        else:                                           # fifo, socket
            step("mknod")
            os.mknod(name, stat.S_IFMT(ust.st_mode) | 0o600, dir_fd=lp.host.fd(hparent))
        apply_attrs(lp.host.fd(hparent), name, ust.st_mode, ust.st_uid, ust.st_gid, xattrs, times)


def check_room(plan: Plan) -> None:
    """A layer whose upper dir is on another filesystem than its host tree is
    committed by copying: refuse before staging anything what will not fit
    (the blocks the run's files hold, which a sparse copy also needs)."""
    need: dict[int, list] = {}          # host dev -> [bytes, entries, a layer on it]
    for unit in plan.units:
        lp = plan.layers[unit.layer]
        if unit.upper is None or lp.up.dev == lp.dev:
            continue
        if unit.tree is None:
            sts = [lstat(unit.upper[-1], dir_fd=lp.up.fd(unit.upper[:-1]))]
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


def rewrite_inode(mount_fd: int, origin: tuple, ino: int, data_from: tuple | None, meta: dict,
                  times: list, where: str) -> None:
    """Write into the host inode of a REWRITE unit (its file handle `origin`,
    its inode number `ino`): the data of the file `data_from` (dir fd, name;
    None: keep its data), then attributes and times."""
    fd = open_by_handle(mount_fd, *origin, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino != ino:
            raise CommitError(f"{where}: the file handle names another inode; refusing", step="rewrite")
        if data_from is not None:
            src = os.open(data_from[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=data_from[0])
            try:
                step("write")
                os.ftruncate(fd, 0)
                copy_data(src, fd, os.fstat(src).st_size)
            finally:
                os.close(src)
        set_meta_fd(fd, meta)
        step("utime")
        os.utime(proc_path(fd), ns=tuple(times))
    finally:
        os.close(fd)


def swap(plan: Plan) -> None:
    """Step 4: each unit is one atomic rename (a rewrite: the inode's new
    data and attributes written into it); then merged dirs' attributes."""
    for lp in plan.layers:
        lp.host.reset()
    for unit in plan.units:
        lp = plan.layers[unit.layer]
        if unit.op == REWRITE:
            cur = exists(lp.host.fd(unit.parent), unit.name)
            if cur is not None and _edited(plan, cur):
                hp = lp.host.path(unit.parent + (unit.name,))
                raise CommitConflict(f"{hp} changed on the host during the commit", [hp])
            tree = lp.index_dir if unit.from_index else lp.up
            upper = (tree.fd(unit.upper[:-1]), unit.upper[-1]) if unit.data else None
            rewrite_inode(lp.host.fd(()), unit.origin, unit.host_ino, upper, unit.meta["new"],
                          unit.meta["new_times"], lp.host.path(unit.parent + (unit.name,)))
            plan.relinked.add(unit.host_ino)      # its other names' ctime: caper's own
            continue
        pfd = lp.host.fd(unit.parent)
        cur = exists(pfd, unit.name)
        hp = lp.host.path(unit.parent + (unit.name,))
        if unit.op == CREATE:
            if cur is not None:
                raise CommitConflict(f"{hp} appeared on the host during the commit", [hp])
        elif cur is None or cur.st_ino != unit.host_ino or _edited(plan, cur):
            # the same inode edited in place since the plan looked (`>>`, an
            # editor's save) is a change too (adv14a 01)
            raise CommitConflict(f"{hp} changed on the host during the commit", [hp])
        try:
            with entered(pfd):
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
            raise fs_error(e, "renameat2", hp) from e
        if unit.host_ino is not None:
            plan.relinked.add(unit.host_ino)      # renamed by caper: its other names' ctime moved
    for m in plan.metas:
        lp = plan.layers[m.layer]
        set_meta(_parent_of(lp, m.rel, m.ino), m.rel[-1], m.new)


def _edited(plan: Plan, st: os.stat_result) -> bool:
    """The host changed this inode after the run began (its ctime says so)."""
    return plan.since_ns is not None and not stat.S_ISDIR(st.st_mode) and \
        st.st_ino not in plan.relinked and changed_since(st.st_ctime_ns, plan.since_ns)


def _parent_of(lp: LayerPlan, rel: tuple, ino: int) -> int:
    """The fd of rel's directory, once rel is still the inode the plan saw there."""
    pfd = lp.host.fd(rel[:-1])
    cur = exists(pfd, rel[-1])
    if cur is None or cur.st_ino != ino:
        hp = lp.host.path(rel)
        raise CommitConflict(f"{hp} changed on the host during the commit", [hp])
    return pfd


def sync_layers(plan_layers) -> None:
    seen = set()
    for lp in plan_layers:
        if lp.dev not in seen:
            seen.add(lp.dev)
            syncfs(lp.host.fd(()))
