"""Memory limit through a cgroup, where the host lets caper make one.

The pids limit needs no cgroup: the tracer sees every fork and counts. Memory
is shared by the whole sandbox, which only a cgroup can bound; cgroup v2 is
used where its memory controller is delegated to us, else v1's memory
hierarchy; where neither can be written, the caller falls back to RLIMIT_AS
per process (and the result cannot tell an out-of-memory death apart).
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from caper import mountinfo

# What one run may use, unless the caller or config.toml ([limits]) says
# otherwise. Memory: half of the machine, at most 8 GiB.
_RAM = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
DEFAULT_MAX_MEMORY = min(8 << 30, _RAM // 2)
DEFAULT_SHM_SIZE = 64 << 20          # the sandbox's /dev/shm (a tmpfs: memory)
# What one run may cost caper: Python keeps every event it reports on, a few
# hundred bytes each beyond its record (~450 MiB at the count's cap); the
# bytes' cap binds first when paths are long.
DEFAULT_MAX_EVENTS = 1_000_000
DEFAULT_MAX_EVENT_BYTES = 256 << 20

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: "str | int") -> int:
    """Bytes from 4096, "512M", "4G" or "1.5GiB" (binary units); ValueError if not."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
        unit = t[-1:] if t[-1:] in _UNITS else ""
        try:
            n = int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
        except ValueError:
            raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M, G or T)") from None
    if n <= 0:
        raise ValueError(f"a size must be positive, not {text!r}")
    return n


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


@dataclass
class MemoryCgroup:
    path: str
    version: int

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def oom_killed(self) -> bool:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
        except OSError:
            pass
        return False

    def remove(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass  # still busy or already gone: the kernel frees it when empty


def _make(parent: str, settings: dict[str, str], version: int) -> MemoryCgroup | None:
    path = os.path.join(parent, f"caper-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
    except OSError:
        return None
    cg = MemoryCgroup(path, version)
    try:
        for name, value in settings.items():
            target = os.path.join(path, name)
            if os.path.exists(target):
                with open(target, "w") as f:
                    f.write(value)
    except OSError:
        cg.remove()
        return None
    return cg


def _settings(limit: int, version: int) -> dict[str, str]:
    if version == 2:
        return {"memory.max": str(limit), "memory.swap.max": "0"}
    return {"memory.limit_in_bytes": str(limit), "memory.memsw.limit_in_bytes": str(limit)}


_last: tuple[str, int] | None = None   # (parent, version) that worked: every run has a limit


def memory_cgroup(limit: int) -> MemoryCgroup | None:
    """A fresh cgroup capping the sandbox at `limit` bytes, or None."""
    global _last
    if _last:
        cg = _make(_last[0], _settings(limit, _last[1]), _last[1])
        if cg:
            return cg
        _last = None
    cg = _find(limit)
    if cg:
        _last = (os.path.dirname(cg.path), cg.version)
    return cg


def _find(limit: int) -> MemoryCgroup | None:
    own = _own_cgroups()
    mounts = mountinfo.read()
    for m in mounts:
        if m.fstype == "cgroup2" and "" in own:
            parent = m.point + own[""]
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    if "memory" not in f.read().split():
                        continue
            except OSError:
                continue
            cg = _make(parent, _settings(limit, 2), 2)
            if cg:
                return cg
    for m in mounts:
        if m.fstype == "cgroup" and "memory" in m.super_options and "memory" in own:
            cg = _make(m.point + own["memory"], _settings(limit, 1), 1)
            if cg:
                return cg
    return None


@dataclass(frozen=True)
class DiskGuard:
    """The sandbox is killed when the filesystem at `path` (where the upper
    layers grow) has fewer than min_free bytes or min_inodes inodes left."""
    path: str
    min_free: int
    min_inodes: int

    @classmethod
    def for_state_dir(cls, path: str) -> "DiskGuard":
        """Keep 10% of the filesystem free, at most 1 GiB, and 5% of its
        inodes, at most 100,000: a runaway command fails, the host stays usable."""
        v = os.statvfs(path)
        size, files = v.f_blocks * v.f_frsize, v.f_files
        return cls(path, min(1 << 30, size // 10), min(100_000, files // 20))
