"""The copy-on-write view a command runs in (overlay backend).

Every real mount a command could write to gets an overlay of its own, as
`try` does: an overlay over a directory does not show the mounts below it.
The overlays are assembled under a staging root inside caper's scratch
directory, in the sandbox's own mount namespace, and the sandbox then moves
into that root. The host tree is the lower layer and is never written;
every write lands in an upper directory under the scratch directory.
Rollback is deleting the scratch directory; commit is caper.commit.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass, field

from caper.commit import Layer
from caper.errors import SetupError

# Filesystems whose contents are kernel state, not files: /proc, /sys and
# /dev are rebuilt by the native core, the rest are never overlaid.
PSEUDO_FS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs",
    "tracefs", "bpf", "mqueue", "hugetlbfs", "fusectl", "configfs", "pstore", "binfmt_misc",
    "autofs", "efivarfs", "rpc_pipefs", "nsfs",
})
KERNEL_TREES = ("/proc", "/sys", "/dev")

CLOCK_REALTIME_COARSE = 5  # linux/time.h; the os module does not name it

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384


@dataclass(frozen=True, slots=True)
class HostMount:
    mount_point: str
    fstype: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class Mount:
    """One mount(2) call for the native core (struct caper_mount)."""
    source: str | None
    target: str
    fstype: str | None
    data: str | None
    flags: int


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 0 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def host_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[HostMount]:
    """The visible mounts, parents first; of several on one point, the top one."""
    seen: dict[str, HostMount] = {}
    with open(mountinfo) as f:
        for line in f:
            left, right = line.rstrip("\n").split(" - ", 1)
            fields, rfields = left.split(" "), right.split(" ")
            point = _unescape(fields[4])
            opts = fields[5].split(",")
            seen.pop(point, None)  # an overmount hides what it covers
            seen[point] = HostMount(point, rfields[0], "ro" in opts)
    return sorted(seen.values(), key=lambda m: (m.mount_point.count("/") if m.mount_point != "/" else 0,
                                                m.mount_point))


def _tick_boundary_ns() -> int:
    """The start of the next tick of the coarse clock that file ctimes use,
    after waiting for it (a few ms at most). Host changes before now carry a
    ctime below it; changes after it, at or above it. So a file the agent
    saved just before the run is not mistaken for an edit during the run,
    and an edit during the run is never missed."""
    now = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
    while (tick := time.clock_gettime_ns(CLOCK_REALTIME_COARSE)) <= now:
        time.sleep(0.0002)
    return tick


def _below(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _escape_option(path: str) -> str:
    # overlay's option parser splits on ',' and lowerdir on ':'
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


@dataclass
class OverlaySnapshot:
    """Scratch directory, layers and the mount plan of one run."""
    scratch: str
    stage: str
    layers: list[Layer]
    mounts: list[Mount]
    since_ns: int
    hidden: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, state_dir: str, *, userxattr: bool) -> "OverlaySnapshot":
        runs = os.path.join(state_dir, "runs")
        os.makedirs(runs, mode=0o700, exist_ok=True)
        scratch = os.path.join(runs, uuid.uuid4().hex[:16])
        os.mkdir(scratch, 0o700)
        try:
            return cls._plan(scratch, state_dir, userxattr)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    @classmethod
    def _plan(cls, scratch: str, state_dir: str, userxattr: bool) -> "OverlaySnapshot":
        stage = os.path.join(scratch, "root")
        os.mkdir(stage)
        since_ns = _tick_boundary_ns()  # host edits from here on are conflicts
        state_real = os.path.realpath(state_dir)
        layers, mounts = [], []
        for i, m in enumerate(host_mounts()):
            if m.fstype in PSEUDO_FS or any(_below(m.mount_point, t) for t in KERNEL_TREES):
                continue
            if _below(m.mount_point, state_real):
                continue
            target = stage + (m.mount_point if m.mount_point != "/" else "")
            if m.read_only:
                # Read-only on the host stays read-only in the sandbox.
                mounts.append(Mount(m.mount_point, target, None, None, MS_BIND))
                mounts.append(Mount(None, target, None, None,
                                    MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV))
                continue
            upper = os.path.join(scratch, f"layer{i}", "upper")
            work = os.path.join(scratch, f"layer{i}", "work")
            os.makedirs(upper)
            os.makedirs(work)
            opts = [f"lowerdir={_escape_option(m.mount_point)}", f"upperdir={_escape_option(upper)}",
                    f"workdir={_escape_option(work)}", "redirect_dir=off", "index=off",
                    "metacopy=off"]
            if userxattr:
                opts.append("userxattr")
            mounts.append(Mount("overlay", target, "overlay", ",".join(opts), 0))
            layers.append(Layer(mount_point=m.mount_point, upper=upper, userxattr=userxattr))
        if not layers or layers[0].mount_point != "/":
            raise SetupError("no writable root mount to snapshot", step="MOUNT_ROOT")
        # caper's own state (other runs' pending changes) is not the command's business.
        hidden = [state_real]
        mounts.append(Mount("tmpfs", stage + state_real, "tmpfs", "size=4k,mode=0",
                            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC))
        return cls(scratch=scratch, stage=stage, layers=layers, mounts=mounts,
                   since_ns=since_ns, hidden=hidden)

    def discard(self) -> None:
        """Rollback: the upper layers go, the host never saw them."""
        shutil.rmtree(self.scratch, ignore_errors=True)
