"""The traced run: events with absolute paths and results, streaming, the
pre-filter, held output, limits and bad input. Real processes, real
namespaces, real ptrace: nothing here is mocked."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
import time

import pytest

from caper.sandbox._native import lib
from caper.errors import STEP_ERRORS, ConfigError
from caper.sandbox.events import End, Info, Kind, Step, decode, DecodeError, HEADER_SIZE
from caper.sandbox.trace import Trace, baseline, trace
from helpers.hostprocs import pids_with_cmdline

PY = os.path.realpath(sys.executable)


def run(cmd, **kw):
    kw.setdefault("timeout", 60)
    return trace(cmd, **kw).run()


def of_kind(events, kind):
    return [e for e in events if e.kind == kind]


def test_known_script_events_have_absolute_paths_and_results(tmp_path):
    """A shell runs a grandchild Python that cds, uses openat(dirfd), renames,
    unlinks, connects and sends: every act appears with its absolute path and
    result, attributed to the grandchild."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "input.txt").write_text("data")
    (tmp_path / "victim").write_text("x")
    # A port nothing listens on inside the sandbox's own loopback.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = textwrap.dedent(f"""
        import os, socket
        os.chdir("sub")
        open("input.txt").read()
        d = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        fd = os.open("out.tmp", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=d)
        os.write(fd, b"hello"); os.close(fd)
        os.rename("out.tmp", "out.txt")
        os.unlink("../victim")
        c = socket.socket()
        print("tcp", c.connect_ex(("127.0.0.1", {port})))
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.sendto(b"ping", ("127.0.0.1", {port}))
    """)
    (tmp_path / "script.py").write_text(script)
    events, r = run(f"sh -c '{PY} script.py'", cwd=tmp_path)
    assert r.end == End.EXITED and r.exit_code == 0, r.stderr.text()
    sub = str(tmp_path / "sub")
    py_exec = [e for e in of_kind(events, Kind.EXEC) if e.ok and e.argv[-1:] == ["script.py"]]
    assert len(py_exec) == 1
    pid = py_exec[0].pid
    sh_pids = {e.pid for e in of_kind(events, Kind.EXEC) if e.ok and e.path.endswith("/sh")}
    assert len(sh_pids) == 2  # the outer and the inner shell: python is a grandchild

    opens = {e.path: e for e in of_kind(events, Kind.OPEN) if e.pid == pid}
    read = opens[f"{sub}/input.txt"]
    assert read.ok and read.flags & 3 == os.O_RDONLY
    created = opens[f"{sub}/out.tmp"]
    assert created.ok and created.flags & os.O_CREAT and created.mode == 0o600

    (ren,) = [e for e in of_kind(events, Kind.RENAME) if e.pid == pid]
    assert (ren.path, ren.path2, ren.result) == (f"{sub}/out.tmp", f"{sub}/out.txt", 0)
    (unl,) = [e for e in of_kind(events, Kind.UNLINK) if e.pid == pid]
    assert (unl.path, unl.result) == (str(tmp_path / "victim"), 0)

    (conn,) = [e for e in of_kind(events, Kind.CONNECT) if e.pid == pid]
    assert (conn.path, conn.port, conn.error) == ("127.0.0.1", port, "ECONNREFUSED")
    (sent,) = [e for e in of_kind(events, Kind.SENDTO) if e.pid == pid]
    assert (sent.path, sent.port, sent.family.name) == ("127.0.0.1", port, "INET")

    starts = {e.pid: e.ppid for e in of_kind(events, Kind.PROC_START)}
    assert starts[pid] in sh_pids  # ppid chain: python <- inner sh <- outer sh
    # The rename really happened (caper trace does not isolate the filesystem yet).
    assert (tmp_path / "sub" / "out.txt").read_text() == "hello"


def test_failed_calls_carry_their_errno(tmp_path):
    events, r = run(["cat", str(tmp_path / "missing")], cwd=tmp_path)
    assert r.exit_code == 1
    (op,) = [e for e in of_kind(events, Kind.OPEN) if e.path == str(tmp_path / "missing")]
    assert op.error == "ENOENT" and not op.ok


def test_events_stream_while_the_command_runs(tmp_path):
    """The command blocks on a FIFO until the test has seen its first event:
    if events were only delivered at the end, this would time out."""
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    t = trace(f"touch marker; read x < {fifo}; echo done", cwd=tmp_path, timeout=20)
    seen_before_end = False
    for ev in t:
        if ev.kind == Kind.OPEN and ev.path == str(tmp_path / "marker") and not seen_before_end:
            seen_before_end = True
            with open(fifo, "w") as f:  # release the command
                f.write("go\n")
    assert seen_before_end
    assert t.result.end == End.EXITED and t.result.stdout.text() == b"done\n"


def test_repeated_identical_events_are_folded_into_counts(tmp_path):
    (tmp_path / "f").write_text("x")
    events, _ = run([PY, "-c", "for _ in range(50): open('f').close()"], cwd=tmp_path)
    opens = [e for e in of_kind(events, Kind.OPEN) if e.path == str(tmp_path / "f")]
    assert len(opens) == 1
    (rep,) = [e for e in of_kind(events, Kind.REPEAT) if e.arg0 == opens[0].seq]
    assert rep.count == 49
    raw, _ = run([PY, "-c", "for _ in range(50): open('f').close()"], cwd=tmp_path, collapse=False)
    assert len([e for e in of_kind(raw, Kind.OPEN) if e.path == str(tmp_path / "f")]) == 50


def test_baseline_probe_drops_loader_noise_only():
    profile = baseline()
    assert "/etc/ld.so.cache" in profile.exact  # measured, not listed by hand
    events, r = run(["cat", "/etc/hostname"])
    paths = {e.path for e in of_kind(events, Kind.OPEN)}
    assert "/etc/hostname" in paths
    assert "/etc/ld.so.cache" not in paths and r.stats.noise > 0
    raw, _ = run(["cat", "/etc/hostname"], noise=None)
    assert "/etc/ld.so.cache" in {e.path for e in of_kind(raw, Kind.OPEN)}


def test_writes_are_never_noise(tmp_path):
    """Noise is only ever a read: a write-open of a noise path is reported."""
    target = tmp_path / "lib.so"
    target.write_text("")
    profile = baseline()
    from caper.sandbox.trace import NoiseProfile
    noisy = NoiseProfile(exact=profile.exact | {str(target)}, prefixes=profile.prefixes)
    events, _ = run([PY, "-c", f"open({str(target)!r}).close(); open({str(target)!r}, 'w').close()"],
                    noise=noisy)
    opens = [e for e in of_kind(events, Kind.OPEN) if e.path == str(target)]
    assert [e.flags & 3 for e in opens] == [os.O_WRONLY]


def test_held_output_and_exit_status(tmp_path):
    events, r = run("echo out; echo err >&2; exit 3")
    assert (r.end, r.exit_code) == (End.EXITED, 3)
    assert r.stdout.text() == b"out\n" and r.stderr.text() == b"err\n"
    _, r = run("kill -TERM $$")
    assert (r.end, r.signal) == (End.SIGNALED, signal.SIGTERM)


def test_one_gigabyte_of_stdout_is_bounded():
    _, r = run("head -c 1000000000 /dev/zero; echo tail-marker", timeout=120)
    assert r.exit_code == 0
    assert r.stdout.total == 1_000_000_000 + len("tail-marker\n")
    assert len(r.stdout.head) == 64 * 1024 and len(r.stdout.tail) == 64 * 1024
    assert r.stdout.tail.endswith(b"tail-marker\n") and r.stdout.truncated
    assert b"bytes omitted" in r.stdout.text()


def test_timeout_kills_the_sandbox():
    t0 = time.monotonic()
    _, r = run("sleep 1000", timeout=0.5)
    assert r.end == End.TIMEOUT
    assert time.monotonic() - t0 < 30  # it ended rather than hung


def test_daemon_that_setsid_and_double_forks_is_gone_after_the_run(tmp_path):
    marker = tmp_path / "daemon-wrote"
    events, r = run(f"(setsid sh -c 'sleep 1; touch {marker}' &) ; echo started", cwd=tmp_path)
    assert r.exit_code == 0 and r.stdout.text() == b"started\n"
    time.sleep(1.5)
    assert not marker.exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"touch {marker}" not in ps


def test_fork_bomb_ends_by_the_pids_limit_and_the_host_keeps_working():
    bomb = "import os, time\nwhile True:\n    try: os.fork()\n    except OSError: time.sleep(0.01)\n"
    _, r = run([PY, "-c", bomb], max_pids=64, timeout=60)
    assert r.end == End.PIDS_LIMIT
    assert r.stats.peak_pids > 64
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "while True" not in ps
    assert subprocess.run(["true"]).returncode == 0


def test_memory_limit_ends_with_a_clear_status():
    _, r = run([PY, "-c", "x = bytearray(1 << 31)"], max_memory=128 << 20)
    # A cgroup names the cause; RLIMIT_AS (no writable cgroup) makes the allocation fail.
    assert r.end == End.MEMORY_LIMIT or (r.end == End.EXITED and b"MemoryError" in r.stderr.text())


def test_missing_executable_is_a_clear_result():
    _, r = run(["/nonexistent/tool", "x"])
    assert r.end == End.EXEC_FAILED and r.exit_code == 127
    assert "/nonexistent/tool" in r.error and "No such file" in r.error


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError):
        Trace([])
    with pytest.raises(ConfigError):
        Trace(["echo", "a\0b"])
    with pytest.raises(ConfigError):
        Trace(["true"], cwd=tmp_path / "nope")
    with pytest.raises(ConfigError):
        Trace(["true"], timeout=-1)


def test_odd_file_names_arrive_byte_exact(tmp_path):
    names = [b"new\nline", b"caf\xe9-latin1", b"tab\tand space"]
    script = "import os\n" + "".join(f"open({n!r}, 'w').close()\n" for n in names)
    events, r = run([PY, "-c", script], cwd=tmp_path)
    assert r.exit_code == 0
    got = {os.fsencode(e.path) for e in of_kind(events, Kind.OPEN) if e.flags & os.O_CREAT}
    assert got == {os.fsencode(str(tmp_path)) + b"/" + n for n in names}


def test_a_4k_path_is_reported_truncated_not_crashing(tmp_path):
    long = "/" + "/".join(["d" * 200] * 25)  # > PATH_MAX
    events, r = run([PY, "-c", f"import os\ntry: open({long!r})\nexcept OSError as e: print(e.errno)"])
    assert r.exit_code == 0
    (op,) = [e for e in of_kind(events, Kind.OPEN) if e.path and e.path.startswith("/ddd")]
    assert op.error == "ENAMETOOLONG"
    assert op.info & lib.CAPER_INFO_TRUNCATED


def test_every_native_failure_step_maps_to_an_exception():
    unmapped = [s.name for s in Step if s.name not in STEP_ERRORS]
    assert not unmapped, f"unmapped caper_step values: {unmapped}"


def test_chdir_failure_is_an_exec_error_with_the_path(tmp_path):
    d = tmp_path / "gone"
    d.mkdir()
    t = trace(["true"], cwd=d)
    d.rmdir()
    _, r = t.run()
    assert r.end == End.EXEC_FAILED
    assert str(d) in r.error and "No such file" in r.error


def test_decoder_rejects_malformed_records():
    with pytest.raises(DecodeError):
        decode(b"\x04\x00\x00\x00" + b"\x08\x00\x00\x00" + bytes(HEADER_SIZE - 8))
    import struct
    bad = bytearray(HEADER_SIZE)
    struct.pack_into("II", bad, 0, lib.CAPER_EV_OPEN, HEADER_SIZE)
    off = lib.CAPER_EV_OPEN and HEADER_SIZE - 28  # str_off[0]
    struct.pack_into("III", bad, off, HEADER_SIZE, 0, 0)
    struct.pack_into("I", bad, off + 12, 100)  # str_len[0] past the record
    with pytest.raises(DecodeError):
        decode(bytes(bad))


def test_seccomp_program_fits_and_dumps(capfd):
    assert lib.caper_dump_filter(1) == 0
    out = capfd.readouterr().out
    n = int(out.split()[2])
    assert 0 < n <= 4096
    assert "if (arch != x86_64) return TRACE(foreign abi)" in out
    assert "/* mount */" in out and "/* openat */" in out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell apart")
def test_sandbox_shares_one_cpu_with_the_tracer_unless_asked_not_to():
    def allowed(**kw):
        _, r = run("grep Cpus_allowed_list /proc/self/status", **kw)
        return r.stdout.text().decode().split()[1]
    assert "," not in allowed() and "-" not in allowed()
    assert allowed(share_cpu=False) != allowed()
    assert len(os.sched_getaffinity(0)) >= 2  # the caller's own mask was restored


def test_exec_from_a_non_leader_thread_keeps_the_process_identity():
    script = ("import threading, os, time\n"
              "threading.Thread(target=lambda: os.execv('/bin/echo', ['echo', 'from-thread'])).start()\n"
              "time.sleep(10)\n")
    events, r = run([PY, "-c", script])
    assert (r.end, r.exit_code) == (End.EXITED, 0)  # the command's end is still seen
    assert r.stdout.text() == b"from-thread\n"
    (main_exec,) = [e for e in of_kind(events, Kind.EXEC) if e.ok and e.argv[:1] == [PY]]
    (echo,) = [e for e in of_kind(events, Kind.EXEC) if e.path == "/bin/echo"]
    assert echo.ok and echo.pid == main_exec.pid and echo.ppid == main_exec.ppid


def test_signals_and_job_control_pass_through():
    _, r = run([PY, "-c", "import os, signal, time\n"
                          "signal.signal(signal.SIGUSR1, lambda *a: print('got'))\n"
                          "os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.05)"])
    assert r.stdout.text() == b"got\n"
    _, r = run("sleep 0.3 & p=$!; kill -STOP $p; sleep 0.1; kill -CONT $p; wait $p; echo ok")
    assert (r.end, r.stdout.text()) == (End.EXITED, b"ok\n")


def test_o_tmpfile_is_traced_although_it_carries_the_directory_bit(tmp_path):
    events, r = run([PY, "-c", "import os; fd = os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o600); "
                               "os.write(fd, b'x')"], cwd=tmp_path)
    assert r.exit_code == 0, r.stderr.text()
    tmpfile = [e for e in of_kind(events, Kind.OPEN) if e.flags & os.O_TMPFILE == os.O_TMPFILE]
    assert [e.path for e in tmpfile] == [str(tmp_path)] and tmpfile[0].ok


def test_links_and_renames_the_tracer_makes_answer_as_the_kernel_does(tmp_path, cfixture):
    """The tracer makes every link and rename itself (from its copy of the
    names): each form, at each edge the fixture tries, gets the kernel's own
    answer and leaves the same tree as a native run. The one exception is a
    name through the command's own /proc/self (other than fd/N, the O_TMPFILE
    idiom): the tracer follows no magic link, so it is refused (EACCES) and
    reported so."""
    prog = cfixture("link_rename_forms")
    native, traced = tmp_path / "native", tmp_path / "traced"
    native.mkdir()
    traced.mkdir()
    want = subprocess.run([prog], cwd=native, capture_output=True, text=True, check=True).stdout
    events, r = run([prog], cwd=traced)
    got = r.stdout.text().decode()
    via_proc = "link via /proc/self/cwd"
    assert [ln for ln in got.splitlines() if not ln.startswith(via_proc)] == \
        [ln for ln in want.splitlines() if not ln.startswith(via_proc)]
    assert f"{via_proc:<28} -1 Permission denied" in got.splitlines()
    assert sorted(os.listdir(traced / "t")) == sorted(set(os.listdir(native / "t")) - {"pc"})
    [refused] = [e for e in of_kind(events, Kind.LINK) if e.info & Info.REFUSED]
    assert refused.path == "/proc/self/cwd/b" and refused.error == "EACCES"


def test_the_sandbox_dies_with_caper(tmp_path):
    """kill -9 of the process running caper: PTRACE_O_EXITKILL and
    PR_SET_PDEATHSIG take every sandbox process with it, daemons included."""
    marker = f"{41 + os.getpid() % 1000}.{time.time_ns() % 10**6:06d}"  # a unique sleep length
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from caper.sandbox.trace import trace\n"
            "trace(%r, timeout=120).run()\n") % (
        str(Path(__file__).resolve().parent.parent),
        f"(setsid sleep {marker} &); sleep {marker}")
    p = subprocess.Popen([PY, "-c", code])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(_sleepers(marker)) < 2:
        time.sleep(0.05)
    assert len(_sleepers(marker)) == 2, "the sandbox did not start"
    p.kill()
    p.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _sleepers(marker):
        time.sleep(0.05)
    assert _sleepers(marker) == []


def _sleepers(marker: str) -> list[int]:
    return pids_with_cmdline(b"sleep\0" + marker.encode() + b"\0")


def _zombie_children() -> list[int]:
    """Children of this process (any thread) that died and are not reaped."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            for pid in f.read().split():
                try:
                    with open(f"/proc/{pid}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] == "Z":
                            out.append(int(pid))
                except FileNotFoundError:
                    pass
    return out


@pytest.mark.parametrize("command", [["true"], ["sh", "-c", "(sleep 0.373; echo late) & echo now"],
                                     ["/nonexistent/cmd"]])
def test_the_run_answers_before_its_init_is_reaped_and_leaves_no_zombie(command):
    """Once the command is over and every other process of the sandbox is
    dead, the run answers; its init, killed, is reaped on the tracer thread
    while the kernel tears its namespaces down (rootless: ~3 ms of every run).
    A background job still stops the answer until it is dead, and a command
    that never started (init still in its vfork) does not hang the run."""
    from caper.view.overlay import settle
    before = set(_zombie_children())         # another test's, if any
    events, result = trace(command, timeout=30).run()
    assert pids_with_cmdline(b"sleep\x000.373") == []   # dead when the run answered
    if command[0] == "sh":
        assert result.stdout.text() == b"now\n" and result.end == End.EXITED
    settle()
    assert set(_zombie_children()) <= before
