"""caper's state directory is invisible to the command under every path: a
bind mount of a directory above it, a bind mount of it, one of a directory
below it, and the caller's default state directory when the run uses another.
A state directory caper does not know of (the same user's other one) is not
hidden, and no run's commit changes it: it holds caper's marker.

Each case runs in a private mount namespace (`unshare -m`) made for the test,
so the bind mounts touch nothing outside it and vanish with it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from pathlib import Path

import pytest
from caper.errors import ConfigError
from helpers.btrfs import MKFS_BTRFS, why_not_btrfs
from helpers.rootless import NOBODY, need_rootless_venv, run_as_nobody
from helpers.trees import git_project, tree


ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
base = sys.argv[2]
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
for src, dst in (("b", "alias-above"), ("b/state", "alias-itself"),
                 ("b/state/runs", "alias-below")):
    subprocess.run(["mount", "--bind", f"{base}/{src}", f"{base}/{dst}"], check=True)
import caper
cmd = " ; ".join(f"ls -A {base}/{p}; cat {base}/{p}/marker; echo x > {base}/{p}/planted"
                 for p in ("alias-above/state", "alias-itself", "home/.local/state/caper"))
cmd += f" ; ls -A {base}/alias-below; echo x > {base}/alias-below/planted"
out = caper.run(cmd, cwd=f"{base}/b/ws", workspace=f"{base}/b/ws", approver="allow",
                state_dir=f"{base}/b/state",
                env={"PATH": "/usr/bin:/bin", "HOME": f"{base}/home"})
print(json.dumps({"committed": out.committed, "stdout": out.stdout.text().decode(),
                  "stderr": out.stderr.text().decode(), "reason": out.reason}))
"""


def test_the_state_directory_is_hidden_under_every_path(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for the bind mounts")
    base = tmp_path
    for d in ("b/ws", "b/state/runs", "alias-above", "alias-itself", "alias-below",
              "home/.local/state/caper"):
        (base / d).mkdir(parents=True, exist_ok=True)
    os.chmod(base / "b/state", 0o700)
    for d in ("b/state", "home/.local/state/caper", "b/state/runs"):
        (base / d / "marker").write_text("caper-private-record\n")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-P", "-c",
                        SCRIPT, str(ROOT), str(base)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["committed"], out
    assert "caper-private-record" not in out["stdout"] and "marker" not in out["stdout"], out
    assert out["stderr"].count("Read-only file system") == 4, out["stderr"]
    for d in ("b/state", "home/.local/state/caper", "b/state/runs"):
        assert not (base / d / "planted").exists()


BTRFS_SCRIPT = r"""
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
base, loop = sys.argv[2], sys.argv[3]
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", loop, f"{base}/pool"], check=True)            # the top level
import btrfsutil, os
btrfsutil.create_subvolume(f"{base}/pool/@home")
subprocess.run(["mount", "-o", "subvol=@home", loop, f"{base}/home"], check=True)
os.makedirs(f"{base}/home/ws")
os.makedirs(f"{base}/home/state", mode=0o700)
open(f"{base}/home/state/marker", "w").write("caper-private-record\n")
import caper
seen = f"{base}/pool/@home/state"
out = caper.run(f"ls -A {seen}; cat {seen}/marker; echo x > {seen}/planted", cwd=f"{base}/home/ws",
                workspace=f"{base}/home/ws", approver="allow", state_dir=f"{base}/home/state",
                env={"PATH": "/usr/bin:/bin", "HOME": f"{base}/nohome"})
print(json.dumps({"committed": out.committed, "stdout": out.stdout.text().decode(),
                  "stderr": out.stderr.text().decode(),
                  "planted": os.path.exists(f"{base}/home/state/planted")}))
"""


def test_the_state_directory_is_hidden_through_a_btrfs_top_level_mounted_elsewhere(tmp_path):
    """Timeshift/snapper mount the top level (`@home/<user>/...` in it)."""
    if why_not_btrfs() or not shutil.which("losetup") or not shutil.which("unshare"):
        pytest.skip(why_not_btrfs() or "needs losetup and unshare")
    img = tmp_path / "img"
    with open(img, "wb") as f:
        f.truncate(200 << 20)
    subprocess.run([MKFS_BTRFS, "-q", str(img)], check=True, capture_output=True)
    for d in ("pool", "home"):
        (tmp_path / d).mkdir()
    loop = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True)
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.strip()}")
    try:
        p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-P",
                            "-c", BTRFS_SCRIPT, str(ROOT), str(tmp_path), loop.stdout.strip()],
                           capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["losetup", "-d", loop.stdout.strip()], check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["committed"] and not out["planted"], out
    assert "caper-private-record" not in out["stdout"] and "marker" not in out["stdout"], out
    assert "Read-only file system" in out["stderr"], out


def _plant(other: Path) -> str:
    """A command that writes another state directory's record key and a journal."""
    return (f"mkdir -p {other}/tasks {other}/journal; echo QQQQ > {other}/tasks/key; "
            f"echo '{{}}' > {other}/journal/c0c0c0c0c0c0.json")


def _other_state_dir_scenario(run, base: Path) -> None:
    """run(command, ws, state) -> the outcome's fields. The adversarial
    round's repro (adv4b 17): a run under s1 plants s2's key and a journal;
    then a workspace holding the run's own state directory and another one."""
    ws, s1, s2 = base / "ws", base / "s1", base / "s2"
    run("true", ws, s2)                                 # s2 is a state directory
    assert (s2 / "CAPER-STATE").is_file()
    before = tree(s2)
    out = run(_plant(s2) + "; echo edit > README", ws, s1)
    assert not out["committed"] and "a caper state directory" in out["reason"], out
    assert tree(s2) == before and (ws / "README").read_text() == "hi\n"
    # The workspace holds the run's own state directory (hidden) and another one:
    # a run beside them is committed, neither changes.
    own, other = ws / ".caper-state", ws / "other-state"
    run("true", ws, other)
    run("true", ws, own)
    own_before, other_before = tree(own), tree(other)
    out = run(f"echo edit > README; echo x > {own}/planted; true", ws, own)
    assert out["committed"], out
    assert (ws / "README").read_text() == "edit\n" and tree(own).keys() >= own_before.keys()
    assert not (own / "planted").exists() and tree(other) == other_before
    out = run(f"echo again > README; rm -rf {other}", ws, own)
    assert not out["committed"] and "a caper state directory" in out["reason"], out
    assert tree(other) == other_before and (ws / "README").read_text() == "edit\n"


def test_a_run_changes_no_other_state_directory_of_the_same_user(tmp_path):
    from caper.transaction import run as caper_run
    from caper.view.overlay import settle
    git_project(tmp_path / "ws", {"README": "hi\n"})
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}

    def run(command: str, ws: Path, state: Path) -> dict:
        out = caper_run(command, cwd=str(ws), workspace=str(ws), approver="allow",
                        state_dir=str(state), env=env)
        settle()                         # the discarded scratch is gone before the next look
        return {"committed": out.committed, "reason": out.reason}
    _other_state_dir_scenario(run, tmp_path)
    # A state directory yet to be made, planted whole by a run (its key, records
    # MAC'd under it) is committed (nothing marks it), but no caper takes it as its
    # state; nor can a run mark one.
    ws, s3 = tmp_path / "ws", tmp_path / "s3"
    assert run(_plant(s3), ws, tmp_path / "s1")["committed"]
    with pytest.raises(ConfigError, match="holds a record key .* but no CAPER-STATE"):
        run("true", ws, s3)
    assert not (s3 / "CAPER-STATE").exists() and not (s3 / "runs").exists()
    out = run(f"rm -rf {s3}; mkdir -m 700 {s3}; echo m > {s3}/CAPER-STATE", ws, tmp_path / "s1")
    assert not out["committed"] and "marker" in out["reason"], out


def test_a_rootless_run_changes_no_other_state_directory_of_the_same_user():
    need_rootless_venv()
    base = Path(tempfile.mkdtemp(prefix="caper-other-state-"))
    try:
        git_project(base / "ws", {"README": "hi\n"})
        for d, _, files in os.walk(base):
            for p in [d, *(os.path.join(d, f) for f in files)]:
                os.chown(p, NOBODY, NOBODY)
        _other_state_dir_scenario(
            lambda command, ws, state: run_as_nobody(ws, command, "allow", state, home=base),
            base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
