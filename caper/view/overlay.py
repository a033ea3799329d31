"""The copy-on-write view a command runs in (overlay backend).

Every real mount a command could write to gets an overlay of its own, as
`try` does: an overlay over a directory does not show the mounts below it.
The overlays are assembled under a staging root inside caper's scratch
directory, in the sandbox's own mount namespace, and the sandbox then moves
into that root. The host tree is the lower layer and is never written;
every write lands in an upper directory under the scratch directory.
Rollback is deleting the scratch directory; commit is caper.commit.engine.
"""
from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Sequence

from caper.commit import ctimes
from caper.fs import mountinfo
from caper.changes import Layer
from caper.commit.fsops import rmtree_at
from caper.errors import CaperError, ConfigError, SetupError
from caper.sandbox._native import lib
from caper.sandbox.limits import DiskGuard
from caper.sandbox.trace import TRACER_THREAD, Mount

# Filesystems whose contents are kernel state, not files: /proc, /sys and
# /dev are rebuilt by the native core, the rest are never overlaid.
PSEUDO_FS = mountinfo.PSEUDO_FS
KERNEL_TREES = ("/proc", "/sys", "/dev")
DISCARD_THREAD = "caper-discard"
# overlayfs refuses these as upper layers (no whiteouts, no trusted xattrs, or overlay itself).
UNUSABLE_UPPER_FS = frozenset({"overlay", "nfs", "nfs4", "fuse", "squashfs", "iso9660", "vfat",
                               "exfat", "ntfs", "ntfs3", "9p", "virtiofs", "cifs", "smb3"})

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
# Every mount of the sandbox but caper's own /dev: a device node or setuid
# file on a host filesystem (a chroot or container tree, anything mknod'd)
# opens no real device and grants nothing. The command keeps CAP_DAC_OVERRIDE,
# so only nodev stands between it and such a node. (In a user namespace the
# kernel adds nodev itself; the flags say so for root too.)
SAFE = MS_NOSUID | MS_NODEV


# Filesystems a commit cannot write to atomically (renameat2's RENAME_EXCHANGE
# and RENAME_NOREPLACE are refused, EINVAL): held read-only in the sandbox.
NO_ATOMIC_RENAME_FS = frozenset({"fuse", "fuseblk", "nfs", "nfs4", "cifs", "smb3", "9p"})


def _no_atomic_rename(fstype: str) -> bool:
    return fstype in NO_ATOMIC_RENAME_FS or fstype.startswith("fuse.")


@dataclass(frozen=True, slots=True)
class HostMount:
    mount_point: str
    fstype: str
    read_only: bool
    dev: str = ""
    root: str = "/"


def host_mounts(entries: list[mountinfo.MountEntry]) -> list[HostMount]:
    """The visible mounts, parents first; of several on one point, the top one."""
    seen: dict[str, HostMount] = {}
    for m in entries:
        seen.pop(m.point, None)  # an overmount hides what it covers
        seen[m.point] = HostMount(m.point, m.fstype, m.read_only, m.dev, m.root)
    return sorted(seen.values(), key=lambda m: (m.mount_point.count("/") if m.mount_point != "/" else 0,
                                                m.mount_point))


def subvolume_root(path: str, entries: list[mountinfo.MountEntry]) -> str | None:
    """The root of the btrfs subvolume holding path, when that root is not a
    mount point; None when path is on its mount's own subvolume. btrfs gives
    each subvolume its own st_dev and one commit cannot cross between two
    (a rename fails with EXDEV), so such a root is given a layer of its own."""
    real = os.path.realpath(path)
    mount = mountinfo.containing(real, entries)
    if mount.fstype != "btrfs":
        return None
    dev = os.stat(real).st_dev
    if os.stat(mount.point).st_dev == dev:
        return None
    top = real
    while top != mount.point and os.stat(os.path.dirname(top)).st_dev == dev:
        top = os.path.dirname(top)
    return top


def _foreign_between(top: str, path: str) -> bool:
    """A directory in (top, path] whose owner or group is not this process's."""
    uid, gid = os.geteuid(), os.getegid()
    d = path
    while len(d) > len(top):
        st = os.stat(d)
        if st.st_uid != uid or st.st_gid != gid:
            return True
        d = os.path.dirname(d)
    return False


@functools.cache
def _can_remount_tree() -> bool:
    return bool(lib.caper_can_remount_tree())


def _escape_option(path: str) -> str:
    # overlay's option parser splits on ',' and lowerdir on ':'
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


class _MountPlanner:
    """Turns host paths into mounts under the staging root."""

    def __init__(self, scratch: str, stage: str, userxattr: bool, host_points: set[str]):
        self.scratch, self.stage, self.userxattr = scratch, stage, userxattr
        self.host_points = host_points       # every mount point, pseudo filesystems too
        self.layers: list[Layer] = []
        self.mounts: list[Mount] = []
        # (mount point, kind) of every mount the sandbox holds read-only
        # ("read-only": so on the host too; "held": writable on the host) or
        # hides ("hidden": an empty stand-in), and of every layer ("layer":
        # the kernel may refuse its overlay, which is then a read-only bind):
        # the report flags a write that failed there and would not have
        # natively (caper.report.build.WRITES_HELD).
        self.held: list[tuple[str, str]] = []
        self.layer_mounts: list[tuple[str, HostMount]] = []   # layers over a whole mount
        self.aliases: list[tuple[str, str]] = []   # (mount point, the layer path bound there)

    def _target(self, path: str) -> str:
        return self.stage + (path if path != "/" else "")

    def cover(self, path: str, read_only: bool, host: "HostMount | None" = None) -> None:
        """An overlay of path (or a read-only bind of a read-only mount, or of
        a path this user cannot write natively either)."""
        target = self._target(path)
        if read_only:
            self.held.append((path, "held" if os.access(path, os.W_OK) else "read-only"))
            self.mounts += self._read_only_bind(path, target)
            return
        n = len(self.layers)
        upper = os.path.join(self.scratch, f"layer{n}", "upper")
        work = os.path.join(self.scratch, f"layer{n}", "work")
        os.makedirs(upper)
        os.makedirs(work)
        self._match_root(path, upper)
        opts = [f"lowerdir={_escape_option(path)}", f"upperdir={_escape_option(upper)}",
                f"workdir={_escape_option(work)}"]
        # redirect_dir=on: a directory that was there before the run renames
        # (the commit engine renames it on the host); index=on: a file's hard
        # links stay one inode when it is written through one name (the
        # commit writes into the host's inode). metacopy=off: every copy-up
        # holds its data; nfs_export stays off (it would need index=on for
        # every lower and forbids metacopy=on; caper exports nothing).
        # userxattr (rootless) refuses redirect_dir=on ("conflicting options")
        # and silently drops index=on (decoding file handles needs
        # CAP_DAC_READ_SEARCH in the initial user namespace): plain uppers.
        opts += ["userxattr"] if self.userxattr else ["redirect_dir=on", "index=on",
                                                        "metacopy=off"]
        # An overlay the kernel refuses (a lower it cannot stack on: some FUSE,
        # NFS or nested overlay mounts) must not fail every run: the mount is
        # then bound read-only, as the report says where a write failed there.
        fallback = self._read_only_bind(path, target)
        self.mounts.append(Mount("overlay", target, "overlay", ",".join(opts), SAFE, len(fallback)))
        self.mounts += fallback
        self.layers.append(Layer(mount_point=path, upper=upper, userxattr=self.userxattr, work=work))
        if host is not None:
            self.layer_mounts.append((path, host))
        self.held.append((path, "layer"))

    def _read_only_bind(self, path: str, target: str) -> list[Mount]:
        """Read-only on the host stays read-only in the sandbox, the whole
        tree: MS_REC makes the core set the flags on every mount below
        (mount_setattr, Linux 5.12+), or they would stay writable and reach
        the host; a mount made on the host after this plan too. An older
        kernel gets the plain remount where no mount lies below, and fails
        the set-up where one does. A writable mount below that gets its own
        layer is mounted on top later. A path gone since the plan (a busy
        host's /tmp) leaves its stand-in: the target bound on itself, so the
        remount still has a mount to make read-only."""
        tree = self.mounts_below(path) or _can_remount_tree()
        return [Mount(path, target, None, None, MS_BIND | MS_REC, 1),
                Mount(target, target, None, None, MS_BIND),
                Mount(None, target, None, None, MS_BIND | MS_REMOUNT | MS_RDONLY
                      | SAFE | (MS_REC if tree else 0))]

    def hold(self, path: str) -> None:
        """A writable mount the sandbox holds read-only (the commit could not
        change it atomically)."""
        self.held.append((path, "held"))
        self.mounts += self._read_only_bind(path, self._target(path))

    def alias(self, m: "HostMount", points: list[str]) -> bool:
        """A second view of a filesystem a layer already shows (a bind mount of
        one of its directories, one filesystem at two places): bound to that
        layer's view, so that a write through either is seen through both, as
        on the host, and commits once. False where no layer shows it."""
        for layer, lm in self.layer_mounts:
            if lm.dev != m.dev or not mountinfo.below(m.root, lm.root):
                continue
            rel = m.root[len(lm.root):].strip("/")
            source = os.path.join(layer, rel) if rel else layer
            # Not where another mount covers that directory on the host: the
            # layer shows that mount there, not this filesystem.
            if any(p != layer and mountinfo.below(source, p) and mountinfo.below(p, layer)
                   for p in points) or not os.path.isdir(source):
                continue
            target = self._target(m.mount_point)
            # The layer's own flags come along with the bind; the remount says so
            # rather than trusting it.
            self.mounts += [Mount(self._target(source), target, None, None, MS_BIND),
                            Mount(None, target, None, None, MS_BIND | MS_REMOUNT | SAFE)]
            self.held.append((m.mount_point, "layer"))
            self.aliases.append((m.mount_point, source))
            return True
        return False

    def stand_in(self, path: str) -> None:
        """An empty read-only directory over a mount the sandbox hides (a
        pseudo filesystem of a chroot or container tree, and all below it)."""
        self.held.append((path, "hidden"))
        self.mounts.append(Mount("tmpfs", self._target(path), "tmpfs", "size=4k,mode=0755",
                                 MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC))

    def _match_root(self, lower: str, upper: str) -> None:
        """An overlay's root shows its upper dir's mode and owner, not the
        lower's: give the upper the host directory's. An unprivileged user
        cannot give it away, so it loses the write bits the user lacks."""
        st = os.stat(lower)
        mode = st.st_mode & 0o7777
        if os.geteuid() == 0:
            os.chown(upper, st.st_uid, st.st_gid)
        elif not os.access(lower, os.W_OK):
            mode &= ~0o222
        os.chmod(upper, mode)

    def split_root(self, host: list[HostMount]) -> None:
        """Rootless: in a user namespace the kernel will not take "/" (with
        mounts locked below it) as a lower layer, so each directory is
        overlaid at the highest level with no mount below it. The staging
        root itself is a read-only bind: "/" is not writable by its user."""
        self.mounts.append(Mount(self.stage, self.stage, None, None, MS_BIND))
        points = {m.mount_point: m for m in host}
        self._split("/", points)
        self.mounts.append(Mount(None, self.stage, None, None,
                                 MS_BIND | MS_REMOUNT | MS_RDONLY | SAFE))

    def mounts_below(self, path: str) -> bool:
        """A mount lies strictly below path (a pseudo filesystem's too): an
        overlay of path would hide it, and the kernel refuses such a lower
        layer in a user namespace."""
        return any(p != path and mountinfo.below(p, path) for p in self.host_points)

    def layer_above(self, path: str) -> str:
        """The mount point of the deepest layer holding path ("" if none)."""
        return max((l.mount_point for l in self.layers if mountinfo.below(path, l.mount_point)),
                   key=len, default="")

    def own_layer(self, path: str | None, entries: list[mountinfo.MountEntry],
                  state_real: str) -> None:
        """An overlay of path, a directory no mount is on, over its parent's:
        not where a mount lies below it (it would hide it, and the kernel
        refuses such a lower layer), nor where no layer holds it or its mount
        is read-only (the command cannot write there natively), nor in
        caper's own state."""
        if path and self.layer_above(path) not in ("", path) \
                and path not in self.host_points and not self.mounts_below(path) \
                and not mountinfo.containing(path, entries).read_only \
                and not mountinfo.below(path, state_real):
            self.cover(path, False)

    def _cover_below(self, path: str, points: dict[str, HostMount]) -> None:
        """Below a tree bound read-only whole: a writable mount with none below
        it gets its overlay on top, so that the command writes there as it
        could natively. The rest stay read-only (one this user cannot reach,
        one with mounts below it, which only a readable directory could split)."""
        for p, m in points.items():
            if p == path or not mountinfo.below(p, path) or m.read_only:
                continue
            try:
                os.stat(p)
                reachable = True
            except PermissionError:
                reachable = False
            if reachable and not self.mounts_below(p):
                self._cover_mount(p, m)
            else:
                self.held.append((p, "hidden"))      # writable on the host, not here

    def _cover_mount(self, path: str, m: HostMount | None) -> None:
        """A directory with no mount below it; m: the mount on it, if any."""
        if m is not None and not m.read_only and _no_atomic_rename(m.fstype):
            self.hold(path)
        else:
            self.cover(path, m is not None and m.read_only)

    def _split(self, directory: str, points: dict[str, HostMount]) -> None:
        # Files beside a mount point (rare below "/") can only be bound read-only.
        # Any mount counts here, a pseudo filesystem's too: the kernel refuses
        # a lower layer with a (locked) mount anywhere below it.
        if directory != "/" and os.access(directory, os.W_OK):
            self.held.append((directory, "held"))   # new entries here: writable natively
        for entry in os.scandir(directory):
            path = entry.path
            target = self._target(path)
            if path in KERNEL_TREES:
                os.mkdir(target)  # the core mounts /proc, /dev, /sys here
                continue
            if entry.is_symlink():
                os.symlink(os.readlink(path), target)
                continue
            if path in self.host_points and path not in points:
                # a pseudo filesystem (nsfs, mqueue, autofs ...): not the
                # command's business; an empty stand-in, read-only with the stage
                self.held.append((path, "hidden"))
                if entry.is_dir(follow_symlinks=False):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                continue
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(target)
                if not os.access(path, os.R_OK | os.X_OK):
                    self.cover(path, True)  # closed to this user natively too
                    self._cover_below(path, points)
                    continue
                if self.mounts_below(path):
                    if path in points and points[path].read_only:
                        self.cover(path, True)
                        self._cover_below(path, points)
                    else:
                        self._split(path, points)
                else:
                    self._cover_mount(path, points.get(path))
            elif entry.is_file(follow_symlinks=False):
                open(target, "w").close()
                self.cover(path, True)  # top-level files: read-only, like "/" itself


@dataclass
class OverlaySnapshot:
    """Scratch directory, layers and the mount plan of one run."""
    scratch: str
    stage: str
    layers: list[Layer]
    mounts: list[Mount]
    since_ns: int           # the conflict threshold (caper.commit.ctimes)
    not_before_ns: int      # 0, or when the command may start (caper.commit.ctimes)
    hidden: list[str] = field(default_factory=list)
    held: list[tuple[str, str]] = field(default_factory=list)   # see _MountPlanner.held
    aliases: list[tuple[str, str]] = field(default_factory=list)  # see _MountPlanner.alias
    lock_fd: int = -1       # flocked while this process owns the run (see collect_dead_runs)

    @classmethod
    def create(cls, state_dir: str, *, userxattr: bool,
               binds: Sequence[tuple[str, str]] = (),
               work_dirs: Sequence[str] = (), other_state: Sequence[str] = (),
               entries: list[mountinfo.MountEntry] | None = None) -> "OverlaySnapshot":
        """binds: (host path, sandbox path) pairs mounted over the overlays,
        e.g. a btrfs snapshot of the workspace at the workspace's path.
        work_dirs: where the command is expected to write (its workspace,
        $HOME), which may need layers of their own (see _plan). other_state:
        caper's other state directories, hidden like state_dir. entries:
        the mount table, if the caller has read it."""
        entries = mountinfo.read() if entries is None else entries
        cls.check_state_dir(state_dir, entries)
        runs = os.path.join(state_dir, "runs")
        os.makedirs(runs, mode=0o700, exist_ok=True)
        scratch = os.path.join(runs, uuid.uuid4().hex[:16])
        # The lock first: a scratch dir whose lock nobody holds is a dead run's.
        lock_fd = os.open(scratch + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            os.mkdir(scratch, 0o700)
            snap = cls._plan(scratch, state_dir, userxattr, binds, entries, work_dirs,
                             other_state)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            _unlink(scratch + ".lock")
            os.close(lock_fd)
            raise
        snap.lock_fd = lock_fd
        return snap

    @staticmethod
    def check_state_dir(state_dir: str, entries: list[mountinfo.MountEntry]) -> None:
        """Upper layers live in the state directory: refuse a filesystem that
        cannot hold them before anything runs, with a way out."""
        fstype = mountinfo.containing(state_dir, entries).fstype
        if fstype in UNUSABLE_UPPER_FS:
            raise ConfigError(f"caper's state directory {os.path.realpath(state_dir)} is on "
                              f"{fstype}, which cannot hold an overlay upper layer; set "
                              "CAPER_STATE_DIR to a directory on another filesystem "
                              "(ext4, xfs, btrfs, tmpfs)")

    @classmethod
    def _plan(cls, scratch: str, state_dir: str, userxattr: bool,
              binds: Sequence[tuple[str, str]],
              entries: list[mountinfo.MountEntry], work_dirs: Sequence[str],
              other_state: Sequence[str] = ()) -> "OverlaySnapshot":
        stage = os.path.join(scratch, "root")
        os.mkdir(stage)
        state_real = os.path.realpath(state_dir)
        hidden = _state_paths([state_real, *other_state], entries)
        plan = _MountPlanner(scratch, stage, userxattr, {e.point for e in entries})
        covered = [m for m in host_mounts(entries)
                   if m.fstype not in PSEUDO_FS
                   and not any(mountinfo.below(m.mount_point, h) for h in hidden)
                   and not any(mountinfo.below(m.mount_point, t) for t in KERNEL_TREES)]
        threshold = ctimes.take(state_dir, (m.fstype for m in covered if not m.read_only), entries,
                                own_dirs=[*(os.path.dirname(source) for source, _ in binds),
                                          *work_dirs])
        if userxattr:
            plan.split_root(covered)
        else:
            # A pseudo filesystem outside /proc, /sys and /dev (a chroot's or a
            # container's proc, sysfs, devpts) is not rebuilt: the sandbox sees
            # an empty read-only stand-in, and nothing of what is mounted below
            # it (a cgroup tmpfs below a chroot's sys).
            pseudo = [m.mount_point for m in host_mounts(entries) if m.fstype in PSEUDO_FS
                      and not mountinfo.below(m.mount_point, state_real)
                      and not any(mountinfo.below(m.mount_point, t) for t in KERNEL_TREES)]
            stand_ins = [p for p in pseudo
                         if not any(q != p and mountinfo.below(p, q) for q in pseudo)]
            points = [m.mount_point for m in host_mounts(entries)]
            for m in covered:
                if any(mountinfo.below(m.mount_point, p) for p in stand_ins):
                    continue
                if _no_atomic_rename(m.fstype) and not m.read_only:
                    plan.hold(m.mount_point)
                elif not m.read_only and plan.alias(m, points):
                    pass
                else:
                    plan.cover(m.mount_point, m.read_only, m)
            if plan.layers[:1] and plan.layers[0].mount_point != "/":
                plan.layers.clear()
            for p in stand_ins:
                if os.path.isdir(p):      # a file (an nsfs bind) shows the lower's empty file
                    plan.stand_in(p)
        if not plan.layers:
            raise SetupError("no writable mount to snapshot", step="MOUNT_ROOT")
        # Layers of their own for the work dirs, each over its parent's overlay,
        # parents first: at the root of a btrfs subvolume that holds one (one
        # commit cannot cross subvolumes), and, unprivileged, at a work dir
        # itself when a directory above it in its layer belongs to someone else
        # (copying such a directory up fails in a user namespace: EOVERFLOW,
        # its owner has no id there).
        dirs = {os.path.realpath(d) for d in work_dirs if os.path.isdir(d)}
        roots = {r for r in (subvolume_root(d, entries) for d in dirs) if r}
        for path in sorted(dirs | roots, key=lambda p: (p.count("/"), p)):
            if path in roots:
                plan.own_layer(path, entries, state_real)
            above = plan.layer_above(path)
            if path in dirs and userxattr and above and _foreign_between(above, path):
                plan.own_layer(path, entries, state_real)
        for source, path in binds:
            plan.mounts.append(Mount(source, stage + path, None, None, MS_BIND))
            plan.mounts.append(Mount(None, stage + path, None, None, MS_BIND | MS_REMOUNT | SAFE
                                     | (MS_REC if _can_remount_tree() else 0)))
        # caper's own state (other runs' pending changes) is not the command's
        # business, under any of its paths.
        for path in hidden:
            if os.path.isdir(path):
                plan.mounts.append(Mount("tmpfs", stage + path, "tmpfs", "size=4k,mode=0",
                                         MS_RDONLY | SAFE | MS_NOEXEC))
        return cls(scratch=scratch, stage=stage, layers=plan.layers, mounts=plan.mounts,
                   since_ns=threshold.since_ns, not_before_ns=threshold.not_before_ns,
                   hidden=hidden, held=plan.held, aliases=plan.aliases)

    def discard(self) -> None:
        """Rollback: the upper layers go, the host never saw them."""
        try:
            remove_tree(self.scratch)
            _unlink(self.scratch + ".lock")
        finally:
            self._release()

    def discard_later(self) -> None:
        """discard() after the answer (see later()): deleting what a run
        wrote, and what its commit replaced (caper.commit.recover.Trash), takes
        ~100 us a file where the files are on disk. The scratch stays locked
        until it is gone, so collect_dead_runs spares it."""
        later(self.discard)

    def keep(self) -> None:
        """Leave the scratch dir for later (a held run, a conflicting run's
        changes): marked, so that collect_dead_runs spares it."""
        with open(self.scratch + ".kept", "w"):
            pass
        _unlink(self.scratch + ".lock")
        self._release()

    def _release(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def _state_paths(dirs: Sequence[str], entries: list[mountinfo.MountEntry]) -> list[str]:
    """Every path of caper's state directories: each one's real path and its
    aliases through other mounts (mountinfo.aliases), outside the kernel
    trees. A directory that does not exist yet is listed too, so that no
    commit creates it with what a run planted."""
    out: list[str] = []
    for d in dirs:
        real = os.path.realpath(d)
        found = [real] + (mountinfo.aliases(real, entries) if os.path.isdir(real) else [])
        out += [p for p in found if p not in out
                and not any(mountinfo.below(p, t) for t in KERNEL_TREES)]
    # One inside another is hidden with it (and a tmpfs could not be mounted there).
    return [p for p in out if not any(q != p and mountinfo.below(p, q) for q in out)]


def later(clean_up: Callable[[], None]) -> None:
    """Run clean_up on a thread of its own, so that the caller can answer
    first. The thread is not a daemon, so an exiting process waits for it;
    settle() waits for every such thread."""
    threading.Thread(target=clean_up, name=DISCARD_THREAD).start()


def settle() -> None:
    """Wait until every clean-up handed to later() is done, and every
    sandbox's init, still exiting when its run answered, is reaped."""
    for t in threading.enumerate():
        if t.name in (DISCARD_THREAD, TRACER_THREAD):
            t.join()


def collect_dead_runs(state_dir: str) -> list[str]:
    """Scratch dirs of runs whose process died (kill -9 during the run, the
    report or the approver): nobody holds their lock and nobody kept them.
    Their upper layers never reached the host; they only take space."""
    runs = os.path.join(state_dir, "runs")
    try:
        names = os.listdir(runs)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        path = os.path.join(runs, n)
        if "." in n or os.path.exists(path + ".kept"):
            continue
        try:
            fd = os.open(path + ".lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1                      # no lock at all: created before locks, or torn down
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue             # a live run
            remove_tree(path)
            _unlink(path + ".lock")
            out.append(path)
        finally:
            if fd >= 0:
                os.close(fd)
    return out


def expire_kept(state_dir: str, max_age_s: float) -> list[str]:
    """Scratch dirs kept for the user (a conflicting run's version; a held
    run's, which caper.held expires sooner) whose mark is older than
    max_age_s: nobody took them."""
    runs = os.path.join(state_dir, "runs")
    try:
        marks = [n for n in os.listdir(runs) if n.endswith(".kept")]
    except FileNotFoundError:
        return []
    out = []
    now = time.time()
    for m in marks:
        mark = os.path.join(runs, m)
        try:
            if now - os.stat(mark).st_mtime <= max_age_s:
                continue
        except FileNotFoundError:
            continue
        path = mark.removesuffix(".kept")
        remove_tree(path)
        _unlink(mark)
        out.append(path)
    return out


@dataclass(frozen=True, slots=True)
class TreeUsage:
    bytes: int          # allocated blocks
    inodes: int         # entries (an empty file or a directory takes no block, but an inode)


def tree_usage(path: str) -> TreeUsage | None:
    """What a tree takes on disk (not following links), or None if it holds
    a directory caper cannot read: one the run closed (chmod 000) after
    writing into it, rootless, where caper has no power to look past
    permissions. Overlay work dirs (the kernel's, mode 000 rootless, never
    visible to the run) are not asked."""
    total = count = 0
    stack = [path]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    count += 1
                    if e.is_dir(follow_symlinks=False) and not (   # <scratch>/layerN/work
                            e.name == "work" and os.path.dirname(d) == path and
                            re.fullmatch(r"layer\d+", os.path.basename(d))):
                        stack.append(e.path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError:
            return None
    return TreeUsage(total, count)


def over_keep_quota(state_dir: str, scratch: str, quota_mb: float,
                    quota_inodes_pct: float) -> str | None:
    """Why scratch may not be kept for later (held, or a conflict's version):
    with the runs already kept it would pass the quota, in bytes or in
    inodes (a share of the state filesystem's, where it has a fixed number);
    or the state filesystem is short of either already, so that later runs
    would hit their disk floor (caper.sandbox.limits.DiskGuard). None if it
    fits."""
    runs = os.path.join(state_dir, "runs")
    try:
        kept = [os.path.join(runs, n.removesuffix(".kept")) for n in os.listdir(runs)
                if n.endswith(".kept")]
    except FileNotFoundError:
        kept = []
    usages = [tree_usage(k) for k in kept if k != scratch]
    usage = tree_usage(scratch)
    if usage is None:
        return ("it holds a directory it closed (no read or search permission for caper), so "
                "caper cannot measure what it takes against the quota for kept runs")
    if None in usages:
        return ("a kept run holds a directory caper cannot measure, so the quota for kept "
                "runs cannot be checked (`caper discard ID` frees a held run)")
    free = "`caper discard ID` frees a held run"
    used = sum(u.bytes for u in usages)
    if used + usage.bytes > quota_mb * (1 << 20):
        return (f"it takes {usage.bytes / (1 << 20):.1f} MiB, and the {len(kept)} held and kept "
                f"runs already take {used / (1 << 20):.1f} MiB of caper's quota of "
                f"{quota_mb:g} MiB for them (keep_quota_mb in config.toml; {free})")
    v = os.statvfs(state_dir)
    limit = round(v.f_files * quota_inodes_pct / 100)
    used_inodes = sum(u.inodes for u in usages)
    if v.f_files and used_inodes + usage.inodes > limit:
        return (f"it holds {usage.inodes} files and directories, and the {len(kept)} held and "
                f"kept runs already hold {used_inodes}, of caper's quota of {limit} for them "
                f"({quota_inodes_pct:g}% of the state filesystem's {v.f_files} inodes: "
                f"keep_quota_inodes_pct in config.toml; {free})")
    guard = DiskGuard.for_state_dir(state_dir)
    if v.f_favail < 2 * guard.min_inodes or v.f_bavail * v.f_frsize < 2 * guard.min_free:
        return (f"the state filesystem has {v.f_favail} inodes and "
                f"{v.f_bavail * v.f_frsize / (1 << 20):.0f} MiB left, less than twice the "
                f"floor every run keeps ({guard.min_inodes} inodes, "
                f"{guard.min_free / (1 << 20):.0f} MiB): keeping it would starve later runs "
                f"({free})")
    return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_tree(path: str) -> None:
    """Delete caper's own scratch at path, best effort: also directories
    without search permission, which an unprivileged user meets in overlay
    work dirs (work/work is mode 000) and wherever the command chmodded a
    directory shut, and trees of any depth (commit.rmtree_at)."""
    parent, name = os.path.split(os.path.normpath(path))
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        rmtree_at(pfd, name, os.fstat(pfd).st_dev, parent, force=True)
    except (OSError, CaperError):
        pass   # what is left only takes space; the next collection tries again
    finally:
        os.close(pfd)
