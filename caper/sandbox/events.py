"""Typed events decoded from the native core's fixed-layout records.

The record layout is `struct caper_event` in csrc/caper.h; this module reads
it through cffi, so neither the layout nor the kind numbers are typed twice.
"""
from __future__ import annotations

import enum
import errno
import os
from dataclasses import dataclass, field
from typing import Iterator

from caper.errors import DecodeError
from caper.sandbox._native import ffi, lib


def _enum(name: str, prefix: str) -> type[enum.IntEnum]:
    members = {k[len(prefix):]: getattr(lib, k) for k in dir(lib) if k.startswith(prefix)}
    return enum.IntEnum(name, members)


Kind = _enum("Kind", "CAPER_EV_")
Refusal = _enum("Refusal", "CAPER_REFUSE_")
Family = _enum("Family", "CAPER_AF_")
Info = _enum("Info", "CAPER_INFO_")
End = _enum("End", "CAPER_END_")
Step = _enum("Step", "CAPER_STEP_")

HEADER_SIZE = ffi.sizeof("struct caper_event")
_NET = (Kind.CONNECT, Kind.SENDTO, Kind.BIND)
_FAMILIES = frozenset(f.value for f in Family)
_REFUSALS = frozenset(r.value for r in Refusal)
_FILE = (Kind.OPEN, Kind.UNLINK, Kind.RMDIR, Kind.RENAME, Kind.LINK, Kind.SYMLINK,
         Kind.TRUNCATE, Kind.CHMOD, Kind.CHOWN, Kind.MKDIR, Kind.MKNOD)


# (SOCK_* type, IPPROTO_*) of a network event's socket, as the tracer reads it.
_PROTOCOLS = {(1, 6): "tcp", (1, 0): "stream", (2, 17): "udp", (2, 0): "dgram", (2, 1): "icmp",
              (3, 1): "icmp", (2, 58): "icmpv6", (3, 58): "icmpv6", (3, 0): "raw",
              (5, 0): "seqpacket", (1, 262): "mptcp"}


@dataclass(slots=True)
class Event:
    kind: Kind
    seq: int
    pid: int
    ppid: int
    time_ns: int
    result: int | None          # return value; None when the process died inside the call
    syscall: str | None
    flags: int = 0
    mode: int = 0
    arg0: int = 0
    arg1: int = 0
    count: int = 1
    info: int = 0
    path: str | None = None     # file events: the object; net events: the address text
    path2: str | None = None    # rename/link/symlink: the new name
    real: str | None = None     # open: what was opened; rename/link: what path is (symlinks
                                # resolved inside the sandbox; None when unknown)
    argv: list[str] | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result >= 0

    @property
    def error(self) -> str | None:
        """errno name of a failed call ("ENOENT"), else None."""
        if self.result is None or self.result >= 0:
            return None
        return errno.errorcode.get(-self.result, str(-self.result))

    @property
    def refused(self) -> bool:
        return bool(self.info & Info.REFUSED)

    @property
    def family(self) -> Family | None:
        return Family(self.flags) if self.kind in _NET else None

    @property
    def protocol(self) -> str | None:
        """tcp, udp, ... of a network event's socket (None when unknown)."""
        if self.kind not in _NET or not self.mode:
            return None
        return _PROTOCOLS.get((self.mode & 0xff, self.mode >> 8), f"type {self.mode & 0xff}")

    @property
    def port(self) -> int | None:
        return self.arg0 if self.kind in _NET and self.flags in (Family.INET, Family.INET6) else None

    def to_dict(self) -> dict:
        """A compact JSON-able view: only the fields that mean something for this kind."""
        d: dict = {"seq": self.seq, "kind": self.kind.name.lower(), "pid": self.pid}
        if self.ppid:
            d["ppid"] = self.ppid
        if self.syscall:
            d["syscall"] = self.syscall
        if self.kind in _FILE or self.kind == Kind.EXEC:
            d["path"] = self.path
        if self.path2 is not None:
            d["path2"] = self.path2
        if self.argv is not None:
            d["argv"] = self.argv
        if self.kind == Kind.OPEN:
            d["flags"] = open_flags(self.flags)
            if self.info & Info.DEVICE:
                d["device"] = f"{os.major(self.arg1)}:{os.minor(self.arg1)}"
        if self.kind in (Kind.CHMOD, Kind.MKDIR, Kind.MKNOD) or (
                self.kind == Kind.OPEN and self.flags & os.O_CREAT):
            d["mode"] = oct(self.mode & 0o7777)
        if self.kind == Kind.CHOWN:
            d["uid"], d["gid"] = _signed32(self.arg0), _signed32(self.arg1)
        if self.kind == Kind.TRUNCATE:
            d["length"] = self.arg0
        if self.kind in _NET:
            d["family"] = Family(self.flags).name.lower()
            d["address"] = self.path
            if self.port is not None:
                d["port"] = self.port
            if self.protocol:
                d["protocol"] = self.protocol
        if self.kind == Kind.SIGNAL:
            d["target"], d["signal"] = self.arg0, self.arg1
        if self.kind == Kind.REFUSED:
            d["reason"] = Refusal(self.flags).name.lower()
            d["sysno"] = self.arg1
        if self.kind == Kind.PROC_START:
            d["clone_flags"] = hex(self.arg0)
        if self.kind == Kind.PROC_EXIT:
            d["status"] = self.arg0
        if self.kind == Kind.REPEAT:
            d["of_seq"] = self.arg0
        if self.kind in (Kind.REPEAT, Kind.NOISE) or self.count > 1:
            d["count"] = self.count
        if self.kind not in (Kind.PROC_START, Kind.PROC_EXIT, Kind.REPEAT, Kind.NOISE):
            d["result"] = self.result if self.ok or self.result is None else self.error
        flags = [i.name.lower() for i in Info if self.info & i]
        if flags:
            d["info"] = flags
        return d


def _signed32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


_ACCMODE = {os.O_RDONLY: "O_RDONLY", os.O_WRONLY: "O_WRONLY", os.O_RDWR: "O_RDWR"}
_OPEN_BITS = [(getattr(os, n), n) for n in ("O_CREAT", "O_EXCL", "O_TRUNC", "O_APPEND",
                                            "O_DIRECTORY", "O_NOFOLLOW", "O_TMPFILE", "O_PATH")]


def open_flags(flags: int) -> str:
    if flags & os.O_PATH:
        parts = ["O_PATH"]
    else:
        parts = [_ACCMODE.get(flags & 3, "O_ACCMODE")]
    parts += [n for bit, n in _OPEN_BITS if n != "O_PATH" and flags & bit == bit]
    return "|".join(parts)


def _string(buf: memoryview, base: int, off: int, n: int, reclen: int) -> bytes:
    if off < HEADER_SIZE or off + n > reclen:
        raise DecodeError(f"string [{off}, {off + n}) outside record of {reclen} bytes")
    return bytes(buf[base + off:base + off + n])


_names: dict[int, str | None] = {}


def _syscall_name(nr: int) -> str | None:
    if nr not in _names:
        p = lib.caper_syscall_name(nr)
        _names[nr] = ffi.string(p).decode() if p != ffi.NULL else None
    return _names[nr]


def decode(buf: bytes | bytearray | memoryview) -> tuple[list[Event], int]:
    """Decode the whole records at the start of buf; return them and the bytes used."""
    mv = memoryview(buf)
    cbuf = ffi.from_buffer(mv)
    out: list[Event] = []
    pos = 0
    while len(mv) - pos >= HEADER_SIZE:
        h = ffi.cast("struct caper_event *", cbuf + pos)
        reclen = h.len
        if reclen < HEADER_SIZE or reclen % 8:
            raise DecodeError(f"record length {reclen} at offset {pos}")
        if len(mv) - pos < reclen:
            break
        try:
            kind = Kind(h.kind)
        except ValueError:
            raise DecodeError(f"unknown event kind {h.kind}") from None
        if kind in _NET and h.flags not in _FAMILIES:
            raise DecodeError(f"unknown address family {h.flags} in a {kind.name} event")
        if kind == Kind.REFUSED and h.flags not in _REFUSALS:
            raise DecodeError(f"unknown refusal {h.flags}")
        strs = [_string(mv, pos, h.str_off[i], h.str_len[i], reclen) for i in range(3)]
        info = h.info
        result = None if info & Info.RESULT_UNKNOWN else h.result
        name = _syscall_name(h.sysno) if h.sysno and not (
            kind == Kind.REFUSED and h.flags == Refusal.ABI) else None
        ev = Event(kind=kind, seq=h.seq, pid=h.pid, ppid=h.ppid, time_ns=h.time_ns,
                   result=result, syscall=name, flags=h.flags, mode=h.mode, arg0=h.arg0,
                   arg1=h.arg1, count=h.count, info=info)
        if kind == Kind.EXEC:
            ev.path = os.fsdecode(strs[0])
            ev.argv = [os.fsdecode(a) for a in strs[1].rstrip(b"\0").split(b"\0")] if strs[1] else []
        elif kind == Kind.REFUSED:
            ev.arg1 = h.sysno
            ev.syscall = name or (f"syscall {h.sysno} (arch 0x{h.arch:x})")
        elif strs[0] or strs[1]:
            ev.path = os.fsdecode(strs[0]) if (strs[0] or kind != Kind.SYMLINK) else ""
            ev.path2 = os.fsdecode(strs[1]) if strs[1] else None
            # A file unlinked between the call and the tracer's look is
            # printed " (deleted)": it had the name before, for matching.
            ev.real = os.fsdecode(strs[2]).removesuffix(" (deleted)") if strs[2] else None
        out.append(ev)
        pos += reclen
    return out, pos


def iter_records(fd: int, chunk: int = 1 << 16) -> Iterator[Event]:
    """Events from a pipe until EOF."""
    pending = bytearray()
    while True:
        data = os.read(fd, chunk)
        if not data:
            if pending:
                raise DecodeError(f"{len(pending)} bytes of a partial record at end of stream")
            return
        pending += data
        events, used = decode(pending)
        del pending[:used]
        yield from events


@dataclass(slots=True)
class Output:
    """Held output of one stream: bounded head and tail, and the total size."""
    head: bytes
    tail: bytes
    total: int

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) and self.total > len(self.tail)

    @property
    def omitted(self) -> int:
        """Bytes in neither head nor tail."""
        return max(0, self.total - len(self.head) - len(self.tail))

    def text(self) -> bytes:
        """Everything kept, with a marker where bytes were dropped."""
        if self.total <= len(self.head):
            return self.head
        if self.total <= len(self.head) + len(self.tail):
            overlap = len(self.head) + len(self.tail) - self.total
            return self.head + self.tail[overlap:]
        return self.head + f"\n[... {self.omitted} bytes omitted ...]\n".encode() + self.tail


@dataclass(slots=True)
class Stats:
    stops: int = 0
    events: int = 0
    noise: int = 0
    collapsed: int = 0
    peak_pids: int = 0
    wall_ms: float = 0.0
    shm_bytes: int = 0         # left in /dev/shm at the end (discarded, never committed)


@dataclass(slots=True)
class RunResult:
    """How the sandboxed command ended, its held output and the tracer's counts."""
    end: End
    exit_code: int | None
    signal: int | None
    stdout: Output
    stderr: Output
    stats: Stats = field(default_factory=Stats)
    error: str | None = None   # what failed, when end is not EXITED/SIGNALED

    @property
    def status(self) -> str:
        if self.end == End.EXITED:
            return f"exited {self.exit_code}"
        if self.end == End.SIGNALED:
            return f"killed by signal {self.signal}"
        return self.end.name.lower() + (f": {self.error}" if self.error else "")
