"""caper runs on a host whatever its mount table holds. A chroot-style tree
mounted for real (proc, sysfs, a tmpfs at sys/fs/cgroup with a cgroup2 mount
below it, devpts, a bind mount, a read-only mount, a loop-mounted ext4 bound
at two places, a FUSE mount where bindfs is installed) made every run fail
(`mount(overlay, .../sys/fs/cgroup): No such file or directory`). Now a
mount caper cannot or need not overlay is hidden or held read-only, a write
that failed there is flagged in the report, and the run goes on."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from caper.report.build import WRITES_HELD
from test_rootless import NOBODY, need_rootless_venv, run_as_nobody

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount the host tree")


def _mount(mounted: list[str], *args: str, target: Path) -> None:
    subprocess.run(["mount", *args, str(target)], check=True, capture_output=True)
    mounted.append(str(target))


@pytest.fixture
def chroot_tree():
    """The tree under a fresh temporary directory (never over a system
    path); every mount is undone in teardown, lazily if it is busy."""
    base = Path(tempfile.mkdtemp(prefix="caper-hostmounts-"))
    os.chmod(base, 0o755)
    root, mounted = base / "root", []
    for d in ("proc", "sys", "dev/pts", "bind", "ro", "loop", "data", "fuse"):
        (root / d).mkdir(parents=True)
    (base / "bound").mkdir()
    (base / "fuse-src").mkdir()
    (base / "fuse-src" / "z").write_text("z\n")
    try:
        _mount(mounted, "-t", "proc", "caper-test-proc", target=root / "proc")
        _mount(mounted, "-t", "sysfs", "caper-test-sys", target=root / "sys")
        _mount(mounted, "-t", "tmpfs", "-o", "size=1m", "caper-test-cg", target=root / "sys/fs/cgroup")
        (root / "sys/fs/cgroup/unified").mkdir()
        _mount(mounted, "-t", "cgroup2", "caper-test-cg2", target=root / "sys/fs/cgroup/unified")
        _mount(mounted, "-t", "devpts", "-o", "newinstance", "caper-test-pts", target=root / "dev/pts")
        _mount(mounted, "--bind", str(base / "bound"), target=root / "bind")
        _mount(mounted, "-t", "tmpfs", "-o", "ro,size=1m", "caper-test-ro", target=root / "ro")
        img = base / "ext4.img"
        subprocess.run(["truncate", "-s", "16M", str(img)], check=True)
        subprocess.run(["mkfs.ext4", "-q", str(img)], check=True)
        _mount(mounted, "-o", "loop", str(img), target=root / "loop")
        _mount(mounted, "--bind", str(root / "loop"), target=root / "data")
        fuse = shutil.which("bindfs") and os.path.exists("/dev/fuse")
        if fuse:
            subprocess.run(["bindfs", str(base / "fuse-src"), str(root / "fuse")], check=True)
            mounted.append(str(root / "fuse"))
        yield base, root, bool(fuse)
    finally:
        for m in reversed(mounted):
            if subprocess.run(["umount", m], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


WRITES = ("echo kept > f; touch {r}/sys/x; touch {r}/sys/fs/cgroup/unified/y; "
          "echo l > {r}/loop/l; cat {r}/data/l; touch {r}/ro/z; echo fz > {r}/fuse/new; "
          "echo b > {r}/bind/b; echo done")


def test_a_run_goes_on_and_says_where_it_was_held_while_a_chroot_tree_is_mounted(chroot_tree,
                                                                                    tmp_path):
    from caper import run
    base, root, fuse = chroot_tree
    ws = tmp_path / "ws"
    ws.mkdir()
    out = run(WRITES.format(r=root), cwd=ws, approver="allow", state_dir=str(tmp_path / "state"))
    assert out.committed, out.reason
    assert out.stdout.text() == b"l\ndone\n"          # one filesystem at two places: one file
    assert (ws / "f").read_text() == "kept\n"
    assert (root / "data" / "l").read_text() == "l\n" and (base / "bound" / "b").read_text() == "b\n"
    # sys (a stand-in), the cgroup mount below it, the FUSE mount: writable on the host
    held = [u for u in out.report.uncertain if u.startswith(WRITES_HELD)]
    assert held == [f"{WRITES_HELD}: {3 if fuse else 2}"], out.report.uncertain
    assert not (root / "sys" / "x").exists() and not (root / "ro" / "z").exists()
    if fuse:
        assert not (root / "fuse" / "new").exists()
    # The report names the command as the writer of the file it wrote through the second view.
    assert "changes-without-a-traced-cause" not in " ".join(out.report.uncertain)


def test_a_rootless_run_goes_on_while_a_chroot_tree_is_mounted(chroot_tree):
    need_rootless_venv()
    base, root, fuse = chroot_tree
    ws, state = Path(tempfile.mkdtemp(prefix="caper-hm-ws-")), tempfile.mkdtemp(prefix="caper-hm-st-")
    try:
        for p in (ws, state):
            os.chown(p, NOBODY, NOBODY)
        out = run_as_nobody(ws, WRITES.format(r=root), "allow", state)
        assert out["committed"], out["reason"]
        assert (ws / "f").read_text() == "kept\n" and out["stdout"].endswith("done\n")
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_an_overlay_the_kernel_refuses_becomes_a_read_only_bind(tmp_path):
    """The native core's fallback (struct caper_mount.or_else): the layer's
    overlay fails, its read-only bind stands in, the run goes on; and a path
    gone since the plan (a busy /tmp) leaves its empty stand-in, read-only."""
    from caper.view.overlay import Mount, _MountPlanner
    from caper.sandbox.trace import trace
    src, target, gone = tmp_path / "src", tmp_path / "target", tmp_path / "gone-target"
    for d in (src, target, gone, tmp_path / "u", tmp_path / "w"):
        d.mkdir()
    (src / "f").write_text("from the host\n")
    plan = _MountPlanner(str(tmp_path), "", False, set())
    fallback = plan._read_only_bind(str(src), str(target))
    refused = f"lowerdir={tmp_path}/missing,upperdir={tmp_path}/u,workdir={tmp_path}/w"
    mounts = [Mount("overlay", str(target), "overlay", refused, 0, len(fallback)), *fallback,
              *plan._read_only_bind(str(tmp_path / "vanished"), str(gone))]
    events, r = trace(f"cat {target}/f; touch {target}/g {gone}/g 2>&1; ls -A {gone}",
                      mounts=mounts, timeout=60).run()
    out = r.stdout.text()
    assert r.end.name == "EXITED" and out.startswith(b"from the host\n"), r
    assert out.count(b"Read-only file system") == 2
    assert not (src / "g").exists() and not (gone / "g").exists()


def test_a_planned_mount_whose_host_path_went_away_is_skipped(tmp_path):
    """Between the plan and the set-up another program may remove a directory
    the plan binds or overlays (a busy host's /tmp): nothing is there to
    hold, and the run goes on. Any other failure of a mount still fails it."""
    from caper.errors import SetupError
    from caper.sandbox.events import End
    from caper.sandbox.trace import Mount, trace
    from caper.view.overlay import MS_BIND, MS_RDONLY, MS_REMOUNT
    gone = str(tmp_path / "gone")          # planned, then removed: never made here
    plan = [Mount(gone, gone, None, None, MS_BIND),
            Mount(None, gone, None, None, MS_BIND | MS_REMOUNT | MS_RDONLY)]
    events, r = trace(["true"], mounts=plan, timeout=30).run()
    assert r.end == End.EXITED and r.exit_code == 0
    here = tmp_path / "here"
    here.mkdir()
    with pytest.raises(SetupError, match="no-such-filesystem"):
        trace(["true"], mounts=[Mount("none", str(here), "no-such-filesystem", None, 0)],
              timeout=30).run()
