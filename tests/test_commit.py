"""Commit engine: overlay upper dirs made by the real kernel, committed into a real tree.

Each test builds a host tree, runs shell commands inside a real overlayfs
mount over it (in a forked child with a private mount namespace), snapshots
the merged view the command saw, commits the upper dir and checks that the
host tree now equals that merged view: types, modes, owners, contents,
symlink targets, xattrs and mtimes.  No mocks; the crash tests kill the
committing process for real (SIGKILL) at every filesystem step.

Each test names the cases it covers as `# CASE(<changed>, <host>)`, matching the
labels in caper/commit/; scripts/check_commit_cases.py checks the match.
"""
from __future__ import annotations

import ctypes
import errno
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caper.commit import ctimes
from caper.commit import fsops
from caper.commit import journal
from caper.fs import mountinfo
from caper.changes import Change, Layer
from caper.commit.engine import commit
from caper.commit.plan import plan_changes
from caper.commit.recover import TRASH_DIR, recover
from caper.commit.stage import STAGE_PREFIX, journal_at
from caper.errors import CaperError, CommitConflict, CommitError, CommitIncomplete
from helpers.crash import kill_sweep, killed_at
from helpers.ctimes import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")

# --- mount namespaces and overlays ----------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_BIND = 0x1000


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def mount(src, target, fstype, flags=0, data=None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount({target})")


def umount(target) -> None:
    _check(_libc.umount2(os.fsencode(str(target)), 0), f"umount({target})")


def in_mount_ns(fn, *args):
    """fn(*args) in a forked child with a private mount namespace; its result or its error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # child: never returns into pytest
        try:
            os.close(r)
            try:
                _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
                mount(None, "/", None, MS_REC | MS_PRIVATE)
                res = ("ok", fn(*args))
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                res = ("err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            with os.fdopen(w, "wb") as f:
                f.write(pickle.dumps(res))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, val = pickle.loads(data)
    if kind == "err":
        raise AssertionError("in the mount namespace:\n" + val)
    return val


# What caper mounts as root (caper.view.overlay): directory renames and hard links native.
NATIVE = "redirect_dir=on,index=on,metacopy=off"


def overlay(lower, upper, work, merged, action, userxattr=False, options=""):
    """Mount a real overlay over `lower`, run `action` (sh script or callable) in it,
    and return the snapshot of the merged view."""
    def inner():
        opts = f"lowerdir={lower},upperdir={upper},workdir={work}" + (",userxattr" if userxattr else "")
        opts += "," + options if options else ""
        mount("overlay", str(merged), "overlay", 0, opts)
        try:
            if isinstance(action, str):
                p = subprocess.run(["sh", "-ec", action], cwd=merged, capture_output=True, text=True)
                if p.returncode:
                    raise RuntimeError(f"script failed ({p.returncode}): {p.stderr}")
            else:
                action(str(merged))
            return snapshot(merged)
        finally:
            umount(merged)
    return in_mount_ns(inner)


# --- trees ----------------------------------------------------------------------------------------------

class Link(str):
    """A symlink in a tree spec."""


DIR = object()
FIFO = object()


def make_tree(root, spec: dict) -> None:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for rel, v in spec.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if v is DIR:
            p.mkdir(exist_ok=True)
        elif v is FIFO:
            os.mkfifo(p)
        elif isinstance(v, Link):
            os.symlink(str(v), p)
        else:
            p.write_bytes(v.encode() if isinstance(v, str) else v)


def _xattrs(p: str) -> tuple:
    try:
        names = os.listxattr(p, follow_symlinks=False)
    except OSError:
        return ()
    return tuple(sorted((n, os.getxattr(p, n, follow_symlinks=False)) for n in names
                        if ".overlay." not in n))


def snapshot(root, times=True) -> dict:
    """path -> (type, mode, uid, gid, content or target, xattrs, mtime or None)."""
    out = {}

    def walk(d: str, rel: str) -> None:
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            r = rel + name
            s = os.lstat(p)
            t = stat.S_IFMT(s.st_mode)
            if t == stat.S_IFREG:
                with open(p, "rb") as f:
                    content = f.read()
            elif t == stat.S_IFLNK:
                content = os.readlink(p)
            elif t in (stat.S_IFCHR, stat.S_IFBLK):
                content = ("dev", s.st_rdev)
            else:
                content = None
            out[r] = (t, stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid, content, _xattrs(p),
                      s.st_mtime_ns if times else None)
            if t == stat.S_IFDIR:
                walk(p, r + "/")

    walk(str(root), "")
    return out


def overlay_xattrs_in(root) -> list[str]:
    bad = []
    for d, dirs, files in os.walk(root):
        for p in [d] + [os.path.join(d, n) for n in dirs + files]:
            try:
                names = os.listxattr(p, follow_symlinks=False)
            except OSError:
                continue
            bad += [f"{p}: {n}" for n in names if ".overlay." in n]
    return bad


def leftovers(root) -> list[str]:
    return [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files
            if n.startswith(STAGE_PREFIX)]


def diff(a: dict, b: dict) -> str:
    lines = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            lines.append(f"  {k!r}:\n    {a.get(k)!r}\n    {b.get(k)!r}")
    return "\n".join(lines[:20])


class Env:
    """host tree + upper/work/merged dirs + state dir, all under tmp_path."""

    def __init__(self, base: Path, upper_base: Path | None = None):
        self.base = base
        self.host = base / "host"
        ub = upper_base or base
        self.upper, self.work = ub / "upper", ub / "work"
        self.merged = base / "merged"
        self.state = base / "state"
        for p in (self.host, self.upper, self.work, self.merged, self.state):
            p.mkdir(parents=True, exist_ok=True)
        self.since = 0
        self.seen = None

    def build(self, spec: dict) -> "Env":
        make_tree(self.host, spec)
        return self

    def run(self, action, userxattr=False, options="") -> dict:
        self.since = time.time_ns()      # fine clock: every ctime of the build is below it
        self.seen = overlay(self.host, self.upper, self.work, self.merged, action, userxattr, options)
        return self.seen

    def layer(self, userxattr=False) -> Layer:
        return Layer(str(self.host), str(self.upper), userxattr, str(self.work))

    def commit(self, userxattr=False, **kw):
        return commit([self.layer(userxattr)], state_dir=str(self.state), since_ns=self.since, **kw)

    def check_committed(self) -> None:
        now = snapshot(self.host)
        assert now == self.seen, "host tree != what the command saw:\n" + diff(now, self.seen)
        assert overlay_xattrs_in(self.host) == []
        assert leftovers(self.host) == []
        assert os.listdir(self.state / "journal") == []
        assert os.listdir(self.upper) == []           # consumed


@pytest.fixture
def env(tmp_path) -> Env:
    return Env(tmp_path)


def kinds(result) -> dict[str, tuple]:
    return {os.path.basename(c.path): (c.kind, c.ftype) for c in result.changes}


# --- the case matrix, one real overlay each ------------------------------------------------------------

def test_file_created_modified_deleted(env):
    # CASE(file, none)  CASE(file, file)  CASE(whiteout, file)
    env.build({"a": "old", "b": "gone"})
    env.run("echo new > a; echo hi > c; rm b")
    res = env.commit()
    env.check_committed()
    assert kinds(res) == {"a": ("modified", "file"), "b": ("deleted", "file"), "c": ("created", "file")}
    assert res.counts == {"modified": 1, "deleted": 1, "created": 1}
    assert res.linked == 2 and res.copied == 0


def test_chmod_chown_only_is_meta(env):
    # CASE(file, file): copy-up of the whole file for a chmod; reported as meta
    env.build({"f": "x" * 5000, "g": "y", "d/h": "z"})
    env.run("chmod 741 f; chown 1234:5678 g; chmod 700 d; touch -m -d @1000000000 d/h")
    res = env.commit()
    env.check_committed()
    by = {os.path.basename(c.path): c for c in res.changes}
    assert by["f"].kind == "meta" and "mode 0644->0741" in by["f"].detail
    assert by["g"].kind == "meta" and "owner 0:0->1234:5678" in by["g"].detail
    assert by["d"].kind == "meta" and by["d"].ftype == "dir"
    assert by["h"].kind == "meta" and by["h"].detail == "mtime"


def test_a_meta_only_change_of_a_file_keeps_its_inode_and_links(env):
    # CASE(file-meta, file): chmod/touch change the host's inode in place, as
    # natively: a hard link elsewhere follows, the inode number stays.
    env.build({"f": "x", "d/g": "y"})
    os.link(env.host / "f", env.host / "d" / "other")
    ino = os.stat(env.host / "f").st_ino
    env.run("chmod 600 f; touch -m -d @1000000000 f; chmod 400 d/g")
    res = env.commit()
    assert res.units == 0 and kinds(res) == {"f": ("meta", "file"), "g": ("meta", "file")}
    st = os.stat(env.host / "f")
    assert (st.st_ino, stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (ino, 0o600, 10**18)
    assert os.stat(env.host / "d" / "other").st_ino == ino      # still one file
    assert stat.S_IMODE(os.stat(env.host / "d" / "g").st_mode) == 0o400
    assert os.listdir(env.state / "journal") == [] and os.listdir(env.upper) == []


def test_copied_up_but_unchanged_is_skipped(env):
    # CASE(file, file): opened for writing, nothing written: copy-up, no change
    env.build({"f": "same"})
    env.run("python3 -c 'open(\"f\", \"r+\").close()'")
    assert os.path.exists(env.upper / "f")
    res = env.commit()
    env.check_committed()
    assert res.changes == [] and res.units == 0


def test_delete_dir_tree(env):
    # CASE(whiteout, dir)  CASE(whiteout, symlink)
    env.build({"d/a": "1", "d/s/b": "2", "d/s/l": Link("b"), "l": Link("d"), "keep": "k"})
    env.run("rm -rf d l")
    res = env.commit()
    env.check_committed()
    d = next(c for c in res.changes if c.path.endswith("/d"))
    assert (d.kind, d.ftype, d.entries) == ("deleted", "dir", 4)
    assert kinds(res)["l"] == ("deleted", "symlink")


def test_old_versions_go_to_the_trash_beside_the_upper_not_deleted_in_the_tree(env):
    """finish() renames what the commit replaced or deleted out of the tree,
    into the scratch (deleted there after caper answers): no hidden name is
    left in the tree, and the old data is whole in the trash."""
    env.build({"d/a": "1", "d/s/b": "2", "r": "old"})
    env.run("rm -rf d; echo new > r")
    env.commit()
    env.check_committed()
    assert not [n for n in os.listdir(env.host) if n.startswith(STAGE_PREFIX)]
    trash = env.base / TRASH_DIR
    olds = {(trash / n).read_text() if (trash / n).is_file() else
            tuple(sorted(str(p.relative_to(trash / n)) for p in (trash / n).rglob("*")))
            for n in os.listdir(trash)}
    assert olds == {"old", ("a", "s", "s/b")}


def test_an_old_version_linked_elsewhere_is_deleted_in_place(env):
    """Unlinking it later, from the trash, would change the ctime of the host
    file it shares an inode with after the commit: the next run would take
    that for an edit. So it is unlinked before commit() returns."""
    env.build({"a": "1", "d/x": "x"})
    os.link(env.host / "a", env.host / "b")
    os.link(env.host / "d/x", env.host / "y")
    env.run("echo 2 > a; rm -rf d")
    env.commit()
    assert (env.host / "b").read_text() == "1" and os.stat(env.host / "b").st_nlink == 1
    assert os.stat(env.host / "y").st_nlink == 1
    assert os.listdir(env.base / TRASH_DIR) == []


def test_opaque_dir_over_dir(env):
    # CASE(opaque, dir): rm -rf d; mkdir d -> the host's entries go, nested dirs too
    env.build({"d/a": "1", "d/s/b": "2", "d/s/c": "3", "d/t/u": "4"})
    env.run("rm -rf d; mkdir -p d/s; echo new > d/n; echo c2 > d/s/c")
    assert os.getxattr(env.upper / "d", "trusted.overlay.opaque") == b"y"
    res = env.commit()
    env.check_committed()
    assert sorted(os.listdir(env.host / "d")) == ["n", "s"]
    assert os.listdir(env.host / "d" / "s") == ["c"]
    assert {c.kind for c in res.changes} >= {"deleted", "created"}


def test_opaque_with_userxattr(env):
    # CASE(opaque, dir): rootless markers are user.overlay.*
    env.build({"d/a": "1", "d/b": "2"})
    env.run("rm -rf d; mkdir d; echo x > d/x", userxattr=True)
    assert os.getxattr(env.upper / "d", "user.overlay.opaque") == b"y"
    env.commit(userxattr=True)
    env.check_committed()
    assert os.listdir(env.host / "d") == ["x"]


def test_merged_dir_keeps_unmentioned(env):
    # CASE(dir, dir)
    env.build({f"d/{i}": str(i) for i in range(5)} | {"d/s/x": "x"})
    env.run("rm d/1; echo new > d/9; echo y > d/s/y; chmod 750 d/s")
    res = env.commit()
    env.check_committed()
    assert sorted(os.listdir(env.host / "d")) == ["0", "2", "3", "4", "9", "s"]
    assert kinds(res)["s"] == ("meta", "dir")


def test_new_tree(env):
    # CASE(dir, none)  CASE(symlink, none)  CASE(fifo, none)
    env.build({"x": "x"})
    env.run("mkdir -p n/m/o; echo 1 > n/m/f; ln -s f n/m/l; mkfifo n/p; chmod 711 n/m; "
            "ln -s ../x n/up; python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"n/sock\")'")
    res = env.commit()
    env.check_committed()
    assert stat.S_ISFIFO(os.lstat(env.host / "n/p").st_mode)
    assert stat.S_ISSOCK(os.lstat(env.host / "n/sock").st_mode)
    assert {c.kind for c in res.changes} == {"created"}
    assert len(res.changes) == 8 and res.units == 1


def test_rename_file_and_dir(env):
    # CASE(file, none)  CASE(whiteout, file)  CASE(dir, none)  CASE(whiteout, dir)
    # a lower dir cannot be renamed (redirect_dir off: EXDEV), so mv copies and deletes
    env.build({"a": "A", "d/x": "X", "d/s/y": "Y", "d/s/l": Link("y")})
    env.run("mv a b; mv d e")
    env.commit()
    env.check_committed()
    assert sorted(os.listdir(env.host)) == ["b", "e"]


def test_symlinks(env):
    # CASE(symlink, symlink)  CASE(symlink, file)  CASE(file, symlink)  CASE(symlink, none)
    env.build({"t1": "1", "t2": "2", "l": Link("t1"), "f": "f", "m": Link("t2")})
    env.run("ln -sfn t2 l; rm f; ln -s t1 f; rm m; echo real > m; ln -s /etc/passwd abs")
    res = env.commit()
    env.check_committed()
    k = kinds(res)
    assert k["l"] == ("modified", "symlink")
    assert k["f"] == ("replaced", "symlink") and k["m"] == ("replaced", "file")
    assert os.readlink(env.host / "abs") == "/etc/passwd"      # committed, never followed
    assert res.changes[0].path == str(env.host / "abs") and res.changes[0].detail == "-> /etc/passwd"


def test_type_changes(env):
    # CASE(file, dir)  CASE(symlink, dir)  CASE(opaque, file)  CASE(opaque, symlink)
    env.build({"d1/a": "1", "d1/s/b": "2", "d2/a": "a", "f": "file", "l": Link("f")})
    env.run("rm -rf d1; echo now-a-file > d1; rm -rf d2; ln -s f d2; rm f; mkdir f; echo in > f/in; "
            "rm l; mkdir l; mkdir l/sub")
    res = env.commit()
    env.check_committed()
    k = kinds(res)
    assert k["d1"] == ("replaced", "file") and k["d2"] == ("replaced", "symlink")
    assert k["f"] == ("replaced", "dir") and k["l"] == ("replaced", "dir")
    old = {os.path.basename(c.path): c.old_ftype for c in res.changes}
    assert old["d1"] == "dir" and old["l"] == "symlink"


def test_xattrs_kept_overlay_markers_never(env):
    # CASE(file, file)  CASE(dir, dir): user.* carried over, overlay.* never
    env.build({"f": "f", "d/g": "g"})

    def act(m):
        os.setxattr(os.path.join(m, "f"), "user.color", b"red")
        os.setxattr(os.path.join(m, "d"), "user.dir", b"1")
        with open(os.path.join(m, "new"), "w") as f:
            f.write("n")
        os.setxattr(os.path.join(m, "new"), "user.x", b"y")
        os.setxattr(os.path.join(m, "new"), "trusted.mine", b"t")
    env.run(act)
    assert any(".overlay." in n for n in os.listxattr(env.upper))
    env.commit()
    env.check_committed()
    assert os.getxattr(env.host / "f", "user.color") == b"red"
    assert os.getxattr(env.host / "new", "trusted.mine") == b"t"


def test_overlay_xattrs_stripped_even_escaped(env):
    # CASE(file, none): with userxattr, setting user.overlay.* through the overlay is
    # stored escaped (user.overlay.overlay.*); never copied either way
    env.build({"x": "x"})

    def act(m):
        with open(os.path.join(m, "f"), "w") as f:
            f.write("1")
        os.setxattr(os.path.join(m, "f"), "user.overlay.opaque", b"y")
        os.setxattr(os.path.join(m, "f"), "user.keep", b"k")
    overlay(env.host, env.upper, env.work, env.merged, act, userxattr=True)
    env.since = time.time_ns() - 10**9
    commit([env.layer(True)], state_dir=str(env.state), since_ns=env.since)
    assert overlay_xattrs_in(env.host) == []
    assert os.getxattr(env.host / "f", "user.keep") == b"k"


def test_hard_links_and_newline_names(env):
    # CASE(file, none)  CASE(file, file)
    env.build({"a\nb": "nl", "plain": "p"})
    env.run("printf 'x\\n' > 'a\nb'; echo h > h1; ln h1 h2; mkdir d; ln h1 d/h3; "
            "touch \"$(printf 'new\\nline')\"; touch \"$(printf 'bad\\377name')\"")
    env.commit()
    env.check_committed()
    ino = {os.lstat(env.host / n).st_ino for n in ("h1", "h2", "d/h3")}
    assert len(ino) == 1
    assert (env.host / "a\nb").read_bytes() == b"x\n"
    assert os.path.exists(os.fsencode(env.host) + b"/bad\xffname")


def test_exclude(env):
    # CASE(*, excluded)  CASE(whiteout, dir-with-excluded)
    env.build({"state/j": "journal", "w/keep/k": "k", "w/a": "a", "w/b/c": "c", "top": "t"})
    env.run("echo x > state/j; echo new > state/new; rm -rf w; echo t2 > top")
    res = env.commit(exclude=[str(env.host / "state"), str(env.host / "w/keep")])
    assert (env.host / "state/j").read_text() == "journal"
    assert not (env.host / "state/new").exists()
    assert sorted(os.listdir(env.host / "w")) == ["keep"]
    assert (env.host / "top").read_text() == "t2\n"
    assert all("/state" not in c.path and "/keep" not in c.path for c in res.changes)


def test_excluded_dir_replaced_by_file_is_refused(env):
    # CASE(*, excluded): a file replacing a directory that holds an excluded path
    env.build({"w/keep/k": "k"})
    env.run("rm -rf w; echo f > w")
    before = snapshot(env.host)
    with pytest.raises(CommitError, match="excluded"):
        env.commit(exclude=[str(env.host / "w/keep")])
    assert snapshot(env.host) == before


@pytest.mark.parametrize("action, options", [
    ("echo k > s2/tasks/key", ""),                   # CASE(*, state-dir): a write inside
    ("chmod 711 s2", ""),                            # at the directory itself
    ("rm -rf s2", ""),                               # CASE(whiteout, state-dir)
    ("rm -rf w", ""),                                # a tree holding one
    ("rm -rf s2; echo f > s2", ""),                  # replaced by a file
    ("mv s2 s3", NATIVE),                            # CASE(moved-dir, state-dir)
    ("mv s2 s3; mkdir -p s2/journal; echo j > s2/journal/j", NATIVE),
    ("mkdir s4; echo x > s4/CAPER-STATE", ""),       # a new marker
])
def test_nothing_is_committed_into_another_caper_state_directory(tmp_path, action, options):
    """A state directory caper does not know of (the same user's other
    CAPER_STATE_DIR) is known on the host by its marker: a change at or
    below it, a tree removed with it, its rename and a new marker are refused,
    and the host is left as it was."""
    env = Env(tmp_path)
    env.build({"s2/CAPER-STATE": "m", "s2/tasks/key": "k0", "w/s2/CAPER-STATE": "m", "top": "t"})
    env.run(f"{action}; echo t2 > top", options=options)
    before = snapshot(env.host)
    with pytest.raises(CommitError, match="state directory"):
        env.commit()
    assert snapshot(env.host) == before


def test_a_change_beside_another_caper_state_directory_is_committed(env):
    env.build({"s2/CAPER-STATE": "m", "s2/tasks/key": "k0", "top": "t"})
    env.run("echo t2 > top; mkdir n; echo x > n/f")
    env.commit()
    env.check_committed()


def test_plan_changes_is_read_only(env):
    env.build({"a": "1", "d/b": "2"})
    env.run("echo 2 > a; rm -rf d; mkdir n")
    before, upper_before = snapshot(env.host), snapshot(env.upper)
    changes = plan_changes([env.layer()])
    assert {(os.path.basename(c.path), c.kind) for c in changes} == {("a", "modified"), ("d", "deleted"),
                                                                      ("n", "created")}
    assert all(isinstance(c, Change) for c in changes)
    assert snapshot(env.host) == before and snapshot(env.upper) == upper_before


# --- refusals: conflicts, symlinks, mounts, unsupported markers ------------------------------------------

def test_conflict_names_every_path_and_touches_nothing(env):
    # CASE(*, changed-on-host)
    env.build({"a": "1", "b": "2", "d/x": "x", "c": "3"})
    time.sleep(0.03)
    entries = mountinfo.read()
    th = ctimes.take(str(env.state), [mountinfo.containing(str(env.host), entries).fstype], entries)
    wait_for(th)
    env.since = th.since_ns
    env.seen = overlay(env.host, env.upper, env.work, env.merged, "echo A > a; rm -rf d; rm b; echo C > c")
    (env.host / "a").write_text("host edit\n")         # edited on the host during the run
    (env.host / "d/x").write_text("host edit\n")       # inside a dir the run deleted
    os.chmod(env.host / "b", 0o600)                     # metadata counts too
    before, upper_before = snapshot(env.host), snapshot(env.upper)
    with pytest.raises(CommitConflict) as ei:
        commit([env.layer()], state_dir=str(env.state), since_ns=env.since)
    assert sorted(ei.value.paths) == sorted(str(env.host / p) for p in ("a", "b", "d/x"))
    assert isinstance(ei.value, CommitError) and isinstance(ei.value, CaperError)
    assert snapshot(env.host) == before
    assert snapshot(env.upper) == upper_before
    assert os.getxattr(env.upper, "trusted.overlay.impure") == b"y"
    assert os.listdir(env.state / "journal") == []


def test_appeared_on_host_is_a_conflict(env):
    # CASE(*, changed-on-host): the run created a path the host created too
    env.build({"x": "x"})
    env.since = time.time_ns()
    env.seen = overlay(env.host, env.upper, env.work, env.merged, "echo run > new")
    (env.host / "new").write_text("host\n")
    with pytest.raises(CommitConflict) as ei:
        commit([env.layer()], state_dir=str(env.state), since_ns=env.since)
    assert ei.value.paths == [str(env.host / "new")]
    assert (env.host / "new").read_text() == "host\n"


def test_dir_deleted_on_host_during_the_run_is_a_conflict(env):
    # CASE(*, changed-on-host): the run deleted d/a; the host deleted all of d
    env.build({"d/a": "1", "d/b": "2"})
    env.run("rm d/a; echo 3 > d/c")
    shutil.rmtree(env.host / "d")
    with pytest.raises(CommitConflict) as ei:
        env.commit()
    assert ei.value.paths == [str(env.host / "d")]
    assert not (env.host / "d").exists()


def _symlink_planted_after_the_run(env, tmp_path, spec: dict, action: str, where: str) -> Path:
    """Run action over spec, then replace the host directory `where` by a
    symlink to a directory outside: the commit must never write through it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    env.build(spec)
    env.run(action)
    shutil.rmtree(env.host / where)
    os.symlink(outside, env.host / where)
    return outside


def test_planted_symlink_is_refused_not_followed(env, tmp_path):
    # CASE(dir, symlink): the host dir became a symlink to somewhere else
    outside = _symlink_planted_after_the_run(env, tmp_path, {"d/f": "1"},
                                             "echo evil > d/f; echo new > d/g", "d")
    with pytest.raises(CommitError):                   # a conflict: planted after the snapshot
        env.commit()
    # the same with the symlink older than the snapshot: not a conflict, still refused
    env.since = time.time_ns()
    with pytest.raises(CommitError, match="symlink"):
        env.commit()
    assert os.listdir(outside) == []
    assert os.readlink(env.host / "d") == str(outside)


def test_symlink_in_a_deeper_component_is_refused(env, tmp_path):
    # CASE(dir, symlink): d/s is a symlink on the host, the upper has d/s/f
    outside = _symlink_planted_after_the_run(env, tmp_path, {"d/s/f": "1"}, "echo 2 > d/s/f", "d/s")
    env.since = time.time_ns()
    with pytest.raises(CommitError, match="refusing"):
        env.commit()
    assert os.listdir(outside) == []


def test_plain_dir_over_host_file_is_refused(env):
    # CASE(dir, file): hand-made upper (the kernel would have marked it opaque)
    env.build({"f": "file"})
    (env.upper / "f").mkdir()
    (env.upper / "f/x").write_text("x")
    env.since = time.time_ns()
    with pytest.raises(CommitError, match="refusing"):
        env.commit()
    assert (env.host / "f").read_text() == "file"


def test_handmade_markers(env):
    # CASE(whiteout, none)  CASE(opaque, none): whiteout of a path the host no longer
    # has, an opaque dir where the host has nothing
    env.build({"keep": "k"})
    os.mknod(env.upper / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (env.upper / "o").mkdir()
    os.setxattr(env.upper / "o", "trusted.overlay.opaque", b"y")
    (env.upper / "o/f").write_text("f")
    env.since = time.time_ns()
    res = env.commit()
    assert sorted(os.listdir(env.host)) == ["keep", "o"]
    assert [os.path.basename(c.path) for c in res.changes] == ["o", "f"]
    assert overlay_xattrs_in(env.host) == []


def test_user_markers_are_not_markers_in_a_trusted_layer(env):
    # CASE(dir, dir): a user.overlay.opaque in a trusted-xattr layer is not a marker
    env.build({"d/a": "1"})
    (env.upper / "d").mkdir()
    os.setxattr(env.upper / "d", "user.overlay.opaque", b"y")
    (env.upper / "d/b").write_text("b")
    env.since = time.time_ns()
    env.commit(userxattr=False)
    assert sorted(os.listdir(env.host / "d")) == ["a", "b"]
    assert overlay_xattrs_in(env.host) == []


def test_metacopy_a_redirect_the_view_contradicts_and_devices_are_refused(env):
    # CASE(metacopy, *)  CASE(device, *)
    env.build({"d/a": "1"})
    (env.upper / "e").mkdir()
    # a redirect to d with no whiteout at d: the run saw d as well, so no rename
    os.setxattr(env.upper / "e", "trusted.overlay.redirect", b"/d")
    env.since = time.time_ns()
    with pytest.raises(CommitError, match="redirect to .* still saw"):
        env.commit()
    os.rmdir(env.upper / "e")
    (env.upper / "d").mkdir()
    (env.upper / "d" / "a").write_text("")
    os.setxattr(env.upper / "d" / "a", "trusted.overlay.metacopy", b"")
    with pytest.raises(CommitError, match="metacopy"):
        env.commit()
    shutil.rmtree(env.upper / "d")
    os.mknod(env.upper / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(CommitError, match="chardev"):
        env.commit()
    assert sorted(os.listdir(env.host)) == ["d"]


def _inodes(root, *paths) -> tuple:
    return tuple(os.lstat(Path(root) / p).st_ino for p in paths)


def test_directories_the_run_renamed_are_renamed_on_the_host(env):
    # CASE(dir-with-moved, none): and into a directory the run made
    env.build({"d/a": "a", "d/sub/b": "b", "e/x": "x", "f/y": "y", "keep": "k"})
    before = _inodes(env.host, "d", "d/sub", "e", "d/sub/b", "f")
    env.run("mv d d2; mv d2/sub d2/sub2; echo z > d2/a; mkdir -p n/m; mv e n/m/e; echo y > n/y; "
            "mkdir d; mkdir g; mv f g/f2", options=NATIVE)
    r = env.commit()
    env.check_committed()
    assert _inodes(env.host, "d2", "d2/sub2", "n/m/e", "d2/sub2/b", "g/f2") == before
    assert sorted(c.path.removeprefix(str(env.host) + "/") for c in r.changes if "renamed" in c.detail) \
        == ["d", "d/sub", "d2", "d2/sub2", "e", "f", "g/f2", "n/m/e"]


def test_a_rename_onto_an_empty_directory_replaces_it(env):
    env.build({"d/a": "a", "empty": DIR})
    ino = _inodes(env.host, "d")
    env.run("python3 -c 'import os; os.rename(\"d\", \"empty\")'", options=NATIVE)
    env.commit()
    env.check_committed()
    assert _inodes(env.host, "empty") == ino and leftovers(env.host) == []


def test_a_renamed_directory_that_changed_on_the_host_or_carries_a_mount_or_excluded_path_is_refused(env):
    # CASE(moved-dir, changed-on-host)  CASE(moved-dir, excluded)  CASE(moved-dir, mount)
    env.build({"d/a": "a", "d/m/x": "x"})
    env.run("mv d d2", options=NATIVE)
    with pytest.raises(CommitError, match="keeps out of commits"):
        env.commit(exclude=[str(env.host / "d" / "m")])

    def inner():
        mount("tmpfs", str(env.host / "d" / "m"), "tmpfs")
        try:
            env.commit()
        except CommitError as e:
            return str(e)
        finally:
            umount(env.host / "d" / "m")
        return "committed"
    assert "mount point" in in_mount_ns(inner)
    os.chmod(env.host / "d", 0o700)           # the host changed it during the run
    with pytest.raises(CommitConflict):
        env.commit()
    assert sorted(os.listdir(env.host)) == ["d"] and sorted(os.listdir(env.host / "d")) == ["a", "m"]


def test_a_file_with_hard_links_written_renamed_or_chmodded_through_one_name_keeps_them(env):
    # CASE(linked-file, *)
    env.build({"a": "old\n", "c": "c\n", "s": "s\n"})
    for src, dst in (("a", "hl"), ("c", "c2"), ("s", "s2")):
        os.link(env.host / src, env.host / dst)
    a, c, s = _inodes(env.host, "a", "c", "s")
    env.run("echo more >> a; chmod 600 hl; mv c c3; echo new >> c3; mv s2 s3", options=NATIVE)
    r = env.commit()
    env.check_committed()
    assert _inodes(env.host, "a", "hl", "c3", "c2", "s", "s3") == (a, a, c, c, s, s)
    assert (env.host / "hl").read_text() == "old\nmore\n" and (env.host / "c2").read_text() == "c\nnew\n"
    assert stat.S_IMODE(os.stat(env.host / "a").st_mode) == 0o600
    assert not [c for c in r.changes if c.links_split]


def test_data_written_through_a_name_the_run_then_removed_reaches_the_other_links(env):
    # CASE(linked-index, *): the new data is only in the overlay's index
    env.build({"a": "old\n", "b": "b\n"})
    os.link(env.host / "a", env.host / "hl")
    os.link(env.host / "b", env.host / "bl")
    a, b = _inodes(env.host, "a", "b")
    env.run("echo new > hl; rm hl; echo more >> b; mv -f a b", options=NATIVE)
    r = env.commit()
    env.check_committed()
    assert _inodes(env.host, "b", "bl") == (a, b) and (env.host / "bl").read_text() == "b\nmore\n"
    assert (env.host / "b").read_text() == "new\n"
    assert any("run then removed" in c.detail for c in r.changes)


def test_a_file_handle_that_names_a_file_of_another_tree_is_not_trusted(tmp_path):
    # CASE(linked-file, *): an upper copied from another tree's run names that tree's inodes
    first = Env(tmp_path / "first").build({"a": "a\n"})
    os.link(first.host / "a", first.host / "hl")
    first.run("mv hl hl2", options=NATIVE)
    second = Env(tmp_path / "second")
    for src, dst in ((first.host, second.host), (first.upper, second.upper)):
        shutil.rmtree(dst)
        subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    second.since, second.seen = time.time_ns(), first.seen
    second.commit()
    second.check_committed()
    assert os.lstat(second.host / "hl2").st_ino != os.lstat(first.host / "a").st_ino
    assert os.lstat(first.host / "a").st_nlink == 2                # nothing linked to the first tree


def test_mount_point_on_host_is_refused(env):
    # CASE(*, mount): a filesystem mounted on the host where the run wrote or deleted
    env.build({"m/x": "x", "n/y": "y"})
    env.run("echo 2 > m/z; rm -rf n")
    env.since = time.time_ns()

    def inner():
        mount("tmpfs", str(env.host / "m"), "tmpfs")
        try:
            commit([env.layer()], state_dir=str(env.state), since_ns=env.since)
        except CommitError as e:
            out = [str(e)]
        else:
            out = ["committed"]
        umount(env.host / "m")
        for target, fstype, src, flags in (("n", "tmpfs", "tmpfs", 0),            # another fs
                                           ("m", None, str(env.base / "other"), MS_BIND),  # same fs
                                           ("n", None, str(env.base / "other"), MS_BIND)):
            (env.base / "other").mkdir(exist_ok=True)
            mount(src, str(env.host / target), fstype, flags)
            try:
                commit([env.layer()], state_dir=str(env.state), since_ns=env.since)
            except CommitError as e:
                out.append(str(e))
            else:
                out.append("committed")
            umount(env.host / target)
        assert sorted(os.listdir(env.base / "other")) == []
        return out
    results = in_mount_ns(inner)
    assert len(results) == 4 and all("mount point" in r for r in results), results


def test_race_at_swap_is_undone(env):
    # CASE(*, changed-on-host): a path appears between the plan and its swap
    env.build({"a": "1", "d/b": "2"})
    env.run("echo 2 > a; rm -rf d; echo c > c")
    before = snapshot(env.host)

    def racer(what):
        if what == "rename" and not (env.host / "c").exists():
            (env.host / "c").write_text("host\n")
    journal.fault_hook = racer
    try:
        with pytest.raises(CommitConflict):
            env.commit()
    finally:
        journal.fault_hook = None
    after = snapshot(env.host)
    assert after.pop("c")[4] == b"host\n"
    assert after == before
    assert leftovers(env.host) == [] and os.listdir(env.state / "journal") == []


def test_an_in_place_edit_between_the_plan_and_its_swap_is_a_conflict(env):
    """adv14a 01: the user appends to a file the run rewrote while the commit
    stages (same inode, so the inode check passed): the exchange moved the
    edited inode to the stage name and deleted it. The ctime says it changed."""
    env.build({"notes.txt": "mine\n", "b": "1"})
    env.run("echo run > notes.txt; echo 2 > b")
    edited = []

    def user(what):
        if what in ("exchange", "rename") and not edited:
            with open(env.host / "notes.txt", "a") as f:
                f.write("typed while the commit ran\n")
            edited.append(what)
    journal.fault_hook = user
    try:
        with pytest.raises(CommitConflict):
            env.commit()
    finally:
        journal.fault_hook = None
    assert edited
    assert (env.host / "notes.txt").read_text() == "mine\ntyped while the commit ran\n"
    assert (env.host / "b").read_text() == "1" and leftovers(env.host) == []


def test_two_layers_and_nested_mount_points(tmp_path):
    # CASE(*, excluded): the "/" layer never commits below another layer's mount point
    outer = Env(tmp_path / "o")
    outer.build({"a": "1", "sub/x": "x", "sub/y": "y"})
    inner = Env(tmp_path / "i")
    inner.host = outer.host / "sub"
    outer.run("echo 2 > a; echo bogus > sub/z")
    inner.run("echo 3 > y")
    layers = [outer.layer(), Layer(str(outer.host / "sub"), str(inner.upper), False)]
    res = commit(layers, state_dir=str(tmp_path / "state"), since_ns=outer.since)
    assert (outer.host / "a").read_text() == "2\n"
    assert (outer.host / "sub/y").read_text() == "3\n"
    assert not (outer.host / "sub/z").exists()
    assert res.counts == {"modified": 2}


# --- other filesystems: the upper on tmpfs ----------------------------------------------------------------

def test_exdev_upper_on_tmpfs(tmp_path):
    # CASE(*, other-fs): rename/link give EXDEV: staged by copy, hard links kept
    e = Env(tmp_path)
    e.build({"a": "1", "big": os.urandom(3 << 20), "d/x": "x", "l": Link("a")})

    def inner():
        tfs = tmp_path / "tmpfs"
        tfs.mkdir()
        mount("tmpfs", str(tfs), "tmpfs")
        e.upper, e.work = tfs / "upper", tfs / "work"
        e.upper.mkdir()
        e.work.mkdir()
        e.since = time.time_ns()
        opts = f"lowerdir={e.host},upperdir={e.upper},workdir={e.work}"
        mount("overlay", str(e.merged), "overlay", 0, opts)
        script = ("echo 2 > a; printf tail >> big; rm -rf d; mkdir -p n; echo h > n/h1; ln n/h1 n/h2; "
                  "ln -sfn big l; mkfifo p; python3 -c 'import os; os.setxattr(\"a\", \"user.k\", b\"v\")'")
        subprocess.run(["sh", "-ec", script], cwd=e.merged, check=True)
        seen = snapshot(e.merged)
        umount(e.merged)
        res = commit([e.layer()], state_dir=str(e.state), since_ns=e.since)
        return seen, res
    seen, res = in_mount_ns(inner)
    e.seen = seen
    e.check_committed()
    assert res.linked == 0 and res.copied == 5 and res.bytes_copied >= 3 << 20
    assert os.lstat(e.host / "n/h1").st_ino == os.lstat(e.host / "n/h2").st_ino


# --- crash safety: kill -9 at every filesystem step ---------------------------------------------------------

KILL_SCRIPT = r"""
echo A2 > a; rm b; chmod 700 c; rm -rf d; rm -rf e; mkdir e; echo new > e/new; mkdir e/q
rm f; mkdir f; echo in > f/in; rm -rf g; echo g > g; ln -sfn c l; echo m > m/new; chmod 750 m
mkdir -p n/o; echo p > n/o/p; ln -s p n/o/q; echo h > h1; ln h1 h2; mkfifo pp
touch "$(printf 'nl\nname')"; mv k k2; python3 -c 'import os; os.setxattr("a", "user.t", b"1")'
"""
KILL_SPEC = {"a": "a", "b": "b", "c": "c", "d/x": "x", "d/y/z": "z", "e/p": "p", "e/q/r": "r", "f": "f",
             "g/h": "h", "l": Link("a"), "m/old": "o", "k/1": "1", "k/s/2": "2"}


class _Scenario:
    """KILL_SCRIPT over KILL_SPEC, run once with a real overlay (proto) and
    copied into `work` (on work_base, by default beside proto) before every
    attempt: reset() gives the pre-state, check() names the state reached."""

    def __init__(self, base: Path, upper_base: Path, work_base: Path | None = None):
        self.proto = Env(base / "proto", upper_base / "proto")
        self.proto.build(KILL_SPEC)
        self.post = self.proto.run(KILL_SCRIPT)
        self.work = Env((work_base or base) / "work", (work_base or upper_base) / "work")
        self.pre = self.reset()

    def reset(self) -> dict:
        proto, work = self.proto, self.work
        for src, dst in ((proto.host, work.host), (proto.upper, work.upper)):
            shutil.rmtree(dst, ignore_errors=True)
            subprocess.run(["cp", "-a", str(src), str(dst)], check=True)   # mtimes too
        shutil.rmtree(work.state, ignore_errors=True)
        shutil.rmtree(work.base / TRASH_DIR, ignore_errors=True)    # caper's scratch would go
        work.state.mkdir()
        return snapshot(work.host)

    def commit(self) -> None:
        commit([self.work.layer()], state_dir=str(self.work.state), since_ns=2**62)

    def recover(self) -> list[str]:
        return recover(str(self.work.state))

    def check(self, label: str) -> str:
        work = self.work
        assert leftovers(work.host) == [], label
        assert os.listdir(work.state / "journal") == [], label
        assert overlay_xattrs_in(work.host) == [], label
        now = snapshot(work.host)
        if now == self.pre:
            return "pre"
        if now == self.post:
            return "post"
        raise AssertionError(f"{label}: neither pre- nor post-state\n"
                             f"vs pre:\n{diff(now, self.pre)}\nvs post:\n{diff(now, self.post)}")


def _kill_matrix(base: Path, upper_base: Path, recover_points: int) -> dict:
    """For N = 1, 2, ... kill the commit at its N-th step, recover, and
    require the pre-state or the post-state."""
    sc = _Scenario(base, upper_base)

    def spread(outcomes: list[str]) -> list[int]:
        """Recovery is killed at every step of it, for a spread of commit kill points."""
        first_post = outcomes.index("post") if "post" in outcomes else len(outcomes)
        picks = {1, first_post - 1, first_post, first_post + 1, len(outcomes)} | \
            set(range(2, len(outcomes), max(1, len(outcomes) // recover_points)))
        return sorted(k for k in picks if 1 <= k <= len(outcomes))

    def reset_checked():
        assert sc.reset() == sc.pre

    outcomes, nested = kill_sweep(sc.commit, sc.recover, reset_checked, sc.check, spread)
    # once applied, always applied
    first_post = outcomes.index("post") if "post" in outcomes else len(outcomes)
    assert all(o == "pre" for o in outcomes[:first_post])
    assert all(o == "post" for o in outcomes[first_post:])
    return {"steps": len(outcomes), "pre": outcomes.count("pre"), "post": outcomes.count("post"), "nested": nested}


def test_kill_at_every_step_same_fs(tmp_path):
    stats = _kill_matrix(tmp_path, tmp_path, recover_points=6)
    print(f"\nkill test (same fs): {stats}")
    assert stats["steps"] > 60 and stats["pre"] > 10 and stats["post"] > 5 and stats["nested"] > 20


def test_kill_at_every_step_exdev(tmp_path):
    # CASE(*, other-fs)
    def inner():
        tfs = tmp_path / "tmpfs"
        tfs.mkdir()
        mount("tmpfs", str(tfs), "tmpfs")
        return _kill_matrix(tmp_path, tfs, recover_points=3)
    stats = in_mount_ns(inner)
    print(f"\nkill test (upper on tmpfs): {stats}")
    assert stats["steps"] > 60 and stats["pre"] > 10 and stats["post"] > 5


def _link_groups(root) -> set[tuple[str, ...]]:
    by_ino: dict[int, list[str]] = {}
    for d, dirs, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            if st.st_nlink > 1:
                by_ino.setdefault(st.st_ino, []).append(os.path.relpath(p, root))
    return {tuple(sorted(v)) for v in by_ino.values()}


MOVES_SPEC = {"d/a": "a", "d/s/b": "b", "e/x": "x", "f/y": "y", "empty": DIR, "h": "h", "k": "k"}
MOVES_SCRIPT = ("mv d d2; mv d2/s d2/s2; echo z >> d2/a; mkdir n; mv e n/e; echo more >> h; chmod 600 h; "
                "mv k k2; mv -T f empty")


class _MovesScenario(_Scenario):
    """MOVES_SCRIPT (directory renames, hard-linked files) with the overlay
    caper mounts as root: rebuilt and run again before every attempt (an
    upper copied elsewhere would name the first tree's inodes)."""

    def __init__(self, base: Path):
        self.work = Env(base / "work")
        self.pre = self.reset()
        self.post = {k: v[:6] + (None,) for k, v in self.seen.items()}

    def reset(self) -> dict:
        work = self.work
        for p in (work.host, work.upper, work.work, work.state, work.base / TRASH_DIR):
            shutil.rmtree(p, ignore_errors=True)
        for p in (work.host, work.upper, work.work, work.state):
            p.mkdir()
        work.build(MOVES_SPEC)
        os.link(work.host / "h", work.host / "hl")
        os.link(work.host / "k", work.host / "k3")
        pre = snapshot(work.host, times=False)
        self.seen = work.run(MOVES_SCRIPT, options=NATIVE)
        return pre

    def commit(self) -> None:
        commit([self.work.layer()], state_dir=str(self.work.state), since_ns=self.work.since)

    def check(self, label: str) -> str:
        work = self.work
        assert leftovers(work.host) == [], label
        assert os.listdir(work.state / "journal") == [], label
        assert overlay_xattrs_in(work.host) == [], label
        now, links = snapshot(work.host, times=False), _link_groups(work.host)
        if now == self.pre and links == {("h", "hl"), ("k", "k3")}:
            return "pre"
        if now == self.post and links == {("h", "hl"), ("k2", "k3")}:
            return "post"
        raise AssertionError(f"{label}: neither pre- nor post-state {links}\n"
                             f"vs pre:\n{diff(now, self.pre)}\nvs post:\n{diff(now, self.post)}")


def test_kill_at_every_step_of_directory_renames_and_linked_rewrites(tmp_path):
    sc = _MovesScenario(tmp_path)
    outcomes, nested = kill_sweep(sc.commit, sc.recover, lambda: sc.reset(), sc.check,
                                  lambda o: [o.index("post") - 1])
    first_post = outcomes.index("post")
    print(f"\nkill test (renames, linked rewrites): {len(outcomes)} steps, {nested} nested")
    assert all(o == "pre" for o in outcomes[:first_post]) and all(o == "post" for o in outcomes[first_post:])
    assert first_post > 10 and nested > 3


class _FillAt:
    """A fault hook that fills the filesystem under `where` for real at the
    commit's N-th step: every free byte, then every free inode."""

    def __init__(self, at: int, where: Path):
        self.at, self.n, self.where, self.filled = at, 0, where, False

    def __call__(self, what: str) -> None:
        self.n += 1
        if self.n != self.at:
            return
        self.filled = True
        self.where.mkdir(exist_ok=True)
        fd = os.open(self.where / "bytes", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            v = os.statvfs(self.where)
            if v.f_bavail:
                os.posix_fallocate(fd, 0, v.f_bavail * v.f_frsize)
        finally:
            os.close(fd)
        i = 0
        while True:
            try:
                os.close(os.open(self.where / f"i{i}", os.O_WRONLY | os.O_CREAT, 0o600))
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
            i += 1


def test_a_full_disk_at_every_step_of_the_commit_leaves_pre_or_post(tmp_path):
    """The workspace, the upper and caper's journal share a small tmpfs, which
    is filled for real at the commit's 1st, 2nd ... step. The commit either
    still finishes, or is undone at once (the pre-state while the disk is
    still full), or leaves its journal for recover: then, space freed,
    recover ends in the pre- or the post-state. Never anything else."""
    def inner():
        small = tmp_path / "small"
        small.mkdir()
        mount("tmpfs", str(small), "tmpfs", 0, "size=4m,nr_inodes=400")
        sc = _Scenario(tmp_path, tmp_path, work_base=small)
        filler = small / "filler"
        seen: Counter = Counter()
        n = 0
        while True:
            n += 1
            assert sc.reset() == sc.pre
            fill = _FillAt(n, filler)
            journal.fault_hook = fill
            try:
                sc.commit()
                how = "finished"
            except CommitIncomplete:
                how = "left for recover"
            except CommitError:
                how = "undone"
                assert snapshot(sc.work.host) == sc.pre, f"step {n}: undone, but not to the pre-state"
            finally:
                journal.fault_hook = None
            if not fill.filled:
                assert sc.check("no fill") == "post"
                break
            sc.recover()                       # still full: may fail, must not harm
            shutil.rmtree(filler)
            sc.recover()
            seen[(how, sc.check(f"disk full at step {n}, commit {how}"))] += 1
        return n, dict(seen)

    steps, seen = in_mount_ns(inner)
    print(f"\nfull disk at each of {steps} steps: {seen}")
    assert steps > 60
    assert seen.get(("undone", "pre"), 0) > 5          # the space-taking steps refuse and undo
    assert sum(v for (how, _), v in seen.items() if how == "finished") > 5


def test_commit_refuses_until_an_interrupted_commit_is_recovered(env):
    env.build({"a": "1", "b": "1"})
    env.run("echo 2 > a; echo 2 > b")
    assert killed_at(5, lambda: env.commit())
    with pytest.raises(CommitError, match="recover"):
        env.commit()
    (out,) = recover(str(env.state))
    assert "undone" in out
    env.commit()
    env.check_committed()


def test_a_journal_that_cannot_be_made_refuses_the_commit_and_changes_nothing(env):
    """Where the state directory cannot take the journal (here a file holds its
    name; a full filesystem gives ENOSPC at the same call), the commit is
    refused with the call and its object, not an OSError, and the host and
    the upper layer stay as they were."""
    env.build({"a": "1"})
    env.run("echo 2 > a; echo new > c")
    (env.state / "journal").write_text("not a directory")
    with pytest.raises(CommitError, match=r"mkdir\(.*journal\).*nothing was committed"):
        env.commit()
    assert (env.host / "a").read_text() == "1" and not (env.host / "c").exists()
    assert sorted(os.listdir(env.upper)) == ["a", "c"]


def test_recover_leaves_a_running_commit_alone(env):
    env.build({"a": "1"})
    env.run("echo 2 > a")
    j = journal_at(str(env.state), "deadbeef0000")
    os.makedirs(j.dir, exist_ok=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        j.lock(block=True)
        os.write(w, b"x")
        time.sleep(5)
        os._exit(0)
    os.read(r, 1)
    try:
        assert recover(str(env.state)) == ["deadbeef0000: in progress in another process; left alone"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert recover(str(env.state)) == ["deadbeef0000: no journal (nothing to do); removed"]
    assert recover(str(env.state)) == []


# --- cost grows with the change, not with the tree -------------------------------------------------------

@pytest.fixture(scope="module")
def big_tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("big")
    host = base / "host"
    for d in range(200):
        dp = host / f"d{d:03}"
        dp.mkdir(parents=True)
        for f in range(100):
            fd = os.open(dp / f"f{f:03}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"content %d %d\n" % (d, f))
            os.close(fd)
    return base


def _counted_commit(monkeypatch, env: Env) -> tuple[float, int]:
    calls = [0]

    def counting(real):
        def wrapper(*a, **kw):
            calls[0] += 1
            return real(*a, **kw)
        return wrapper
    monkeypatch.setattr(fsops, "_lstat", counting(os.lstat))
    monkeypatch.setattr(fsops, "_scandir", counting(os.scandir))
    t0 = time.perf_counter()
    env.commit()
    dt = time.perf_counter() - t0
    monkeypatch.undo()
    return dt, calls[0]


def test_cost_of_one_file_in_20k(big_tree, monkeypatch):
    env = Env(big_tree / "one")
    env.host = big_tree / "host"
    env.run("echo changed > d123/f045")
    dt, calls = _counted_commit(monkeypatch, env)
    env.check_committed()
    print(f"\n1 file in a 20,000-file tree: {dt * 1000:.1f} ms, {calls} lstat/scandir calls")
    assert calls < 30
    assert dt < 0.5


def test_cost_of_100_files_in_20k(big_tree, monkeypatch):
    env = Env(big_tree / "hundred")
    env.host = big_tree / "host"
    env.run("for d in 010 020 030 040 050 060 070 080 090 100; do for f in 001 002 003 004 005 006 007 "
            "008 009 010; do echo x > d$d/f$f; done; done")
    dt, calls = _counted_commit(monkeypatch, env)
    env.check_committed()
    print(f"\n100 files in a 20,000-file tree: {dt * 1000:.1f} ms, {calls} lstat/scandir calls")
    assert calls < 100 * 10           # about 8 per file: proportional to the change
    assert dt < 2.0


# --- property: a random sequence of operations, committed == run natively ---------------------------------

NAMES = ["a", "b", "d", "d/a", "d/e", "d/e/b", "d/l", "e", "e/a"]
BASE = {"a": "base-a", "d/a": "base-da", "d/e/b": "base-deb", "d/l": Link("a"), "e/x": "ex"}


def _apply(root: str, ops) -> None:
    """The operations, as a shell would do them; errors are ignored (the same
    error happens natively and in the overlay).  mv of a directory gets EXDEV in
    the overlay (redirect_dir off) and then copies and deletes, like mv(1)."""
    import errno as E

    def p(n):
        return os.path.join(root, n)
    real_root = os.path.realpath(root)
    for op, *args in ops:
        if op in ("write", "append", "chmod", "link") and not \
                os.path.realpath(p(args[0])).startswith(real_root + "/"):
            continue                                    # never write outside the tree
        try:
            if op == "write":
                with open(p(args[0]), "w") as f:
                    f.write(args[1])
            elif op == "append":
                with open(p(args[0]), "a") as f:
                    f.write(args[1])
            elif op == "mkdir":
                os.mkdir(p(args[0]))
            elif op == "rm":
                if os.path.isdir(p(args[0])) and not os.path.islink(p(args[0])):
                    shutil.rmtree(p(args[0]))
                else:
                    os.unlink(p(args[0]))
            elif op == "chmod":
                os.chmod(p(args[0]), args[1], follow_symlinks=False) if not os.path.islink(p(args[0])) else None
            elif op == "symlink":
                os.symlink(args[1], p(args[0]))
            elif op == "xattr":
                os.setxattr(p(args[0]), "user.k", args[1], follow_symlinks=False)
            elif op == "chown":
                os.chown(p(args[0]), args[1], args[1], follow_symlinks=False)
            elif op == "link":
                os.link(p(args[0]), p(args[1]), follow_symlinks=False)
            elif op == "mv":
                s, d = p(args[0]), p(args[1])
                try:
                    os.rename(s, d)
                except OSError as e:
                    if e.errno != E.EXDEV:
                        raise
                    if os.path.lexists(d):
                        if os.path.isdir(d) and not os.path.islink(d):
                            os.rmdir(d)
                        else:
                            raise NotADirectoryError(d) from e
                    shutil.copytree(s, d, symlinks=True)
                    for sd, dirs, files in os.walk(s):      # mv(1) keeps owners too
                        for n in [""] + dirs + files:
                            st_ = os.lstat(os.path.join(sd, n))
                            os.chown(os.path.join(d, os.path.relpath(os.path.join(sd, n), s)),
                                     st_.st_uid, st_.st_gid, follow_symlinks=False)
                    shutil.rmtree(s)
        except OSError:
            pass


_name = st.sampled_from(NAMES)
_op = st.one_of(
    st.tuples(st.just("write"), _name, st.sampled_from(["", "x", "yy\n"])),
    st.tuples(st.just("append"), _name, st.just("+")),
    st.tuples(st.just("mkdir"), _name),
    st.tuples(st.just("rm"), _name),
    st.tuples(st.just("chmod"), _name, st.sampled_from([0o600, 0o755, 0o700])),
    # targets stay inside the tree (a write through a symlink follows it, natively too)
    st.tuples(st.just("symlink"), _name, st.sampled_from(["a", "e/a", "missing"])),
    st.tuples(st.just("xattr"), _name, st.sampled_from([b"1", b"22"])),
    st.tuples(st.just("chown"), _name, st.sampled_from([0, 1000])),
    st.tuples(st.just("link"), _name, _name),
    st.tuples(st.just("mv"), _name, _name),
)


@settings(max_examples=int(os.environ.get("CAPER_HYPOTHESIS_EXAMPLES", 25)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=12))
def test_property_commit_equals_native(tmp_path_factory, ops):
    base = tmp_path_factory.mktemp("prop")
    env = Env(base)
    env.build(BASE)
    native = base / "native"
    make_tree(native, BASE)
    seen = env.run(lambda m: _apply(m, ops))
    env.commit()
    _apply(str(native), ops)
    want = snapshot(native, times=False)
    assert snapshot(env.host, times=False) == want, diff(snapshot(env.host, times=False), want)
    assert {k: v[:6] for k, v in seen.items()} == {k: v[:6] for k, v in want.items()}
    assert leftovers(env.host) == [] and overlay_xattrs_in(env.host) == []
    shutil.rmtree(base)


def test_every_case_label_has_a_test():
    script = Path(__file__).resolve().parent.parent / "scripts" / "check_commit_cases.py"
    p = subprocess.run(["python3", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_caper_recover_command_undoes_an_interrupted_commit(env):
    env.build({"a": "1", "b": "1"})
    before = snapshot(env.host)
    env.run("echo 2 > a; echo 2 > b")
    assert killed_at(5, lambda: env.commit())
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-m", "caper", "recover", "--state-dir", str(env.state)],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stderr
    assert "undone" in p.stdout
    assert snapshot(env.host) == before
    p = subprocess.run([sys.executable, "-m", "caper", "recover", "--state-dir", str(env.state)],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0 and "nothing to recover" in p.stderr
