"""caper.sandbox.trace: run a command in the sandbox and stream what it does.

    with caper.sandbox.trace.trace(["make"], cwd="/src") as t:
        for event in t:          # typed events, while the command runs
            ...
    t.result                     # how it ended, held output, counts

The native loop runs in a worker thread with the GIL released; this thread
reads the event pipe, so a command that opens 100,000 files streams through
a fixed buffer instead of piling up.
"""
from __future__ import annotations

import functools
import ipaddress
import os
import re
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from caper.sandbox import DEFAULT_TIMEOUT_S
from caper.sandbox._native import ffi, lib
from caper.errors import ConfigError, from_native
from caper.sandbox.limits import (DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_EVENTS, DEFAULT_MAX_MEMORY,
                          DEFAULT_SHM_SIZE, Cgroups, DiskGuard, sandbox_cgroups)
from caper.sandbox.events import End, Event, Kind, Output, RunResult, Stats, Step, iter_records
from caper.sandbox.inherit import DEFAULT_SHELL, Caller
from caper.sandbox.netproxy import ProxyEnd

# The thread that runs the native tracer, and then reaps the sandbox's init
# after the caller has its result (caper.view.overlay.settle waits for it).
TRACER_THREAD = "caper-tracer"


@dataclass(frozen=True, slots=True)
class Mount:
    """One mount(2) call for the native core (struct caper_mount)."""
    source: str | None
    target: str
    fstype: str | None
    data: str | None
    flags: int
    or_else: int = 0    # the next N mounts are this one's fallback (struct caper_mount)
DEFAULT_MAX_PIDS = 1024
DEFAULT_ARGV_MAX = 1024        # bytes of argv kept per exec event
DEFAULT_OUTPUT_HEAD = 64 * 1024
DEFAULT_OUTPUT_TAIL = 64 * 1024
# Locale data is read by almost every program; the probe finds the rest.
DEFAULT_NOISE_PREFIXES = ("/usr/lib/locale", "/usr/share/locale", "/usr/lib/x86_64-linux-gnu/gconv")
BASELINE_COMMAND = ("/bin/sh", "-c", "true")
_SHARED_LIBRARY = re.compile(r"\.so(\.[0-9]+)*$")


class CredentialStop:
    """The credentials a run is stopped at, at its first access (caper.h:
    caper_credentials). globs: (glob, rooted), the tracer's candidates, with
    below_home's globs below any of homes' at least every name reaches answers
    for; translations: (mount point, the path it shows); reaches(name,
    below): the (path, kind) of the credential a call reaching name would
    reach (below: a link or rename, which reaches what is below it too), or
    None. The first answer is kept in `reached`."""

    def __init__(self, globs: Sequence[tuple[str, bool]],
                 translations: Sequence[tuple[str, str]],
                 reaches: "Callable[[str, bool], tuple[str, str] | None]",
                 homes: Sequence[str] = (), below_home: Sequence[str] = ()):
        self.globs, self.translations, self._reaches = tuple(globs), tuple(translations), reaches
        self.homes, self.below_home = tuple(homes), tuple(below_home)
        self.reached: tuple[str, str] | None = None

    def check(self, name: str, below: bool) -> bool:
        hit = self._reaches(name, below)
        if hit and self.reached is None:
            self.reached = hit
        return hit is not None


@dataclass(frozen=True, slots=True)
class NoiseProfile:
    """Read-only opens the C side drops before they cross into Python."""
    exact: frozenset[str] = frozenset()
    prefixes: frozenset[str] = frozenset()


def _env_list(env: Mapping[str, str] | None) -> list[bytes]:
    env = os.environ if env is None else env
    return [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]


def _argv(command: Sequence[str] | str, shell: str) -> list[bytes]:
    argv = [shell, "-c", command] if isinstance(command, str) else list(command)
    if not argv:
        raise ConfigError("empty command")
    out = []
    for a in argv:
        b = os.fsencode(a)
        if b"\0" in b:
            raise ConfigError(f"argument contains a NUL byte: {a!r}")
        out.append(b)
    return out


class Trace:
    """One sandboxed, traced run. Iterate for events; `.result` once done."""

    def __init__(self, command: Sequence[str] | str, *, cwd: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None, timeout: float | None = DEFAULT_TIMEOUT_S,
                 max_pids: int = DEFAULT_MAX_PIDS, max_memory: int = DEFAULT_MAX_MEMORY,
                 noise: NoiseProfile | None = None, collapse: bool = True,
                 userns: bool | None = None, argv_max: int = DEFAULT_ARGV_MAX,
                 output_head: int = DEFAULT_OUTPUT_HEAD, output_tail: int = DEFAULT_OUTPUT_TAIL,
                 share_cpu: bool = True,
                 mounts: Sequence[Mount] = (), new_root: str | None = None,
                 not_before_ns: int = 0, disk_guard: "DiskGuard | None" = None,
                 shm_size: int = DEFAULT_SHM_SIZE, max_events: int = DEFAULT_MAX_EVENTS,
                 max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
                 caller: Caller | None = None, proxy: "ProxyEnd | None" = None,
                 stop_at: "CredentialStop | None" = None):
        """caller: the context the command inherits (caper.sandbox.inherit), where this
        process is not the caller's own; None: this process's. proxy: the way out
        (caper.sandbox.netproxy): its sockets are made in the sandbox's network
        and handed over, and it sees every event before the caller does.
        stop_at: the credentials whose first access ends the run in that call
        (End.CREDENTIAL; what was reached: stop_at.reached)."""
        self._keep: list = []  # cffi objects that must outlive the native call
        self.argv = _argv(command, caller.shell if caller else DEFAULT_SHELL)
        cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
        if not os.path.isdir(cwd):
            raise ConfigError(f"working directory does not exist: {cwd}")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"timeout must be positive, not {timeout}")
        for name, value in (("max_memory", max_memory), ("shm_size", shm_size),
                            ("max_events", max_events), ("max_event_bytes", max_event_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 62:
                # no limit is not on offer
                raise ConfigError(f"{name} must be a positive number, not {value!r}")
        cfg = ffi.new("struct caper_config *")
        cfg.argv = self._strings(self.argv)
        cfg.envp = self._strings(_env_list(env))
        cfg.cwd = self._cstr(os.fsencode(cwd))
        flags = 0
        if userns if userns is not None else os.geteuid() != 0:
            flags |= lib.CAPER_F_USERNS
        if not collapse:
            flags |= lib.CAPER_F_NO_COLLAPSE
        if noise is None:
            flags |= lib.CAPER_F_KEEP_NOISE
        if share_cpu:
            flags |= lib.CAPER_F_SHARE_CPU
        cfg.flags = flags
        cfg.max_pids = max_pids or 0
        self.max_memory = max_memory
        self._cgroups = Cgroups()
        self._oom_killed = self._forks_refused = False
        cfg.shm_size = shm_size
        cfg.max_events = max_events
        cfg.max_event_bytes = max_event_bytes
        cfg.timeout_ms = int(timeout * 1000) if timeout else 0
        cfg.cgroup_procs = ffi.NULL
        # The host's own name: "caper" would tell the command it is pre-executed.
        cfg.hostname = self._cstr(os.uname().nodename.encode())
        if noise is not None:
            items = [(lib.CAPER_NOISE_EXACT, p) for p in sorted(noise.exact)] + \
                    [(lib.CAPER_NOISE_PREFIX, p) for p in sorted(noise.prefixes)]
            arr = ffi.new("struct caper_noise[]", max(1, len(items)))
            for i, (kind, path) in enumerate(items):
                arr[i].kind = kind
                arr[i].path = self._cstr(os.fsencode(path))
            self._keep.append(arr)
            cfg.noise, cfg.n_noise = arr, len(items)
        if mounts:
            arr = ffi.new("struct caper_mount[]", len(mounts))
            for i, m in enumerate(mounts):
                arr[i].source = self._cstr(os.fsencode(m.source)) if m.source else ffi.NULL
                arr[i].target = self._cstr(os.fsencode(m.target))
                arr[i].fstype = self._cstr(m.fstype.encode()) if m.fstype else ffi.NULL
                arr[i].data = self._cstr(os.fsencode(m.data)) if m.data else ffi.NULL
                arr[i].flags = m.flags
                arr[i].or_else = m.or_else
            self._keep.append(arr)
            cfg.mounts, cfg.n_mounts = arr, len(mounts)
        cfg.new_root = self._cstr(os.fsencode(new_root)) if new_root else ffi.NULL
        cfg.argv_max = argv_max
        cfg.output_head = output_head
        cfg.output_tail = output_tail
        cfg.stdin_fd = caller.stdin_fd if caller and caller.stdin_fd is not None else -1
        cfg.not_before_ns = not_before_ns
        cfg.disk_path = ffi.NULL
        self._disk_guard = disk_guard
        if disk_guard is not None:
            cfg.disk_path = self._cstr(os.fsencode(disk_guard.path))
            cfg.disk_min_free = disk_guard.min_free
            cfg.disk_min_inodes = disk_guard.min_inodes
        cfg.caller = self._caller(caller) if caller is not None else ffi.NULL
        cfg.proxy_fd = proxy.fd if proxy is not None else -1
        if proxy is not None:
            eps = proxy.endpoints
            if len(eps) > lib.CAPER_MAX_ENDPOINTS:
                raise ConfigError(f"the allowlist needs {len(eps)} sockets in the sandbox "
                                  f"(one per allowed name and port), more than "
                                  f"{lib.CAPER_MAX_ENDPOINTS}: allow fewer names")
            arr = ffi.new("struct caper_endpoint[]", max(1, len(eps)))
            for i, e in enumerate(eps):
                a = int(ipaddress.IPv4Address(e.address))
                arr[i].addr, arr[i].port, arr[i].datagram = a, e.port, e.datagram
                arr[i].on_lo = a >> 24 != 127
            self._keep.append(arr)
            cfg.endpoints, cfg.n_endpoints = arr, len(eps)
        cfg.stop_at = self._credentials(stop_at) if stop_at is not None else ffi.NULL
        self._proxy = proxy
        self._cfg = cfg
        self._res = ffi.new("struct caper_result *")
        if proxy is not None:
            res = self._res
            proxy.follow(lambda: res.emitted_seq)  # read while the tracer runs: one aligned word
        self.result: RunResult | None = None
        self._rc: int | None = None
        self._started = False
        self._thread: threading.Thread | None = None
        self._returned = threading.Event()     # caper_run is done; init may still be reaped
        self._read_fd = -1

    def _caller(self, caller: "Caller"):
        k = ffi.new("struct caper_caller *")
        k.umask, k.nice = caller.umask, caller.nice
        lims = ffi.new("struct caper_rlimit[]", max(1, len(caller.rlimits)))
        for i, (r, cur, hard) in enumerate(caller.rlimits):
            lims[i].resource, lims[i].cur, lims[i].max = r, cur, hard
        k.rlimits, k.n_rlimits = lims, len(caller.rlimits)
        # Root only (a user namespace has setgroups denied), and only where
        # they differ: the same groups are the ones this process passes on.
        if os.geteuid() == 0 and (caller.gid, caller.groups) != (os.getegid(),
                                                                 tuple(sorted(os.getgroups()))):
            groups = ffi.new("uint32_t[]", max(1, len(caller.groups)))
            for i, g in enumerate(caller.groups):
                groups[i] = g
            k.set_groups, k.gid, k.groups, k.n_groups = 1, caller.gid, groups, len(caller.groups)
            self._keep.append(groups)
        self._keep += [k, lims]
        return k

    def _credentials(self, stop: "CredentialStop"):
        k = ffi.new("struct caper_credentials *")
        globs = [os.fsencode(g) for g, _ in stop.globs]
        k.globs = self._strings(globs)
        rooted = ffi.new("uint8_t[]", [int(r) for _, r in stop.globs] or [0])
        k.rooted, k.n_globs = rooted, len(globs)
        k.translations = self._strings([os.fsencode(x) for pair in stop.translations for x in pair])
        k.n_translations = len(stop.translations)
        k.homes = self._strings([os.fsencode(h) for h in stop.homes])
        k.home_globs = self._strings([os.fsencode(g) for g in stop.below_home])
        k.n_homes, k.n_home_globs = len(stop.homes), len(stop.below_home)

        def check(name, below) -> int:
            return stop.check(os.fsdecode(ffi.string(name)), bool(below))
        # A failure in check stops the run: fail closed.
        callback = ffi.callback("int(*)(const char *, uint32_t)", check, error=1)
        k.check = callback
        self._keep += [k, rooted, callback]
        return k

    def _cstr(self, b: bytes):
        c = ffi.new("char[]", b)
        self._keep.append(c)
        return c

    def _strings(self, items: list[bytes]):
        arr = ffi.new("char *[]", len(items) + 1)
        for i, b in enumerate(items):
            arr[i] = self._cstr(b)
        arr[len(items)] = ffi.NULL
        self._keep.append(arr)
        return arr

    def _run_native(self) -> None:
        reap = 0
        try:
            self._rc = lib.caper_run(self._cfg, self._res)
            reap = self._res.reap_pid
            # Every process of the sandbox but init is gone: the counts are final.
            self._oom_killed = self._cgroups.oom_killed()
            self._forks_refused = self._cgroups.forks_refused()
        finally:
            self._returned.set()
        if reap:    # the sandbox's init, tearing its namespaces down: not the caller's wait
            lib.caper_reap(reap)
        self._cgroups.remove()

    def start(self) -> "Trace":
        if self._started:
            raise ConfigError("a Trace runs once")
        self._started = True
        # The whole sandbox in cgroups where they can be made (memory; pids
        # behind the tracer's own count), else RLIMIT_AS on every process (set
        # before exec, inherited by each child).
        self._cgroups = sandbox_cgroups(self.max_memory, self._cfg.max_pids)
        if self._cgroups.paths:
            self._cfg.cgroup_procs = self._strings([os.fsencode(p) for p in self._cgroups.procs])
        if self.max_memory and self._cgroups.memory is None:
            self._cfg.max_memory = self.max_memory
        r, w = os.pipe2(os.O_CLOEXEC)
        self._read_fd = r
        self._cfg.event_fd = w
        self._thread = threading.Thread(target=self._run_native, name=TRACER_THREAD, daemon=True)
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[Event]:
        if not self._started:
            self.start()
        try:
            if self._proxy is None:
                yield from iter_records(self._read_fd)
            else:
                for event in iter_records(self._read_fd):
                    self._proxy.observe(event)
                    yield event
        finally:
            self._finish()

    def __enter__(self) -> "Trace":
        return self.start()

    def __exit__(self, *exc) -> None:
        self._finish()

    def run(self) -> tuple[list[Event], RunResult]:
        """Run to the end; return every event and the result."""
        events = list(self)
        assert self.result is not None
        return events, self.result

    def _finish(self) -> None:
        if self.result is not None or self._thread is None:
            return
        # Drain whatever the caller did not read, or the native side blocks.
        if self._read_fd >= 0:
            while os.read(self._read_fd, 1 << 16):
                pass
            os.close(self._read_fd)
            self._read_fd = -1
        self._returned.wait()
        self.result = self._collect()

    def _collect(self) -> RunResult:
        res = self._res
        try:
            step = Step(res.step).name if res.step else None
            detail = ffi.string(res.detail).decode(errors="replace")
            end = End(res.end)
            if end in (End.EXITED, End.SIGNALED) and self._oom_killed:
                end = End.MEMORY_LIMIT
            elif end in (End.EXITED, End.SIGNALED) and self._forks_refused:
                end = End.PIDS_LIMIT
            if self._rc != 0:
                raise from_native(step or "NONE", res.err, detail)
            out = _output(res.out)
            err = _output(res.err_out)
            stats = Stats(stops=res.stops, events=res.events, noise=res.noise,
                          collapsed=res.collapsed, peak_pids=res.peak_pids,
                          wall_ms=res.wall_ns / 1e6, shm_bytes=res.shm_used)
            error = None
            if end not in (End.EXITED, End.SIGNALED) and step:
                error = str(from_native(step, res.err, detail))
            elif end == End.EVENT_LIMIT:
                c = self._cfg
                error = (f"the run made more than {c.max_events} events or "
                         f"{c.max_event_bytes >> 20} MiB of event records, caper's limit of what "
                         "one run may cost it; the sandbox was killed")
            elif end == End.CREDENTIAL:
                error = "stopped at a credential read"
            elif end == End.MEMORY_LIMIT:
                error = (f"the sandbox used more than {self.max_memory >> 20} MiB of memory "
                         "(its cgroup's limit); the process was killed")
            elif end == End.DISK_LIMIT:
                g = self._disk_guard
                error = (f"the filesystem of {g.path} fell below {g.min_free >> 20} MiB or "
                         f"{g.min_inodes} inodes free; the sandbox was killed")
            return RunResult(end=end,
                             exit_code=res.exit_code if end in (End.EXITED, End.EXEC_FAILED) else None,
                             signal=res.term_signal if end == End.SIGNALED else None,
                             stdout=out, stderr=err, stats=stats, error=error)
        finally:
            lib.caper_result_free(res)


def _output(o) -> Output:
    head = bytes(ffi.buffer(o.head, o.head_len)) if o.head_len else b""
    tail = bytes(ffi.buffer(o.tail, o.tail_len)) if o.tail_len else b""
    return Output(head=head, tail=tail, total=o.total)


@functools.lru_cache(maxsize=None)
def baseline(env_key: tuple = ()) -> NoiseProfile:
    """Probe what a bare shell touches at start-up (loader, libc, locale) and
    call that noise. Run once per process: the answer depends on the host."""
    env = dict(env_key) if env_key else None
    events, result = Trace(BASELINE_COMMAND, env=env, noise=None, collapse=False,
                           timeout=30).run()
    exact, prefixes = set(), set(DEFAULT_NOISE_PREFIXES)
    for ev in events:
        if ev.kind != Kind.OPEN or not ev.ok or ev.flags & 3 != os.O_RDONLY or not ev.path:
            continue
        # By the name opened and by what it is (/lib -> usr/lib): the tracer
        # drops an open as noise only if both are noise.
        for path in {ev.path, ev.real or ev.path}:
            exact.add(path)
            if _SHARED_LIBRARY.search(os.path.basename(path)):
                prefixes.add(os.path.dirname(path))  # the loader's library directories
    return NoiseProfile(exact=frozenset(exact), prefixes=frozenset(prefixes))


def trace(command: Sequence[str] | str, *, noise: NoiseProfile | None | str = "baseline",
          **kwargs) -> Trace:
    """A Trace of command; noise="baseline" subtracts what a bare shell touches."""
    if noise == "baseline":
        noise = baseline()
    return Trace(command, noise=noise, **kwargs)
