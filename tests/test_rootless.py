"""Rootless: caper run by an unprivileged user builds its sandbox inside a
user namespace. The test switches to uid 65534 with setpriv and runs the
system Python (the only interpreter that user can read here)."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.rootless import (NOBODY, ROOTLESS_VENV, SYSTEM_PY, as_nobody, need_rootless_venv,
                              run_as_nobody, source_root, why_not_rootless)


SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from caper.sandbox.trace import trace
from caper.sandbox.events import Kind
cmd = ("echo hi > made-inside; id -u; "
       "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
       "tail -n +3 /proc/net/dev | cut -d: -f1; mount -t tmpfs none /mnt; echo mount=$?")
events, r = trace(cmd, cwd=sys.argv[2], timeout=30).run()
print(json.dumps({
    "end": r.end.name, "exit": r.exit_code, "stdout": r.stdout.text().decode(),
    "opens": [e.path for e in events if e.kind == Kind.OPEN and e.flags & 64],
    "refused": [e.syscall for e in events if e.kind == Kind.REFUSED],
}))
"""


def test_unprivileged_user_gets_a_user_namespace_sandbox():
    reason = why_not_rootless()
    if reason:
        pytest.skip(reason)
    work = tempfile.mkdtemp(prefix="caper-rootless-")
    try:
        os.chown(work, NOBODY, NOBODY)
        p = as_nobody(SYSTEM_PY, "-c", SCRIPT, str(source_root()), work, timeout=120, cwd=work)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["end"] == "EXITED" and out["exit"] == 0
        lines = out["stdout"].splitlines()
        assert lines[0] == str(NOBODY)                  # the user stays who they are
        assert "CapEff:\t0000000000000000" in lines     # no capabilities after exec
        assert "NoNewPrivs:\t1" in lines and "Seccomp:\t2" in lines
        assert [l.strip() for l in lines if l.strip() in ("lo", "eth0")] == ["lo"]
        assert "mount=0" not in lines                   # mount refused
        assert "mount" in out["refused"]
        assert os.path.join(work, "made-inside") in out["opens"]
        assert Path(work, "made-inside").read_text() == "hi\n"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_caper_run_tests_pass_as_an_unprivileged_user():
    """The commit/rollback tests and the property tests, run by uid 65534:
    user namespace, userxattr overlays, per-directory layers."""
    reason = why_not_rootless()
    if reason:
        pytest.skip(reason)
    if not os.access(ROOTLESS_VENV, os.X_OK):
        pytest.skip(f"{ROOTLESS_VENV} missing (./bootstrap makes it)")
    base = tempfile.mkdtemp(prefix="caper-rootless-pytest-")
    try:
        os.chown(base, NOBODY, NOBODY)
        env = {"PATH": "/usr/bin:/bin", "HOME": base, "CAPER_STATE_DIR": f"{base}/state",
               "PYTHONPATH": str(source_root()), "CAPER_HYPOTHESIS_EXAMPLES":
               os.environ.get("CAPER_HYPOTHESIS_EXAMPLES", "15"), "PYTHONDONTWRITEBYTECODE": "1"}
        p = as_nobody(ROOTLESS_VENV, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      f"--basetemp={base}/t", "tests/test_run.py", "tests/test_run_property.py",
                      cwd=source_root(), env=env, timeout=600)
        assert p.returncode == 0, p.stdout[-8000:] + p.stderr[-2000:]
        assert " passed" in p.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("above", ["a directory this user can pass but not list",
                                   "a read-only mount"])
def test_a_writable_mount_below_a_read_only_tree_stays_in_the_sandbox(above):
    """Rootless planning binds such a tree read-only whole. mount(2) made only
    its top mount read-only: a writable mount below it stayed writable, and a
    blocked run's writes reached the host. Now the whole tree is read-only
    and the writable mount gets an overlay of its own: the write is held,
    and committed only when allowed."""
    need_rootless_venv()
    base, state = tempfile.mkdtemp(prefix="caper-below-"), tempfile.mkdtemp(prefix="caper-state-")
    tree, inner = Path(base, "tree"), Path(base, "tree", "inner")
    tree.mkdir()
    mounted = []
    try:
        os.chown(state, NOBODY, NOBODY)
        os.chmod(base, 0o755)
        if above.startswith("a directory"):
            os.chmod(tree, 0o711)                   # x without r for uid 65534
            inner.mkdir()
        else:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "caper-ro", tree],
                           check=True)
            mounted.append(tree)
            inner.mkdir()
            subprocess.run(["mount", "-o", "remount,ro", tree], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0777", "caper-rw", inner],
                       check=True)
        mounted.insert(0, inner)

        def run(approver: str) -> dict:
            return run_as_nobody(inner, "echo held > f; echo done", approver, state)

        out = run("block")
        assert out["exit"] == 0 and not out["committed"]
        assert not (inner / "f").exists()           # it reached the host before
        out = run("allow")
        assert out["committed"], out["reason"]
        assert (inner / "f").read_text() == "held\n"
    finally:
        for m in mounted:
            subprocess.run(["umount", str(m)], check=False)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_every_read_only_bind_is_made_read_only_as_a_whole_tree(tmp_path):
    """Where the kernel can (mount_setattr), every tree the plan binds
    read-only gets its flags recursively, mounts below it or not: a mount
    the host adds below it after the plan is read-only too."""
    from caper.view.overlay import MS_BIND, MS_REC, MS_REMOUNT, MS_RDONLY, OverlaySnapshot, _can_remount_tree
    if not _can_remount_tree():
        pytest.skip("this kernel has no mount_setattr")
    if os.geteuid() != 0:
        pytest.skip("needs root to mount the read-only tree it plans around")
    ro = tmp_path / "ro"                      # nothing below it: the plain remount before
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "caper-ro-leaf", ro], check=True)
    try:
        for userxattr in (False, True):
            snap = OverlaySnapshot.create(str(tmp_path / f"state{userxattr}"), userxattr=userxattr)
            try:
                mine = [m for m in snap.mounts if m.target == snap.stage + str(ro)
                        and m.flags & MS_REMOUNT]
                assert mine and mine[0].flags & MS_RDONLY, snap.mounts
                remounts = [m for m in snap.mounts if m.flags & MS_REMOUNT and m.flags & MS_RDONLY
                            and m.target != snap.stage]     # the staging root's own, not a tree
                assert all(m.flags & (MS_BIND | MS_REC) == MS_BIND | MS_REC for m in remounts)
            finally:
                snap.discard()
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_pseudo_filesystem_mount_does_not_stop_a_rootless_run():
    """An nsfs, mqueue or autofs mount (ip netns, container runtimes, NFS
    clients) below a directory made the rootless overlay of that directory
    fail (the kernel refuses a lower layer with a locked mount below it), so
    every run failed. Such a directory is now split like one with any other
    mount below it, and the pseudo mount is an empty stand-in."""
    need_rootless_venv()
    base, state = tempfile.mkdtemp(prefix="caper-pseudo-"), tempfile.mkdtemp(prefix="caper-state-")
    ws, mq = Path(base, "ws"), Path(base, "mq")
    ws.mkdir()
    mq.mkdir()
    if subprocess.run(["mount", "-t", "mqueue", "caper-mq", mq]).returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
        pytest.skip("cannot mount an mqueue filesystem here (the pseudo mount the test needs)")
    try:
        for p in (base, ws, state):
            os.chown(p, NOBODY, NOBODY)
        out = run_as_nobody(ws, f"echo held > f; ls -A {mq} | wc -l", "block", state)
        assert out["exit"] == 0 and not out["committed"] and not (ws / "f").exists()
        assert out["stdout"].strip() == "0"         # the stand-in is empty
    finally:
        subprocess.run(["umount", str(mq)], check=False)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_rootless_workspace_below_a_directory_of_another_owner_takes_writes():
    """Rootless, a write needs every directory above it, up to its layer's
    root, copied up, and copying up a directory whose owner has no id in the
    user namespace fails (EOVERFLOW): a workspace, or a $HOME, under
    /var/tmp/<root's dir> or /srv took no write at all. Each now gets its own
    layer."""
    need_rootless_venv()
    base, state = tempfile.mkdtemp(prefix="caper-foreign-"), tempfile.mkdtemp(prefix="caper-state-")
    ws, home = Path(base, "roots", "ws"), Path(base, "roots", "home")   # roots/: root's, 0755
    ws.mkdir(parents=True)
    home.mkdir()
    try:
        os.chmod(base, 0o755)
        os.chmod(ws.parent, 0o755)
        for p in (ws, home, state):
            os.chown(p, NOBODY, NOBODY)

        def run(approver: str) -> dict:
            return run_as_nobody(ws, "mkdir d && echo held > d/f && cat d/f && echo rc > $HOME/.rc",
                                 approver, state, home)

        out = run("block")
        assert (out["exit"], out["stdout"]) == (0, "held\n"), out
        assert not (ws / "d").exists() and not (home / ".rc").exists()
        out = run("allow")
        assert out["committed"], out["reason"]
        assert (ws / "d" / "f").read_text() == "held\n" and (home / ".rc").read_text() == "rc\n"
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_rootless_command_writes_to_var_tmp():
    """/var/tmp (root's, 1777) sits below /var in its layer: copying it up
    failed with EOVERFLOW, so `mktemp -p /var/tmp` failed under rootless
    caper. The shared temporary directories are work dirs now."""
    need_rootless_venv()
    if os.stat("/var/tmp").st_uid == NOBODY or os.path.ismount("/var/tmp"):
        pytest.skip("/var/tmp here is not a root-owned directory inside /var")
    ws, state = tempfile.mkdtemp(prefix="caper-vartmp-"), tempfile.mkdtemp(prefix="caper-state-")
    try:
        for p in (ws, state):
            os.chown(p, NOBODY, NOBODY)
        out = run_as_nobody(ws, "f=$(mktemp -p /var/tmp caper-test-XXXXXX) && echo $f", "block",
                            state)
        made = out["stdout"].strip()
        assert out["exit"] == 0 and made.startswith("/var/tmp/caper-test-"), out
        assert not os.path.exists(made)               # held, not on the host
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_write_below_a_directory_of_a_foreign_group_says_why_it_failed():
    """What stays out of reach rootless (README): inside the workspace, a
    setgid team directory whose group has no id in the user namespace cannot
    be copied up, so a write there fails with EOVERFLOW ('Value too large
    for defined data type'). The report flags it and caper run says why."""
    from caper.report.build import NOTES, WRITES_REFUSED
    need_rootless_venv()
    ws, state = tempfile.mkdtemp(prefix="caper-group-"), tempfile.mkdtemp(prefix="caper-state-")
    team = Path(ws, "team")
    team.mkdir()
    try:
        for p in (ws, state):
            os.chown(p, NOBODY, NOBODY)
        os.chown(team, NOBODY, 0)
        os.chmod(team, 0o2775)
        out = run_as_nobody(ws, "echo a > team/f", "block", state)
        assert out["exit"] == 2 and out["notes"] == [NOTES[WRITES_REFUSED]], out
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_rootless_run_removing_an_unread_credential_shows_none_of_its_values():
    """Rootless too, the report reads the host's version of a credential the
    run deleted without reading it: none of its values reach the card."""
    need_rootless_venv()
    tmp_path = Path(tempfile.mkdtemp(prefix="caper-rootless-cred-"))
    atexit.register(shutil.rmtree, tmp_path, True)
    home, ws, state = tmp_path / "home", tmp_path / "ws", tmp_path / "state"
    (home / ".aws").mkdir(parents=True)
    ws.mkdir()
    secret = "s3cr3tValueZZZ9876plainwords"
    (home / ".aws" / "credentials").write_text(f"[default]\naws_secret_access_key = {secret}\n")
    for d in (tmp_path, home, home / ".aws", ws):
        os.chown(d, NOBODY, NOBODY)
    os.chown(home / ".aws" / "credentials", NOBODY, NOBODY)
    out = run_as_nobody(ws, "rm ~/.aws/credentials", "block", state, home=home)
    assert '"~/.aws/credentials"' in out["report"] and secret not in out["report"]


HOLD_AS_NOBODY = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from caper.config import Config
from caper.judge.base import Decision
from caper.transaction import run

class Unsure:
    name = "test"
    def decide(self, request):
        return Decision("unsure", "not sure", approver="test")

out = run(sys.argv[3], cwd=sys.argv[2], workspace=sys.argv[2], approver=Unsure(), on_unsure="ask",
          state_dir=sys.argv[4], config=Config(**json.loads(sys.argv[5])), env=dict(os.environ))
print(json.dumps({"held": out.held, "reason": out.reason}))
"""


@pytest.mark.parametrize("closed", [False, True])
def test_a_rootless_run_that_closes_what_it_wrote_is_not_held_past_the_quota(closed):
    """The adversarial round's repro: 16 MiB written into a directory the run
    then chmods 000. Rootless, caper cannot read it, so it used to count as
    nothing and the run was held past an 8 MiB quota; now a run caper cannot
    measure is not held."""
    need_rootless_venv()
    base = Path(tempfile.mkdtemp(prefix="caper-rootless-quota-"))
    # atexit runs last-registered first: open the tree up, then remove it
    atexit.register(shutil.rmtree, base, True)
    atexit.register(subprocess.run, ["chmod", "-R", "u+rwx", str(base)], check=False)
    ws = base / "ws"
    ws.mkdir()
    for d in (base, ws):
        os.chown(d, NOBODY, NOBODY)
    cmd = "mkdir d; head -c 16777216 /dev/urandom > d/big" + ("; chmod 000 d" if closed else "")
    out = _hold_as_nobody(ws, cmd, base / "state", {"keep_quota_mb": 8})
    assert out["held"] is None and "Not held for a human" in out["reason"], out
    assert ("cannot measure" if closed else "quota of 8 MiB") in out["reason"], out


def _hold_as_nobody(ws: Path, cmd: str, state: Path, config: dict) -> dict:
    """An unsure run of cmd by uid 65534 that asks for a human: held or not, and why."""
    p = as_nobody(ROOTLESS_VENV, "-c", HOLD_AS_NOBODY, str(source_root()), str(ws), cmd,
                  str(state), json.dumps(config), timeout=120, cwd="/",
                  env={"PATH": "/usr/bin:/bin", "HOME": str(ws.parent)})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_a_rootless_run_past_the_inode_quota_is_not_held():
    """adv4a F5, rootless: empty files take no block but an inode each; a
    held run counts them against keep_quota_inodes_pct (here 2,000 inodes of
    the state filesystem) and is not held past it."""
    need_rootless_venv()
    base = Path(tempfile.mkdtemp(prefix="caper-rootless-inodes-"))
    atexit.register(shutil.rmtree, base, True)
    ws = base / "ws"
    ws.mkdir()
    for d in (base, ws):
        os.chown(d, NOBODY, NOBODY)
    pct = 100 * 2000 / os.statvfs(base).f_files
    out = _hold_as_nobody(ws, "mkdir many; cd many; seq 3000 | xargs touch", base / "state",
                          {"keep_quota_inodes_pct": pct})
    assert out["held"] is None and "Not held for a human" in out["reason"], out
    assert "quota of 2000 for them" in out["reason"] and "inodes" in out["reason"], out
    out = _hold_as_nobody(ws, "mkdir few; cd few; seq 300 | xargs touch", base / "state",
                          {"keep_quota_inodes_pct": pct})
    assert out["held"], out


def test_rootless_policy_blocks_links_into_persistence():
    """Round 3: a hard link to ~/.bashrc and a symlink into .git/hooks, each
    an ordinary new file before, are blocked for uid 65534 too (the project
    under the home: one layer, where a hard link between them is possible)."""
    need_rootless_venv()
    base, state = tempfile.mkdtemp(prefix="caper-links-"), tempfile.mkdtemp(prefix="caper-state-")
    home = Path(base, "home")
    ws = home / "proj"
    try:
        os.chmod(base, 0o755)
        ws.mkdir(parents=True)
        (home / ".bashrc").write_text("export A=1\n")
        (ws / "README").write_text("hi\n")
        subprocess.run(["git", "init", "-q", str(ws)], check=True)
        for p in (home, ws, state, home / ".bashrc", *ws.rglob("*")):
            os.lchown(p, NOBODY, NOBODY)
        for command in ("ln $HOME/.bashrc notes.txt", "ln -s .git/hooks tools"):
            out = run_as_nobody(ws, command, "policy", state, home)
            assert out["exit"] == 0 and not out["committed"], (command, out["reason"])
            assert "persistence" in out["reason"], out["reason"]
        assert not (ws / "notes.txt").exists() and not (ws / "tools").is_symlink()
        assert (home / ".bashrc").read_text() == "export A=1\n"
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


PIN = r"""
import hashlib, json, os, sys
sys.path.insert(0, sys.argv[1])
from caper.state import record_key, state_dir
s = state_dir(sys.argv[2])
key = record_key(s)
with open(os.path.join(s, "tasks", "key"), "wb") as f:
    f.write(b"K" * 32)                       # an agent's file tool: a key of its own
again = record_key(s)
with open(os.path.join(s, "tasks", "key"), "rb") as f:
    on_file = f.read()
print(json.dumps({"same": again == key, "put_back": on_file == key,
                  "name": "caper-record-key:" + hashlib.sha256(os.fsencode(s)).hexdigest()[:32]}))
"""
UNPIN = r"""
import ctypes, sys
s = ctypes.CDLL(None, use_errno=True).syscall
serial = s(250, 10, -4, b"user", sys.argv[1].encode(), 0)
if serial > 0:
    s(250, 21, serial)
"""


def test_a_rootless_users_record_key_is_pinned_and_the_sandbox_cannot_read_it():
    """As uid 65534: the key is pinned in that user's keyring, a replaced key
    file is put back, and a command in the rootless sandbox can neither find
    the pinned key nor pin one (keyctl and add_key are refused)."""
    need_rootless_venv()
    if os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86_64 syscall numbers")
    work = Path(tempfile.mkdtemp(prefix="caper-rootless-"))
    pin = None
    try:
        os.chown(work, NOBODY, NOBODY)
        (work / "ws").mkdir()
        os.chown(work / "ws", NOBODY, NOBODY)
        p = as_nobody(ROOTLESS_VENV, "-c", PIN, str(source_root()), str(work / "st"),
                      timeout=60, cwd="/")
        assert p.returncode == 0, p.stderr[-2000:]
        pin = json.loads(p.stdout)
        assert pin["same"] and pin["put_back"], pin
        probe = ("import ctypes; s = ctypes.CDLL(None, use_errno=True).syscall; "
                 f"r = s(250, 10, -4, b'user', b'{pin['name']}', 0); "
                 "print('search', r, ctypes.get_errno()); "
                 f"r = s(248, b'user', b'{pin['name']}', b'K' * 32, 32, -4); "
                 "print('add', r, ctypes.get_errno())")
        out = run_as_nobody(work / "ws", f"/usr/bin/python3 -c \"{probe}\"", "allow",
                            work / "st")
        assert "search -1 1" in out["stdout"] and "add -1 1" in out["stdout"], out
    finally:
        if pin:                           # not left in that user's keyring for 3 days
            as_nobody(SYSTEM_PY, "-c", UNPIN, pin["name"], timeout=30)
        shutil.rmtree(work, ignore_errors=True)
