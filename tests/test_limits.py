"""Resource limits: what one run may take from the machine (memory, /dev/shm,
CPU scheduling, disk) and from caper itself (events kept), each tried for
real with a small configured limit, never by exhausting this machine.

Filesystems the tests need small are tmpfs mounts made here (root only);
the rootless variants run as uid 65534 through tests/test_rootless.py's
helpers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from caper.sandbox.events import End, Kind
from caper.sandbox.limits import DEFAULT_MAX_MEMORY, DEFAULT_SHM_SIZE, DiskGuard, parse_size
from caper.sandbox.trace import trace
from caper.transaction import run
from helpers.rootless import (SYSTEM_PY, as_nobody, nobody_project, run_as_nobody, source_root,
                              why_not_rootless)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the test mounts a small filesystem")

# Allocates 256 MiB and touches every page: past every limit used below.
HOG = ("b = bytearray(256 << 20)\n"
       "for i in range(0, len(b), 4096): b[i] = 1\n"
       "print('survived')")
SMALL = 64 << 20


def out(result) -> str:
    return result.stdout.text().decode(errors="replace")


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    w.mkdir()
    return w


@pytest.fixture
def small_fs(tmp_path):
    """A 64 MiB tmpfs of our own, unmounted afterwards."""
    point = tmp_path / "small"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(point)],
                   check=True)
    yield point
    subprocess.run(["umount", "-l", str(point)], check=False)


# ---- memory ------------------------------------------------------------------

def test_parse_size_reads_binary_units_and_refuses_nonsense():
    assert parse_size("64M") == 64 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size(4096) == 4096 and parse_size("2g") == 2 << 30
    for bad in ("lots", "", "-1G", 0, "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_every_trace_has_the_default_memory_limit():
    with trace(["sleep", "0.3"], timeout=30) as t:
        if t._cgroups.memory:
            cg = Path(t._cgroups.memory).parent
            name = "memory.max" if (cg / "memory.max").exists() else "memory.limit_in_bytes"
            assert int((cg / name).read_text()) == DEFAULT_MAX_MEMORY
        else:
            assert t._cfg.max_memory == DEFAULT_MAX_MEMORY
    assert t.result.end == End.EXITED


def _hog_outcome(how: str, ws: Path, state: str, env: dict):
    if how == "api":
        return run([PY, "-c", HOG], cwd=str(ws), approver="allow", state_dir=state,
                   max_memory=SMALL).to_json()
    if how == "config":
        from caper.config import Config
        config = Config.model_validate({"limits": {"max_memory": "64M"}})
        return run([PY, "-c", HOG], cwd=str(ws), approver="allow", state_dir=state,
                   config=config).to_json()
    argv = [PY, "-m", "caper", "run", "--json", "--approver", "allow", "--max-memory", "64M",
            *(["--no-gate"] if how == "cli" else []), "--", PY, "-c", HOG]
    p = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(p.stdout)


@pytest.mark.parametrize("how", ["api", "config", "cli", "gate"])
def test_a_run_past_its_memory_limit_ends_clearly_and_is_blocked(how, ws, tmp_path,
                                                                 monkeypatch):
    state = str(tmp_path / "state")
    env = {**os.environ, "CAPER_STATE_DIR": state, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    if how == "gate":
        env.pop("CAPER_NO_GATE", None)
    try:
        doc = _hog_outcome(how, ws, state, env)
    finally:
        log = Path(state, "gate.log")
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith("caper serve: pid"):
                try:
                    os.kill(int(line.split()[3]), signal.SIGTERM)
                except ProcessLookupError:
                    pass
    if how == "gate":
        assert "gate" in doc, doc      # it went through the resident gate
    assert not doc["committed"] and "survived" not in doc["stdout"]
    if "memory_limit" in doc["report"]["end"]["how"]:   # the whole sandbox, by its cgroup
        assert "memory_limit" in doc["reason"] and "64 MiB" in doc["reason"]
    else:                                       # no cgroup: RLIMIT_AS per process
        assert "MemoryError" in doc["stderr"]


ROOTLESS_HOG = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from caper.sandbox.trace import trace
t = trace([sys.executable, "-c", sys.argv[2]], cwd="/", timeout=60, max_memory=64 << 20)
events, r = t.run()
print(json.dumps({"end": r.end.name, "stdout": r.stdout.text().decode(),
                  "stderr": r.stderr.text().decode()[-300:], "cgroup": t._cgroups.memory is not None}))
"""


def test_the_memory_limit_holds_rootless():
    """uid 65534 cannot make a cgroup here: RLIMIT_AS bounds each process."""
    reason = why_not_rootless()
    if reason:
        pytest.skip(reason)
    p = as_nobody(SYSTEM_PY, "-c", ROOTLESS_HOG, str(source_root()), HOG, timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)
    assert "survived" not in got["stdout"]
    assert got["end"] == "MEMORY_LIMIT" if got["cgroup"] else "MemoryError" in got["stderr"], got


def test_a_bad_memory_limit_is_a_clear_error(ws, tmp_path):
    from caper.config import Config
    from caper.errors import ConfigError
    with pytest.raises(ConfigError, match="max_memory"):
        run("true", cwd=str(ws), state_dir=str(tmp_path / "s"), max_memory=-5)
    with pytest.raises(ValueError, match="not a size"):
        Config.model_validate({"limits": {"max_memory": "plenty"}})
    p = subprocess.run([PY, "-m", "caper", "run", "--max-memory", "plenty", "-c", "true"],
                       cwd=ws, capture_output=True, text=True, env={**os.environ,
                                                                  "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and "not a size" in p.stderr


# ---- /dev/shm ------------------------------------------------------------------

def test_dev_shm_is_bounded():
    _, r = trace("dd if=/dev/zero of=/dev/shm/fill bs=1M count=200 2>&1; "
                 "df -k /dev/shm | tail -1", timeout=30).run()
    text = out(r)
    assert "No space left on device" in text
    size_kib = int(text.splitlines()[-1].split()[1])
    assert size_kib == DEFAULT_SHM_SIZE >> 10
    assert r.stats.shm_bytes == DEFAULT_SHM_SIZE      # counted: full
    _, r = trace("dd if=/dev/zero of=/dev/shm/fill bs=1M count=20 2>&1", timeout=30,
                 shm_size=8 << 20).run()
    assert "No space left on device" in out(r)


def test_what_is_left_in_dev_shm_is_said_in_the_report(ws, tmp_path):
    from caper.report.build import SHM_DISCARDED
    outcome = run("head -c 3M /dev/zero > /dev/shm/cache", cwd=str(ws), approver="allow",
                  state_dir=str(tmp_path / "state"))
    assert f"{SHM_DISCARDED}: {3 << 20}" in outcome.report.uncertain
    assert any("/dev/shm" in n for n in outcome.notes)


# ---- CPU scheduling and capabilities --------------------------------------------

KEPT_CAPS = {0, 1, 3, 4, 5, 6, 7, 10, 13, 31}   # CHOWN DAC_OVERRIDE FOWNER FSETID KILL
#                                    SETGID SETUID NET_BIND_SERVICE NET_RAW SETFCAP


def test_only_the_kept_capabilities_remain():
    _, r = trace(["cat", "/proc/self/status"], timeout=30, userns=False).run()
    status = dict(l.split(":\t", 1) for l in out(r).splitlines() if ":\t" in l)
    for field in ("CapBnd", "CapEff", "CapPrm"):
        mask = int(status[field], 16)
        assert {b for b in range(64) if mask >> b & 1} == KEPT_CAPS, field
    assert int(status["CapInh"], 16) & ~sum(1 << b for b in KEPT_CAPS) == 0


SCHED = r"""
import os
def attempt(name, f):
    try:
        f(); print(name, "ok")
    except OSError as e:
        print(name, e.errno)
pin = os.sched_getaffinity(0)
attempt("fifo", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(99)))
attempt("rr", lambda: os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1)))
attempt("nice", lambda: os.nice(-5))
attempt("widen", lambda: os.sched_setaffinity(0, range(os.cpu_count())))
print("after", sorted(os.sched_getaffinity(0)) == sorted(pin), len(pin))
attempt("elsewhere", lambda: os.sched_setaffinity(0, set(range(os.cpu_count())) - pin))
attempt("child", lambda: os.sched_setaffinity(os.getppid(), range(os.cpu_count())))
"""


@pytest.mark.parametrize("userns", [False, True], ids=["root", "userns"])
def test_no_real_time_scheduling_and_the_cpu_pin_holds(userns):
    if os.cpu_count() < 2:
        pytest.skip("one CPU: there is nothing to widen the pin to")
    _, r = trace([PY, "-c", SCHED], timeout=30, userns=userns).run()
    got = dict(l.split(" ", 1) for l in out(r).splitlines())
    assert got["fifo"] == "1" and got["rr"] == "1" and got["nice"] == "1", got   # EPERM
    assert got["widen"] == "ok" and got["after"] == "True 1", got   # as inside a cpuset
    assert got["elsewhere"] == "22", got                             # EINVAL
    # --all-cpus: no pin, a mask is the command's own business.
    _, r = trace([PY, "-c", SCHED], timeout=30, userns=userns, share_cpu=False).run()
    got = dict(l.split(" ", 1) for l in out(r).splitlines())
    assert got["fifo"] == "1" and got["widen"] == "ok", got


# ---- disk: fallocate past the budget -------------------------------------------

FALLOCATE = r"""
import os, sys, threading
path, n = sys.argv[1], int(sys.argv[2])
free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
errs = []
def grab(i):
    fd = os.open(os.path.join(path, f"big{i}"), os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        os.posix_fallocate(fd, 0, free if n == 1 else free // 2)
        errs.append("ok")
    except OSError as e:
        errs.append(e.errno)
ts = [threading.Thread(target=grab, args=(i,)) for i in range(n)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sorted(map(str, errs)))
"""


@needs_root
@pytest.mark.parametrize("threads", [1, 4])
def test_fallocate_cannot_take_the_state_filesystem_past_its_floor(small_fs, ws, threads):
    state = str(small_fs / "state")
    os.makedirs(state)
    guard = DiskGuard.for_state_dir(state)
    outcome = run([PY, "-c", FALLOCATE, str(ws), str(threads)], cwd=str(ws),
                  approver="allow", state_dir=state)
    errs = outcome.stdout.text().decode()
    assert "28" in errs, errs                     # ENOSPC, as a full filesystem says
    refused = outcome.report.processes.refused
    assert refused and all(x.syscall == "fallocate" and x.reason == "disk_budget"
                           for x in refused)
    v = os.statvfs(state)
    assert v.f_bavail * v.f_frsize >= guard.min_free


@needs_root
def test_fallocate_again_after_freeing_the_space_works(small_fs, ws):
    """The budget is what is free now: allocate, delete, allocate again."""
    code = ("import os\nfor i in range(10):\n    fd = os.open('f', os.O_CREAT | os.O_WRONLY)\n"
            "    os.posix_fallocate(fd, 0, 30 << 20); os.close(fd); os.unlink('f')\nprint('done')")
    outcome = run([PY, "-c", code], cwd=str(ws), approver="allow",
                  state_dir=str(small_fs / "state"))
    assert outcome.stdout.text() == b"done\n", outcome.stderr.text()
    assert not outcome.report.processes.refused


PREALLOC_IOCTLS = r"""
import errno, fcntl, os, struct
fd = os.open("f", os.O_RDWR | os.O_CREAT, 0o644)
resv = struct.pack("hhqqiI4i", 0, 0, 0, 32 << 20, 0, 0, 0, 0, 0, 0)   # struct space_resv
for name, req in (("RESVSP64", 0x4030582a), ("RESVSP", 0x40305828), ("ZERO_RANGE", 0x40305839),
                  ("ALLOCSP64", 0x40305824)):
    try:
        fcntl.ioctl(fd, req, resv)
        print(name, "allocated", os.fstat(fd).st_blocks * 512)
    except OSError as e:
        print(name, "EOPNOTSUPP" if e.errno == errno.EOPNOTSUPP else errno.errorcode[e.errno])
r, w = os.pipe()
os.write(w, b"abc")
print("FIONREAD", struct.unpack("i", fcntl.ioctl(r, 0x541B, b"\0" * 4))[0])
"""


def test_the_ioctls_that_preallocate_are_refused(ws):
    """adv3a 20: FS_IOC_RESVSP64 and FS_IOC_ZERO_RANGE reach vfs_fallocate()
    past the tracer's disk budget, in one call: refused (EOPNOTSUPP) in the
    filter; other ioctls pass."""
    outcome = run([PY, "-c", PREALLOC_IOCTLS], cwd=str(ws), approver="allow")
    lines = outcome.stdout.text().decode().splitlines()
    assert lines == ["RESVSP64 EOPNOTSUPP", "RESVSP EOPNOTSUPP", "ZERO_RANGE EOPNOTSUPP",
                     "ALLOCSP64 EOPNOTSUPP", "FIONREAD 3"], outcome.stderr.text()
    assert os.stat(ws / "f").st_blocks == 0


NEWER_INODE_CALLS = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
open("f", "w").close()
fsx = ctypes.create_string_buffer(32)          # struct fsxattr: xflags first
ctypes.memmove(fsx, (0x4000 | 0x40).to_bytes(4, "little"), 4)   # NODUMP | NOATIME
for name, nr, args in (("file_setattr", 469, (-100, b"f", fsx, 32, 0)),
                       ("statmount", 457, (None, None, 0, 0)),
                       ("listmount", 458, (None, None, 0, 0))):
    rc = libc.syscall(nr, *args)
    print(name, "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_the_newer_calls_that_set_inode_flags_or_list_mounts_are_refused(ws):
    """adv11a 01: file_setattr(2) (Linux 6.17) sets the flags FS_IOC_FSSETXATTR
    does, which the filter refuses; statmount and listmount may name mount
    namespaces other than the sandbox's. Each answers ENOSYS, as a kernel
    without them would: tools fall back to the ioctl or /proc."""
    outcome = run([PY, "-c", NEWER_INODE_CALLS], cwd=str(ws), approver="allow")
    assert outcome.stdout.text().decode().split("\n")[:3] == [
        "file_setattr ENOSYS", "statmount ENOSYS", "listmount ENOSYS"], outcome.stderr.text()


USER_OBJECTS = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
for name, make in (("inotify", lambda: libc.inotify_init1(0)),
                   ("fanotify", lambda: libc.fanotify_init(0, 0))):
    made = 0
    while made < 200:
        fd = make()
        if fd < 0:
            break
        made += 1
    print(name, made, errno.errorcode.get(ctypes.get_errno(), "?"))
"""


def test_a_run_takes_a_share_of_its_users_inotify_and_fanotify_instances(ws):
    """adv10a 05: inotify instances and fanotify groups are counted per
    user across the host (128 each): a blocked run held them all, and every
    host process of that user (systemd, editors' watchers, tail -f) got
    EMFILE. The run gets 32 in all; past them EMFILE, and the report says so."""
    outcome = run([PY, "-c", USER_OBJECTS], cwd=str(ws), approver="block")
    got = outcome.stdout.text().decode().split()
    assert got[:3] == ["inotify", "32", "EMFILE"], outcome.stderr.text()
    assert got[3:] == ["fanotify", "0", "EMFILE"]                 # the share is spent
    assert {r.reason for r in outcome.report.processes.refused} >= {"user_limit"}


def test_fallocate_within_the_budget_works(ws):
    _, r = trace([PY, "-c", "import os; fd = os.open('f', os.O_CREAT | os.O_WRONLY); "
                  "os.posix_fallocate(fd, 0, 1 << 20); print(os.fstat(fd).st_size)"],
                 cwd=str(ws), timeout=30, disk_guard=DiskGuard.for_state_dir(str(ws))).run()
    assert out(r).strip() == str(1 << 20)


# ---- what a run may cost caper -------------------------------------------------

MISSING = "import os\nfor i in range(20000):\n    try: os.open(f'/nonexistent/{i}', 0)\n" \
          "    except OSError: pass\nprint('done')"


def test_the_events_one_run_may_cost_caper_are_capped():
    events, r = trace([PY, "-c", MISSING], timeout=60, max_events=2000).run()
    assert r.end == End.EVENT_LIMIT and "done" not in out(r)
    assert "more than 2000 events" in r.error
    assert len(events) <= 2000 + 64     # what was in flight when it was killed
    events, r = trace([PY, "-c", MISSING], timeout=60, max_event_bytes=1 << 20).run()
    assert r.end == End.EVENT_LIMIT
    assert sum(1 for e in events if e.kind == Kind.OPEN) < 20000


def test_a_run_past_the_event_cap_is_blocked_and_says_why(ws, tmp_path):
    from caper.config import Config
    config = Config.model_validate({"limits": {"max_events": 2000}})
    outcome = run([PY, "-c", MISSING], cwd=str(ws), approver="allow", config=config,
                  state_dir=str(tmp_path / "state"))
    assert not outcome.committed and outcome.decision == "block"
    assert "event_limit" in outcome.reason and "2000 events" in outcome.reason
    assert "event_limit" in outcome.report.end.how


# ---- trees deeper than Python's stack and PATH_MAX -----------------------------

DEEP = "import os\nfor i in range(3000):\n    os.mkdir('d'); os.chdir('d')\nopen('leaf', 'w').write('x')\n"


def _make_deep(root: Path, levels: int = 3000) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)


@pytest.mark.parametrize("approver", ["block", "allow"])
def test_a_3000_level_tree_is_blocked_cleanly_and_later_runs_work(approver, ws, tmp_path):
    from caper.commit.fsops import MAX_TREE_DEPTH
    from caper.view.overlay import settle
    state = str(tmp_path / "state")
    outcome = run([PY, "-c", DEEP], cwd=str(ws), approver=approver, state_dir=state)
    assert not outcome.committed and outcome.report is not None
    if approver == "allow":
        assert f"more than {MAX_TREE_DEPTH} directory levels" in outcome.reason
    settle()
    assert os.listdir(ws) == [] and os.listdir(Path(state, "runs")) == []
    later = run("echo later > later", cwd=str(ws), approver="allow", state_dir=state)
    assert later.committed and (ws / "later").read_text() == "later\n"


def test_a_deep_tree_within_the_bound_commits_past_path_max(ws, tmp_path):
    from caper.view.overlay import settle
    state = str(tmp_path / "state")
    name = "d" * 40        # 150 levels of 41 bytes: 6,150 bytes of path, past PATH_MAX
    code = f"import os\nfor i in range(150):\n    os.mkdir({name!r}); os.chdir({name!r})\n" \
           "open('leaf', 'w').write('x')\n"
    assert run([PY, "-c", code], cwd=str(ws), approver="allow", state_dir=state).committed
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(150):
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    assert os.listdir(fd) == ["leaf"]
    os.close(fd)
    assert run(f"rm -rf {name}", cwd=str(ws), approver="allow", state_dir=state).committed
    settle()
    assert os.listdir(ws) == []


def test_deleting_a_host_tree_past_the_bound_is_refused_not_a_crash(ws, tmp_path):
    from caper.view.overlay import remove_tree
    _make_deep(ws)
    try:
        outcome = run("rm -rf d", cwd=str(ws), approver="allow", state_dir=str(tmp_path / "s"))
        assert not outcome.committed and "directory levels" in outcome.reason
        assert (ws / "d" / "d").is_dir()
    finally:
        remove_tree(str(ws / "d"))     # pytest's own clean-up recurses


def test_dead_runs_of_any_depth_are_collected(tmp_path):
    from caper.view.overlay import collect_dead_runs
    state = tmp_path / "state"
    dead = state / "runs" / "0123456789abcdef"
    dead.mkdir(parents=True)
    _make_deep(dead)
    (dead / "d").chmod(0)                  # shut, as a command may leave it
    assert collect_dead_runs(str(state)) == [str(dead)]
    assert os.listdir(state / "runs") == []


# ---- commit: sparse files, room, privileges --------------------------------------

@needs_root
def test_a_sparse_file_is_committed_sparse_across_filesystems(small_fs, ws):
    state = str(small_fs / "state")       # the upper on a tmpfs, the workspace on /tmp's fs
    cmd = ("truncate -s 8G f && printf data | dd of=f bs=1 seek=4096000 conv=notrunc "
           "status=none")
    outcome = run(cmd, cwd=str(ws), approver="allow", state_dir=state)
    assert outcome.committed, outcome.reason
    st = os.stat(ws / "f")
    assert st.st_size == 8 << 30 and st.st_blocks * 512 <= 1 << 20
    with open(ws / "f", "rb") as f:
        f.seek(4096000)
        assert f.read(4) == b"data"
    (change,) = [c for c in outcome.report.changes if c.path == "f"]
    assert change.size == (None, 8 << 30) and change.allocated is not None
    assert change.allocated < 1 << 20 and "sparse" in outcome.report.card()


@needs_root
def test_a_commit_that_will_not_fit_is_refused_before_staging(small_fs, tmp_path):
    ws = small_fs / "ws"                  # the host tree small, the upper on /tmp's fs
    ws.mkdir()
    outcome = run("head -c 96M /dev/zero > big", cwd=str(ws), approver="allow",
                  state_dir=str(tmp_path / "state"))
    assert not outcome.committed
    assert "need" in outcome.reason and "nothing was committed" in outcome.reason
    assert os.listdir(ws) == []


PRIVILEGED = ("cp /bin/true u && chmod u+s u && cp /bin/true g && chmod g+s,g+x g && "
              "mkdir -p sub && chmod g+s sub && cp /bin/true sub/plain")


def _privileged(outcome) -> dict:
    return {c.path: c.privileges for c in outcome.report.changes if c.privileges}


def test_setuid_and_setgid_files_are_shown_and_blocked(ws, tmp_path):
    state = str(tmp_path / "state")
    outcome = run(PRIVILEGED, cwd=str(ws), approver="policy", state_dir=state)
    assert _privileged(outcome) == {"u": ["setuid"], "g": ["setgid"]}
    assert not outcome.committed and "privilege change" in outcome.reason
    assert "GRANTS PRIVILEGES: setuid" in outcome.report.card()
    assert os.listdir(ws) == []
    # a file that was there: chmod u+s is a meta change, and one too
    (ws / "tool").write_bytes(Path("/bin/true").read_bytes())
    (ws / "tool").chmod(0o755)
    outcome = run("chmod u+s tool", cwd=str(ws), approver="policy", state_dir=state)
    assert _privileged(outcome) == {"tool": ["setuid"]} and not outcome.committed
    assert not (ws / "tool").stat().st_mode & 0o4000


# Entries every user may write: a world-writable directory without the
# sticky bit (anyone may also delete or replace what it holds), a file made
# 0666 by install -m or under umask 0. A sticky 1777 directory (/tmp's mode)
# is flagged too: anyone may still plant entries in it.
WORLD_WRITABLE = ("mkdir -m 777 shared && install -m 666 /dev/null f && (umask 0; touch g) && "
                  "mkdir -m 1777 drop && mkdir -m 755 fine && touch fine/ok && ln -s f link")
WORLD_WRITTEN = {"shared", "f", "g", "drop"}


def _world_writable(outcome) -> set:
    return {c.path for c in outcome.report.changes if "write for every user" in (c.detail or "")}


def test_world_writable_new_entries_are_shown_and_blocked(ws, tmp_path):
    """Until round 3 `mkdir -m 777 shared` and `install -m 666` were committed
    without a word: another user of the machine could then rewrite them."""
    state = str(tmp_path / "state")
    outcome = run(WORLD_WRITABLE, cwd=str(ws), approver="policy", state_dir=state)
    assert outcome.exit_code == 0, outcome.stderr.text()
    assert _world_writable(outcome) == WORLD_WRITTEN
    assert "write for every user (mode 0777)" in outcome.report.card()
    assert not outcome.committed and "permissions for other users" in outcome.reason
    assert os.listdir(ws) == []
    # asked for, and declared by the command: the human (or LLM) decides
    outcome = run("mkdir -m 777 shared", cwd=str(ws), approver="policy", state_dir=state,
                  task="make a shared directory writable for everyone: fix its permissions")
    assert not outcome.committed and "shared" in outcome.reason
    # an entry made 0755 / 0644 is no widening: ordinary work commits
    outcome = run("mkdir -m 755 fine && touch fine/ok", cwd=str(ws), approver="policy",
                  state_dir=state)
    assert outcome.committed, outcome.reason


WIDENED = "echo more >> tool && chmod 666 tool && chmod 777 dir"


def _widened(root: Path) -> None:
    (root / "tool").write_text("x\n")
    (root / "tool").chmod(0o644)
    (root / "dir").mkdir()
    (root / "dir").chmod(0o755)


def test_a_file_written_and_made_world_writable_is_judged(ws, tmp_path):
    """A content change and a chmod in one run: until round 3 the change was
    `modified` with no detail, the widened mode unseen, and committed."""
    _widened(ws)
    outcome = run(WIDENED, cwd=str(ws), approver="policy", state_dir=str(tmp_path / "state"))
    details = {c.path: c.detail for c in outcome.report.changes}
    assert details["tool"] == "mode 0644->0666" and details["dir"] == "mode 0755->0777", details
    assert not outcome.committed and "0644 -> 0666" in outcome.reason, outcome.reason
    assert (ws / "tool").stat().st_mode & 0o777 == 0o644


@needs_root
def test_file_capabilities_are_shown_and_blocked(ws, tmp_path):
    import shutil
    if not shutil.which("setcap"):
        pytest.skip("setcap (libcap2-bin) is not installed")
    outcome = run("cp /bin/true c && setcap cap_net_raw+ep c", cwd=str(ws), approver="policy",
                  state_dir=str(tmp_path / "state"))
    assert outcome.exit_code == 0, outcome.stderr.text()
    assert _privileged(outcome) == {"c": ["capabilities"]}
    assert not outcome.committed and "privilege change" in outcome.reason


def test_setuid_is_shown_and_blocked_rootless():
    with nobody_project("caper-limits-") as (ws, state):
        out = run_as_nobody(ws, "cp /bin/true u && chmod u+s u", "policy", state)
        assert not out["committed"] and "setuid" in out["reason"], out
        assert os.listdir(ws) == []
    # Rootless caper cannot grant file capabilities at all: setting
    # security.capability needs CAP_SETFCAP over the file's user namespace,
    # and the command's uid is not root there (setcap says "unable to set
    # CAP_SETFCAP effective capability: Operation not permitted").


@pytest.fixture(scope="module")
def btrfs_ws(tmp_path_factory):
    """A subvolume workspace on a small loop-mounted btrfs (root only)."""
    import shutil
    from caper.view import btrfs
    from caper.view.overlay import settle
    if os.geteuid() != 0 or not shutil.which("mkfs.btrfs") or btrfs.btrfsutil is None:
        pytest.skip("needs root, mkfs.btrfs and btrfsutil")
    base = tmp_path_factory.mktemp("btrfs")
    img, mnt = base / "img", base / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(300 << 20)
    subprocess.run(["mkfs.btrfs", "-q", str(img)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot loop-mount a btrfs image: {r.stderr.strip()}")
    btrfs.btrfsutil.create_subvolume(str(mnt / "ws"))
    try:
        yield mnt / "ws"
    finally:
        settle()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("approver", ["block", "allow"])
def test_a_3000_level_tree_in_a_btrfs_workspace_crashes_nothing(approver, btrfs_ws):
    state = str(btrfs_ws.parent / "state")
    outcome = run([PY, "-c", DEEP], cwd=str(btrfs_ws), approver=approver, state_dir=state)
    assert outcome.report is not None and outcome.report.backend == "btrfs"
    assert not outcome.committed or approver == "allow"
    later = run("echo later > later", cwd=str(btrfs_ws), approver="allow", state_dir=state)
    assert later.committed and (btrfs_ws / "later").read_text() == "later\n"
    assert run("rm -rf d later", cwd=str(btrfs_ws), approver="allow", state_dir=state).committed
    assert os.listdir(btrfs_ws) == []


def test_setuid_in_a_btrfs_workspace_is_shown_and_blocked(btrfs_ws):
    state = str(btrfs_ws.parent / "state")
    outcome = run(PRIVILEGED, cwd=str(btrfs_ws), approver="policy", state_dir=state)
    assert _privileged(outcome) == {"u": ["setuid"], "g": ["setgid"]}
    assert not outcome.committed and os.listdir(btrfs_ws) == []


def test_world_writable_new_entries_in_a_btrfs_workspace_are_shown_and_blocked(btrfs_ws):
    state = str(btrfs_ws.parent / "state")
    outcome = run(WORLD_WRITABLE, cwd=str(btrfs_ws), approver="policy", state_dir=state)
    assert _world_writable(outcome) == WORLD_WRITTEN
    assert not outcome.committed and os.listdir(btrfs_ws) == []


def test_world_writable_new_entries_are_shown_and_blocked_rootless():
    with nobody_project("caper-limits-") as (ws, state):
        out = run_as_nobody(ws, WORLD_WRITABLE, "policy", state)
        assert not out["committed"] and "write for every user" in out["reason"], out
        assert os.listdir(ws) == []


def test_a_file_written_and_made_world_writable_in_a_btrfs_workspace_is_judged(btrfs_ws):
    state = str(btrfs_ws.parent / "state")
    _widened(btrfs_ws)
    try:
        outcome = run(WIDENED, cwd=str(btrfs_ws), approver="policy", state_dir=state)
        details = {c.path: c.detail for c in outcome.report.changes}
        assert details["tool"] == "mode 0644->0666" and details["dir"] == "mode 0755->0777", \
            details
        assert not outcome.committed and (btrfs_ws / "tool").stat().st_mode & 0o777 == 0o644
    finally:
        (btrfs_ws / "tool").unlink()
        (btrfs_ws / "dir").rmdir()
