"""Memory and pids limits through cgroups, where the host lets caper make them.

The tracer counts the sandbox's processes itself (threads too), on any host.
A cgroup's pids.max backs that count where one can be made: a fork bomb
that outruns the tracer's count is refused by the kernel, at a few more
than the tracer's limit so that the tracer's exact count normally ends the
run first. Memory is shared by the whole sandbox, which only a cgroup can
bound; where none can be made, the caller falls back to RLIMIT_AS per
process (and the result cannot tell an out-of-memory death apart).

cgroup v2 is used where the controllers are delegated to us (rootless: only
there), else v1's hierarchies, one cgroup in each. A cgroup is removed once
the sandbox's init is reaped: the kernel never removes an empty one.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from caper.fs import mountinfo

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

PIDS_MARGIN = 2   # the sandbox's init, and the one process past the tracer's limit it sees


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _count(path: str, key: str) -> int:
    """key's number in a flat keyed cgroup file ("oom_kill 1"); 0 if absent."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class Cgroups:
    """The sandbox's cgroups: one (v2), or one per v1 hierarchy."""
    paths: list[str] = field(default_factory=list)
    memory: str | None = None   # the memory events file, when memory is limited here
    pids: str | None = None     # the pids events file, when pids are limited here

    @property
    def procs(self) -> list[str]:
        return [os.path.join(p, "cgroup.procs") for p in self.paths]

    def oom_killed(self) -> bool:
        return self.memory is not None and _count(self.memory, "oom_kill") > 0

    def forks_refused(self) -> bool:
        return self.pids is not None and _count(self.pids, "max") > 0

    def remove(self) -> None:
        for path in self.paths:
            try:
                os.rmdir(path)
            except OSError:
                pass  # a process of the sandbox still there: nothing else to do about it


def _make(parent: str, settings: dict[str, str]) -> str | None:
    path = os.path.join(parent, f"caper-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
    except OSError:
        return None
    try:
        for name, value in settings.items():
            target = os.path.join(path, name)
            if os.path.exists(target):
                with open(target, "w") as f:
                    f.write(value)
    except OSError:
        os.rmdir(path)
        return None
    return path


def sandbox_cgroups(max_memory: int | None, max_pids: int | None) -> Cgroups:
    """Fresh cgroups capping the sandbox at max_memory bytes and max_pids
    processes (each None: no cap), as far as the host lets caper make them."""
    want = {}
    if max_memory:
        want["memory"] = {"memory.max": str(max_memory), "memory.swap.max": "0"}
    if max_pids:
        want["pids"] = {"pids.max": str(max_pids + PIDS_MARGIN)}
    out = Cgroups()
    if not want:
        return out
    own = _own_cgroups()
    mounts = mountinfo.read()
    for m in mounts:
        if m.fstype == "cgroup2" and "" in own:
            parent = m.point + own[""]
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    delegated = set(f.read().split()) & set(want)
            except OSError:
                continue
            path = delegated and _make(parent, {k: v for c in delegated for k, v in
                                                want[c].items()})
            if path:
                out.paths.append(path)
                for c in delegated:
                    setattr(out, c, os.path.join(path, f"{c}.events"))
                    del want[c]
                break
    v1 = {"memory": ({"memory.limit_in_bytes": str(max_memory),
                      "memory.memsw.limit_in_bytes": str(max_memory)}, "memory.oom_control"),
          "pids": (want.get("pids"), "pids.events")}
    for c in list(want):
        settings, events = v1[c]
        for m in mounts:
            if m.fstype == "cgroup" and c in m.super_options and c in own:
                path = _make(m.point + own[c], settings)
                if path:
                    out.paths.append(path)
                    setattr(out, c, os.path.join(path, events))
                    break
    return out


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
