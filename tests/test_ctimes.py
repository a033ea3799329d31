"""The snapshot's conflict threshold (caper.commit.ctimes): a change just before it
is below it, a change just after it at or above it, on the filesystems at
hand, without waiting where the kernel's timestamp floor makes waiting
unnecessary and with the wait where it does not."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from caper.commit import ctimes
from caper.fs import mountinfo
from caper.view.overlay import settle
from helpers.ctimes import wait_for


def _separates(directory: Path, state: Path, rounds: int) -> list[str]:
    """rounds x (change b; take the threshold; change a): every b must be
    before it and every a after it. The files are fresh and never stat()ed
    before their change, so the kernel stamps them coarse where it can."""
    entries = mountinfo.read()
    fstype = mountinfo.containing(str(directory), entries).fstype
    pairs = []
    for i in range(rounds):
        b, a = directory / f"b{i}", directory / f"a{i}"
        b.touch()
        a.touch()
        pairs.append((b, a))
    time.sleep(0.01)
    taken = []
    for i, (b, a) in enumerate(pairs):
        time.sleep(0.0004 * (i % 11))        # land at every phase of the 4 ms tick
        os.chmod(b, 0o640)
        th = ctimes.take(str(state), [fstype], entries)
        wait_for(th)
        os.chmod(a, 0o640)
        taken.append(th)
    bad = []
    for (b, a), th in zip(pairs, taken):
        if ctimes.changed_since(os.stat(b).st_ctime_ns, th.since_ns):
            bad.append(f"{b.name}: changed before the threshold, counted after it")
        if not ctimes.changed_since(os.stat(a).st_ctime_ns, th.since_ns):
            bad.append(f"{a.name}: changed after the threshold, counted before it")
    return bad


@pytest.mark.parametrize("where", ["tmp_path", "/dev/shm"])
def test_changes_just_before_and_just_after_the_threshold_fall_on_their_sides(tmp_path, where):
    directory = tmp_path if where == "tmp_path" else Path(where) / f"caper-test-{os.getpid()}"
    directory.mkdir(exist_ok=True)
    state = tmp_path / "state"
    state.mkdir()
    try:
        assert _separates(directory, state, 150) == []
    finally:
        if directory != tmp_path:
            shutil.rmtree(directory)


def test_this_kernel_needs_no_wait_on_its_multigrain_filesystems(tmp_path):
    """Linux 6.13+ stamps ext4 and tmpfs ctimes at or above the timestamp
    floor: shown here, so the command starts at once. (Older kernels: the
    wait, which the test above covers.)"""
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    if (major, minor) < (6, 13):
        pytest.skip(f"kernel {os.uname().release} predates multigrain timestamps")
    entries = mountinfo.read()
    fstype = mountinfo.containing(str(tmp_path), entries).fstype
    if fstype not in ("ext4", "tmpfs", "xfs", "btrfs"):
        pytest.skip(f"{tmp_path} is on {fstype}")
    th = ctimes.take(str(tmp_path), [fstype, "tmpfs"], entries)
    assert th.not_before_ns == 0
    assert th.since_ns <= time.time_ns()


def test_with_state_and_temp_dir_on_tmpfs_the_root_filesystem_is_still_shown(monkeypatch):
    """A host whose /tmp is a tmpfs: caper's state and the temp directory are
    there, and /var/tmp shows the floor on the root filesystem's type (before:
    no directory of that type was probed, and every run waited)."""
    entries = mountinfo.read()
    var_tmp = mountinfo.containing("/var/tmp", entries).fstype
    if tuple(int(x) for x in os.uname().release.split(".")[:2]) < (6, 13):
        pytest.skip("the kernel predates multigrain timestamps")
    if var_tmp not in ("ext4", "xfs", "btrfs") or not os.access("/var/tmp", os.W_OK):
        pytest.skip(f"/var/tmp is on {var_tmp} or not writable here")
    shm = Path("/dev/shm") / f"caper-test-{os.getpid()}"
    shm.mkdir()
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(shm))
        monkeypatch.setattr(ctimes, "_floor_shown", {})
        th = ctimes.take(str(shm), [var_tmp, "tmpfs"], entries)
        assert ctimes._floor_shown == {var_tmp: True, "tmpfs": True}
        assert th.not_before_ns == 0
        assert [p.name for p in shm.iterdir()] == ["ctime-probe"]
    finally:
        shutil.rmtree(shm)


def test_a_filesystem_type_not_shown_to_honour_the_floor_keeps_the_wait(tmp_path):
    th = ctimes.take(str(tmp_path), ["no-such-fs"], mountinfo.read())
    assert th.not_before_ns == th.since_ns > 0


@pytest.fixture(scope="module")
def whole_seconds_fs(tmp_path_factory):
    """ext4 with 128-byte inodes: ctimes in whole seconds. Module scope: a
    mount below /tmp must be gone before the rootless tests overlay /tmp."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a loop-mounted ext4 image)")
    mkfs = shutil.which("mkfs.ext4", path=os.pathsep.join(
        [os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"]))
    if mkfs is None:
        pytest.skip("mkfs.ext4 missing (apt-get install e2fsprogs)")
    base = tmp_path_factory.mktemp("ext4-128")
    img, mnt = base / "img", base / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run([mkfs, "-q", "-F", "-I", "128", str(img)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:           # a container without loop devices, as test_btrfs
        pytest.skip(f"cannot loop-mount an ext4 image: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        settle()        # a sandbox's init may still be exiting, holding the mount
        subprocess.run(["umount", str(mnt)], check=True)
        shutil.rmtree(base, ignore_errors=True)


def test_whole_second_ctimes_still_fall_after_the_threshold(tmp_path, whole_seconds_fs):
    """A change after the threshold, stamped in whole seconds, is below the
    threshold itself: compared with it rounded down, it still counts."""
    f = whole_seconds_fs / "f"
    f.touch()
    state = tmp_path / "state"
    state.mkdir()
    entries = mountinfo.read()
    for _ in range(20):
        th = ctimes.take(str(state), ["ext4"], entries)
        wait_for(th)
        os.chmod(f, 0o640)
        ctime = os.stat(f).st_ctime_ns
        assert ctime % ctimes.SECOND_NS == 0
        assert ctimes.changed_since(ctime, th.since_ns)
        time.sleep(0.05)
    # and a change well before it does not
    os.utime(f)
    old = os.stat(f).st_ctime_ns
    time.sleep(2.1)
    th = ctimes.take(str(state), ["ext4"], entries)
    assert not ctimes.changed_since(old, th.since_ns)


def test_a_state_directory_with_whole_second_ctimes_gives_no_fine_stamp_and_waits(whole_seconds_fs):
    state = whole_seconds_fs / "state"
    state.mkdir(exist_ok=True)
    th = ctimes.take(str(state), ["ext4"], mountinfo.read())
    assert th.not_before_ns == th.since_ns > 0
