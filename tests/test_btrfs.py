"""caper.view.btrfs on a real btrfs: a loop-mounted image made once per session.

Needs root (mount, snapshot ioctls, tree search), the kernel's btrfs,
mkfs.btrfs and the btrfsutil module; skipped with the reason otherwise.
"""
from __future__ import annotations

import errno
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

import caper.view.btrfs as B
from caper.view.btrfs import BtrfsConflict, BtrfsError, BtrfsSnapshot, is_subvolume, recover_btrfs
from caper.errors import CaperError
from caper.view.overlay import settle
from caper.fs.syscalls import RENAME_EXCHANGE, renameat2
from helpers.crash import kill_sweep, killed_at
from helpers.rootless import NOBODY, need_rootless_venv, run_as_nobody
from helpers.trees import tree
from helpers.btrfs import MKFS_BTRFS, why_not_btrfs


pytestmark = pytest.mark.skipif(why_not_btrfs() is not None, reason=why_not_btrfs() or "")


# Module scope: the loop mount must be gone before other modules run, because
# an unprivileged caper cannot overlay a directory with a mount below it (the
# rootless tests write to /tmp, where this mount lives).
@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    base = tmp_path_factory.mktemp("btrfs")
    img, mnt = base / "img", base / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(300 << 20)
    subprocess.run([MKFS_BTRFS, "-q", str(img)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot loop-mount a btrfs image: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        settle()        # a sandbox's init may still be exiting, holding the mount
        r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"umount {mnt}: {r.stderr.strip()}; detaching it lazily")
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        shutil.rmtree(base, ignore_errors=True)


FILES = {"a": "alpha\n", "b": "beta\n", "d/c": "c\n", "d/e/x": "x\n", "k/r": "r\n", "big": "y" * 70000}


def _fill(root: Path, files=FILES) -> None:
    for rel, body in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
        os.utime(p, ns=(10**18, 10**18))     # fixed: every reset builds the same state
    os.symlink("a", root / "l")
    os.link(root / "a", root / "hl")


def _subvol(path: Path) -> None:
    B.btrfsutil.create_subvolume(str(path))


def _delete_tree(path: Path) -> None:
    """Delete a subvolume (or directory) and any snapshots of ours beside it."""
    if B.is_subvolume(str(path)):
        B.btrfsutil.delete_subvolume(str(path), recursive=True)
    elif path.exists():
        shutil.rmtree(path)


class Env:
    def __init__(self, fs: Path, name: str):
        self.parent = fs / name
        self.parent.mkdir()
        self.ws = self.parent / "ws"
        self.state = fs / (name + "-state")
        self.state.mkdir()
        self.reset()

    def reset(self) -> None:
        for p in self.parent.iterdir():
            _delete_tree(p)
        shutil.rmtree(self.state / "btrfs", ignore_errors=True)
        _subvol(self.ws)
        _fill(self.ws)

    def siblings(self) -> list[str]:
        return sorted(os.listdir(self.parent))

    def close(self) -> None:
        for p in self.parent.iterdir():
            _delete_tree(p)


@pytest.fixture
def env(fs, request):
    e = Env(fs, request.node.name.replace("[", "_").replace("]", ""))
    yield e
    e.close()


def state(root: Path) -> dict:
    """Everything a commit must carry: type, mode, owner, bytes, link target, xattrs, mtime."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            x = {n: os.getxattr(p, n, follow_symlinks=False) for n in os.listxattr(p, follow_symlinks=False)}
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", st.st_mode, st.st_uid, st.st_gid, x)
            else:
                out[rel] = ("file", st.st_mode, st.st_uid, st.st_gid, x, st.st_mtime_ns,
                            Path(p).read_bytes())
    return out


def brute_diff(ws: Path, snap: Path) -> list[str]:
    a, b = state(ws), state(snap)
    return sorted(str(ws / r) for r in set(a) | set(b) if a.get(r) != b.get(r))


def mutate(root: Path) -> None:
    (root / "a").write_text("ALPHA\n")            # modified (hl shares it)
    (root / "b").unlink()                         # deleted
    (root / "new").write_text("new\n")            # created
    os.rename(root / "d", root / "d2")            # renamed directory
    os.chmod(root / "k", 0o700)                   # directory mode
    (root / "k" / "r").read_text()                # read only: not a change
    os.setxattr(root / "k" / "r", "user.t", b"1")  # xattr
    with open(root / "big", "r+b") as f:           # in-place write, same size
        f.seek(5000)
        f.write(b"Z")
    os.symlink("b", root / "l2")
    os.unlink(root / "l")
    os.symlink("new", root / "l")                 # symlink retargeted
    for rel in ("a", "new", "big"):               # fixed mtimes: every run has the same post-state
        os.utime(root / rel, ns=(2 * 10**18, 2 * 10**18))


# --- is_subvolume ----------------------------------------------------------------------------

def test_is_subvolume(env, fs, tmp_path):
    assert is_subvolume(str(env.ws))
    assert is_subvolume(str(fs))                       # the top-level subvolume
    assert not is_subvolume(str(env.ws / "d"))         # a plain directory inside btrfs
    assert not is_subvolume(str(env.ws / "a"))
    assert not is_subvolume(str(tmp_path))             # another filesystem
    assert not is_subvolume("/proc")
    assert not is_subvolume(str(tmp_path / "missing"))


def test_errors_are_caper_errors():
    assert issubclass(BtrfsError, CaperError) and issubclass(BtrfsConflict, BtrfsError)


# --- create / changed_paths / discard / commit --------------------------------------------------------

def test_snapshot_is_isolated_and_discard_restores(env):
    pre = state(env.ws)
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    sp = Path(snap.path)
    # in a directory of its own beside the workspace, closed to every other
    # user: what the run writes there (a setuid copy of a shell, a copy of a
    # root-only file) is not the host's while the run lasts (adv14a 03)
    assert sp.parent.parent == env.ws.parent and sp.parent.name.startswith(".caper-snap-")
    assert os.stat(sp.parent).st_mode & 0o777 == 0o700 and os.stat(sp.parent).st_uid == os.getuid()
    assert os.stat(sp).st_dev != os.stat(env.ws).st_dev or is_subvolume(str(sp))
    assert state(sp) == pre and snap.changed_paths() == []
    mutate(sp)
    assert state(env.ws) == pre                        # writes in the snapshot do not reach it
    snap.discard()
    assert state(env.ws) == pre and env.siblings() == ["ws"]
    assert os.listdir(env.state / "btrfs") == []
    with pytest.raises(BtrfsError):
        snap.commit()


def test_changed_paths(env):
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    mutate(Path(snap.path))
    got = snap.changed_paths()
    w = str(env.ws)
    expected = {f"{w}/{r}" for r in ["a", "hl", "b", "new", "d", "d/c", "d/e", "d/e/x", "d2", "d2/c", "d2/e",
                                     "d2/e/x", "k", "k/r", "big", "l", "l2"]}
    assert set(got) == expected
    assert got == brute_diff(env.ws, Path(snap.path))
    snap.discard()


def test_a_deleted_directory_is_one_change_counting_what_it_held(env):
    """As the overlay's plan reports it: the report then looks at one entry,
    not at every file (100 deleted files took the report 12 ms)."""
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    try:
        sp = Path(snap.path)
        shutil.rmtree(sp / "d")                     # d/c, d/e, d/e/x
        (sp / "k" / "r").unlink()                   # a file below a directory that stays
        got = {(os.path.relpath(c.path, env.ws), c.kind, c.ftype, c.entries) for c in snap.changes()}
        assert got == {("d", "deleted", "dir", 3), ("k/r", "deleted", "file", 0)}
    finally:
        snap.discard()


def test_changed_paths_random(env):
    """Random operation scripts: changed_paths equals a brute-force tree comparison."""
    rng = random.Random(7)
    for _round in range(int(os.environ.get("BTRFS_ROUNDS", "6"))):
        env.reset()
        snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
        root = Path(snap.path)
        for _ in range(rng.randint(1, 12)):
            entries = sorted(p for p in root.rglob("*"))
            p = rng.choice(entries) if entries else root / "x"
            op = rng.choice(["write", "rm", "mkdir", "mv", "chmod", "touch", "read", "link"])
            try:
                if op == "write" and not p.is_dir():
                    p.write_text(rng.choice(["", "q", "qq" * 3000]))
                elif op == "rm":
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
                elif op == "mkdir":
                    (root / f"n{rng.randint(0, 99)}").mkdir()
                elif op == "mv":
                    os.rename(p, root / f"m{rng.randint(0, 99)}")
                elif op == "chmod":
                    os.chmod(p, 0o700, follow_symlinks=False)
                elif op == "touch" and not p.is_symlink():
                    os.utime(p, (1, 1))
                elif op == "read" and p.is_file():
                    p.read_bytes()
                elif op == "link" and p.is_file() and not p.is_symlink():
                    os.link(p, root / f"h{rng.randint(0, 99)}")
            except (OSError, NotImplementedError):
                pass
        assert snap.changed_paths() == brute_diff(env.ws, root), f"round {_round}"
        snap.discard()


def test_commit_shows_new_state_and_old_is_gone(env):
    old_id = B.btrfsutil.subvolume_id(str(env.ws))
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    mutate(Path(snap.path))
    post = state(Path(snap.path))
    snap_id = B.btrfsutil.subvolume_id(snap.path)
    snap.commit()
    assert state(env.ws) == post
    assert B.btrfsutil.subvolume_id(str(env.ws)) == snap_id
    assert env.siblings() == ["ws"]
    listed = [i for _p, i in B.btrfsutil.SubvolumeIterator(str(env.parent.parent), top=5)]
    assert old_id not in listed
    assert os.listdir(env.state / "btrfs") == [] and recover_btrfs(str(env.state)) == []
    # and the committed workspace can be snapshotted again
    again = BtrfsSnapshot.create(str(env.ws), str(env.state))
    assert again.changed_paths() == []
    again.discard()


@pytest.mark.parametrize("exchanged", [False, True], ids=["before-the-exchange", "after-it"])
def test_a_prepared_record_of_an_earlier_version_is_recovered_by_uuid(env, exchanged):
    """Earlier versions wrote a 'prepared' record before the exchange; this
    one writes none and tells by the UUID at the workspace path. A 'prepared'
    record left by a dead earlier caper still ends in the pre-state where the
    exchange had not happened and in the post-state where it had."""
    pre = state(env.ws)
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    mutate(Path(snap.path))
    post = state(Path(snap.path))
    snap._journal.write(snap._record("prepared"))
    if exchanged:
        parent = os.open(env.parent, os.O_RDONLY | os.O_DIRECTORY)
        holder = os.open(os.path.dirname(snap.path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            renameat2(holder, os.path.basename(snap.path), "ws", RENAME_EXCHANGE, parent)
        finally:
            os.close(parent)
            os.close(holder)
    snap._journal.unlock()              # its owner is gone
    done = recover_btrfs(str(env.state))
    assert len(done) == 1 and ("commit finished" if exchanged else "rolled back") in done[0]
    assert state(env.ws) == (post if exchanged else pre)
    assert env.siblings() == ["ws"] and os.listdir(env.state / "btrfs") == []


def test_conflict_leaves_both_intact(env):
    time.sleep(0.05)    # the files' ctime a few clock ticks before the snapshot's: else
    #                     the host's reads below (atime) would conservatively conflict too
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    mutate(Path(snap.path))
    post = state(Path(snap.path))
    (env.ws / "d" / "c").write_text("host edit\n")
    pre = state(env.ws)
    with pytest.raises(BtrfsConflict) as ei:
        snap.commit()
    assert ei.value.paths == [str(env.ws / "d" / "c")]
    assert "d/c" in str(ei.value)
    assert state(env.ws) == pre and state(Path(snap.path)) == post
    snap.discard()
    assert state(env.ws) == pre and env.siblings() == ["ws"]


def test_host_reads_are_not_a_conflict(env):
    for n in ("a", "b"):        # atime before mtime: the next read updates atime (relatime)
        os.utime(env.ws / n, (0, os.stat(env.ws / n).st_mtime))
    time.sleep(0.05)            # their ctime a few clock ticks before the snapshot's
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    (Path(snap.path) / "a").write_text("A\n")
    for n in ("a", "b"):        # host reads: atime-only updates, "a" on both sides
        (env.ws / n).read_bytes()
        assert os.stat(env.ws / n).st_atime > 0
    snap.commit()
    assert (env.ws / "a").read_text() == "A\n"


def test_nested_subvolume_refused(env):
    _subvol(env.ws / "inner")
    with pytest.raises(BtrfsError) as ei:
        BtrfsSnapshot.create(str(env.ws), str(env.state))
    assert ei.value.step == "nested" and "inner" in str(ei.value)
    assert env.siblings() == ["ws"]


def test_a_subvolume_the_run_made_in_its_snapshot_goes_with_the_discard(env):
    """adv3a 21: a nested subvolume made inside the snapshot used to make the
    delete fail (ENOTEMPTY), leaving the snapshot and the run's writes beside
    the workspace for good."""
    pre = state(env.ws)
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    _subvol(Path(snap.path) / "nested")
    (Path(snap.path) / "nested" / "planted.txt").write_text("payload of a blocked run\n")
    _subvol(Path(snap.path) / "nested" / "deeper")
    snap.discard()
    assert env.siblings() == ["ws"] and state(env.ws) == pre
    assert os.listdir(env.state / "btrfs") == []


def test_upkeep_collects_a_dead_runs_snapshot_holding_a_nested_subvolume(env):
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    _subvol(Path(snap.path) / "nested")
    snap._journal.unlock()              # its owner died before discarding it
    assert recover_btrfs(str(env.state)) and env.siblings() == ["ws"]
    assert os.listdir(env.state / "btrfs") == []


def test_a_failed_snapshot_leaves_no_record_and_names_the_call(env):
    """The snapshot cannot be made (an immutable parent directory: its own
    directory there is the first thing made): the error names the call, and
    the record written before it is gone."""
    subprocess.run(["chattr", "+i", str(env.parent)], check=True)
    try:
        with pytest.raises(BtrfsError) as ei:
            BtrfsSnapshot.create(str(env.ws), str(env.state))
    finally:
        subprocess.run(["chattr", "-i", str(env.parent)], check=True)
    assert ei.value.step == "mkdir" and ei.value.errno == 1   # EPERM
    assert env.siblings() == ["ws"] and os.listdir(env.state / "btrfs") == []
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))         # and the next one works
    snap.discard()


def test_refuses_non_subvolume_and_mount_point(env):
    with pytest.raises(BtrfsError, match="not the root of a btrfs subvolume"):
        BtrfsSnapshot.create(str(env.ws / "d"), str(env.state))
    subprocess.run(["mount", "--bind", str(env.ws), str(env.ws)], check=True)
    try:
        with pytest.raises(BtrfsError) as ei:
            BtrfsSnapshot.create(str(env.ws), str(env.state))
        assert ei.value.errno == 16    # EBUSY
    finally:
        subprocess.run(["umount", str(env.ws)], check=True)


# --- kill -9 at every step ---------------------------------------------------------------------

def test_kill_at_every_step(env):
    pre = state(env.ws)

    def run():      # the whole life: create, the command's writes, commit
        snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
        mutate(Path(snap.path))
        snap.commit()

    # the post-state, from an uninterrupted run
    assert not killed_at(0, run)
    post = state(env.ws)
    assert post != pre

    def check(label: str) -> str:
        s = state(env.ws)
        assert env.siblings() == ["ws"], label
        assert not os.path.exists(env.state / "btrfs") or os.listdir(env.state / "btrfs") == [], label
        assert s in (pre, post), label
        return "pre" if s == pre else "post"

    # every commit kill point, and recovery killed at each of its steps for every one
    outcomes, nested = kill_sweep(run, lambda: recover_btrfs(str(env.state)), env.reset, check)
    first_post = outcomes.index("post")
    assert all(o == "pre" for o in outcomes[:first_post]) and all(o == "post" for o in outcomes[first_post:])
    assert first_post >= 4 and len(outcomes) - first_post >= 3, outcomes
    print(f"\nbtrfs kill test: {len(outcomes)} steps, outcomes {outcomes}, {nested} nested recoveries")
    assert nested >= len(outcomes)


# --- cost ------------------------------------------------------------------------------------------

def test_cost_10k_files(env):
    shutil.rmtree(env.ws / "d")
    for i in range(100):
        d = env.ws / f"t{i:02d}"
        d.mkdir()
        for j in range(100):
            (d / f"f{j:02d}").write_text(f"{i} {j}\n")
    B.btrfsutil.sync(str(env.ws))
    discard, commit, changed = [], [], []
    for _ in range(15):
        t0 = time.perf_counter()
        s = BtrfsSnapshot.create(str(env.ws), str(env.state))
        s.discard()
        discard.append(time.perf_counter() - t0)
    for i in range(15):
        t0 = time.perf_counter()
        s = BtrfsSnapshot.create(str(env.ws), str(env.state))
        (Path(s.path) / f"t{i:02d}" / "f00").write_text("changed\n")
        t1 = time.perf_counter()
        assert s.changed_paths() == [str(env.ws / f"t{i:02d}" / "f00")]
        t2 = time.perf_counter()
        s.commit()
        commit.append(t1 - t0 + time.perf_counter() - t2)
        changed.append(t2 - t1)
    med = {k: round(statistics.median(v) * 1000, 2) for k, v in
           (("create+discard", discard), ("create+commit", commit), ("changed_paths(1 change)", changed))}
    print(f"\nbtrfs 10k files, median ms: {med}")
    assert len(list((env.ws).rglob("*"))) >= 10000


# ---- caper run with the btrfs backend ----------------------------------------------------

def test_caper_run_on_a_subvolume_uses_btrfs_and_commits_or_rolls_back(env, tmp_path):
    import caper

    outside = tmp_path / "outside"
    outside.mkdir()
    before = tree(env.ws)
    cmd = f"echo new > a; rm -r d; mkdir n; echo 1 > n/f; echo out > {outside}/o; echo done"
    out = caper.run(cmd, cwd=str(env.ws), approver="block", state_dir=str(env.state))
    assert out.report.backend == "btrfs" and not out.committed
    assert out.stdout.text() == b"done\n"
    assert tree(env.ws) == before and not (outside / "o").exists()
    changed = {c.path: c.op for c in out.report.changes}   # workspace paths are relative
    assert {"a": "modified", "n/f": "created", "d": "deleted", str(outside / "o"): "created"}.items() \
        <= changed.items()
    settle()                                        # the snapshot goes after the answer
    assert env.siblings() == ["ws"] and os.listdir(env.state / "btrfs") == []

    out = caper.run(cmd, cwd=str(env.ws), approver="allow", state_dir=str(env.state))
    assert out.committed, out.reason
    assert (env.ws / "a").read_text() == "new\n" and not (env.ws / "d").exists()
    assert (env.ws / "n" / "f").read_text() == "1\n" and (outside / "o").read_text() == "out\n"
    assert B.is_subvolume(str(env.ws))
    settle()                                        # and so does the old workspace
    assert env.siblings() == ["ws"] and os.listdir(env.state / "btrfs") == []

    out = caper.run("true", cwd=str(env.ws), approver="block", backend="overlay",
                    state_dir=str(env.state))
    assert out.report.backend == "overlay"


# What the overlay tests below run: every kind of change, in the workspace.
SHELL_CHANGES = ("echo agent > b; rm -r d; mkdir n; echo 1 > n/f; mv k k2; chmod 600 k2/r; "
                 "ln -s n l3; echo done")


def _native(env: Env, cmd: str) -> dict:
    """The tree cmd leaves when run plainly in a fresh copy of the workspace."""
    subprocess.run(["sh", "-c", cmd], cwd=env.ws, check=True, capture_output=True)
    after = tree(env.ws)
    env.reset()
    return after


def test_overlay_backend_gives_a_subvolume_workspace_a_layer_of_its_own(env):
    """A workspace that is a subvolume but not a mount point (rootless caper
    on btrfs, or --backend overlay): the overlay gets a layer at the subvolume
    root, as for a mount, so its changes commit (before, every write there
    was refused: one commit cannot cross subvolumes)."""
    import caper

    want, before = _native(env, SHELL_CHANGES), tree(env.ws)
    out = caper.run(SHELL_CHANGES, cwd=str(env.ws), approver="block", backend="overlay",
                    state_dir=str(env.state))
    assert out.report.backend == "overlay" and out.stdout.text() == b"done\n"
    assert tree(env.ws) == before
    out = caper.run(SHELL_CHANGES, cwd=str(env.ws), approver="allow", backend="overlay",
                    state_dir=str(env.state))
    assert out.committed, out.reason
    assert tree(env.ws) == want and B.is_subvolume(str(env.ws))


def test_overlay_backend_refuses_a_commit_across_a_nested_subvolume_and_says_why(env):
    """One layer per subvolume root that holds the workspace, not for others
    below it: a write in a nested subvolume is refused as such (it was called
    "a mount point"), and nothing changes."""
    import caper

    _subvol(env.ws / "inner")
    (env.ws / "inner" / "f").write_text("f\n")
    before = tree(env.ws)
    out = caper.run("echo agent > inner/f", cwd=str(env.ws), approver="allow", backend="overlay",
                    state_dir=str(env.state))
    assert not out.committed and "a btrfs subvolume on the host" in out.reason
    assert str(env.ws / "inner") in out.reason and "mount point" not in out.reason
    assert tree(env.ws) == before


def test_rootless_caper_commits_in_a_subvolume_workspace(env):
    """The same as uid 65534 (user namespace, userxattr overlays): auto picks
    the overlay, which covers the subvolume with a layer of its own."""
    need_rootless_venv()
    cmd = "echo agent > b; rm -r d; mkdir n; echo 1 > n/f; echo done"
    want = _native(env, cmd)
    for path in [env.parent, env.state, *env.ws.rglob("*"), env.ws]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    before = tree(env.ws)

    def run(approver: str) -> dict:
        return run_as_nobody(env.ws, cmd, approver, env.state / "nobody", env.state)

    # pytest's own directories above the image's mount are root's (0700)
    opened = [(d, d.stat().st_mode) for d in env.parent.parents
              if d.stat().st_mode & 0o001 == 0]
    for d, mode in opened:
        d.chmod(mode | 0o001)
    try:
        out = run("block")
        assert out["backend"] == "overlay" and not out["committed"] and tree(env.ws) == before
        out = run("allow")
        assert out["committed"], out["reason"]
        assert tree(env.ws) == want
    finally:
        for d, mode in opened:
            d.chmod(mode)


def test_backend_btrfs_refuses_a_plain_directory(tmp_path):
    import caper
    from caper.errors import ConfigError

    with pytest.raises(ConfigError, match="not a btrfs subvolume"):
        caper.run("true", cwd=str(tmp_path), workspace=str(tmp_path), backend="btrfs",
                  state_dir=str(tmp_path / "state"))


def test_a_conflicting_runs_snapshot_is_kept_for_the_user_then_expires(env):
    """caper run keeps the run's version (the snapshot) when the workspace
    changed meanwhile; later runs leave it alone until it is KEPT_S old.
    (Before, the next run's recovery deleted it as a dead run's snapshot.)"""
    import threading

    import caper
    from caper.state import KEPT_S

    def edit_meanwhile():
        time.sleep(0.3)
        (env.ws / "a").write_text("user edit\n")

    t = threading.Thread(target=edit_meanwhile)
    t.start()
    out = caper.run("sleep 0.8; echo agent > a", cwd=str(env.ws), approver="allow",
                    state_dir=str(env.state))
    t.join()
    assert out.report.backend == "btrfs" and not out.committed
    kept = out.kept_upper
    assert kept and f"kept as the snapshot {kept}" in out.reason
    assert (Path(kept) / "a").read_text() == "agent\n" and (env.ws / "a").read_text() == "user edit\n"
    assert caper.run("true", cwd=str(env.ws), approver="allow", state_dir=str(env.state)).committed
    settle()
    assert Path(kept, "a").exists()                       # young: left alone
    [record] = list((env.state / "btrfs").glob("*.json"))
    journal = B._Journal(str(env.state), record.stem)     # rewritten under its MAC
    doc = journal.read()
    doc["kept_at"] -= KEPT_S + 60
    journal.write(doc)
    assert caper.run("true", cwd=str(env.ws), approver="allow", state_dir=str(env.state)).committed
    settle()
    assert not os.path.exists(kept) and env.siblings() == ["ws"]


def test_a_btrfs_workspace_does_not_hold_the_command_for_the_coarse_clock(env, tmp_path):
    """caper's state is elsewhere (ext4 here): the kernel's timestamp floor is
    shown on btrfs in the directory where caper makes its snapshot, so the
    command is not held back (before: ~5 ms of every btrfs run)."""
    from caper.commit import ctimes
    from caper.view.overlay import OverlaySnapshot
    if tuple(int(x) for x in os.uname().release.split(".")[:2]) < (6, 13):
        pytest.skip("the kernel predates multigrain timestamps")
    state = tmp_path / "state"
    state.mkdir()
    ctimes._floor_shown.pop("btrfs", None)
    bsnap = BtrfsSnapshot.create(str(env.ws), str(state))
    try:
        snap = OverlaySnapshot.create(str(state), userxattr=False,
                                      binds=[(bsnap.path, str(env.ws))])
        try:
            assert ctimes._floor_shown.get("btrfs") is True and snap.not_before_ns == 0
        finally:
            snap.discard()
    finally:
        bsnap.discard()
    assert env.siblings() == ["ws"]           # the probe file is gone too


SUBVOLUME_IOCTLS = """
import fcntl, os, struct, sys
def vol_args(name):
    return struct.pack("q", 0) + name.encode().ljust(4088, b"\\0")
fd = os.open(".", os.O_RDONLY)
for what, req, arg in (("create", 0x5000940e, vol_args("nested")),           # SUBVOL_CREATE
                       ("setflags", 0x4008941a, struct.pack("Q", 2)),         # SUBVOL_SETFLAGS RDONLY
                       ("snapshot", 0x50009401, struct.pack("q", fd) + vol_args("snap")[8:])):
    try:
        fcntl.ioctl(fd, req, bytearray(arg))
        print(what, "ok")
    except OSError as e:
        print(what, e.errno)
"""


def test_a_run_can_neither_make_flag_nor_snapshot_subvolumes_but_can_clone(env):
    """adv10a 01/02: BTRFS_IOC_SUBVOL_CREATE then SUBVOL_SETFLAGS made the
    run's snapshot a read-only subvolume holding another: the discard failed
    with EROFS and the snapshot, with all the blocked run wrote, stayed
    beside the workspace; a committed one left the project read-only. chattr
    +i made a file immutable unseen. btrfs's ioctls are refused but for the
    clones `cp --reflink` makes, and inode flags cannot be set."""
    import caper

    (env.ws / "big").write_bytes(b"x" * 65536)
    before = tree(env.ws)
    cmd = (f"{sys.executable} -c '{SUBVOLUME_IOCTLS}'; chattr +i big; echo chattr=$?; "
           "cp --reflink=always big clone && echo cloned")
    out = caper.run(cmd, cwd=str(env.ws), approver="block", state_dir=str(env.state))
    assert out.report.backend == "btrfs"
    assert out.stdout.text().decode().split("\n")[:5] == [
        f"create {errno.EOPNOTSUPP}", f"setflags {errno.EOPNOTSUPP}",
        f"snapshot {errno.EOPNOTSUPP}", "chattr=1", "cloned"], out.stderr.text().decode()
    settle()
    assert env.siblings() == ["ws"] and os.listdir(env.state / "btrfs") == []
    assert tree(env.ws) == before


def test_a_read_only_snapshot_holding_a_subvolume_goes_with_the_discard(env):
    """Should a snapshot be read-only at its discard anyway (a kernel's new
    ioctl), it is made writable and deleted, not left on the host."""
    pre = state(env.ws)
    snap = BtrfsSnapshot.create(str(env.ws), str(env.state))
    _subvol(Path(snap.path) / "nested")
    import btrfsutil
    btrfsutil.set_subvolume_read_only(str(Path(snap.path) / "nested"), True)
    btrfsutil.set_subvolume_read_only(snap.path, True)
    snap.discard()
    assert env.siblings() == ["ws"] and state(env.ws) == pre
    assert os.listdir(env.state / "btrfs") == []
