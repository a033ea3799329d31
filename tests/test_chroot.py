"""caper inside a chroot: a real one, built in a temporary directory (the
host's /usr, /etc, this Python and this checkout bind-mounted read-only,
a fresh /proc, /dev nodes bound one by one) inside a private mount
namespace that takes every mount with it.

There, the kernel names the command's files from the root of the mount
namespace, so a path would carry the chroot's location ("/<chroot>/work/.env",
which the policy once let through). caper refuses to run instead, and says
why; a user in a chroot gets no user namespace at all."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk_live_51HfakeChrootKey0123456789abcd"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("chroot")),
    reason="needs root, unshare and chroot to build a chroot")

# $1: the chroot's directory, $2: "bind" to make it a mount point first; then
# the command to run in it.
BUILD = r"""
set -eu
R=$1; shift
if [ "$1" = bind ]; then mount --bind "$R" "$R"; fi; shift
mkdir -p "$R/proc" "$R/dev" "$R/tmp" "$R/work" "$R/root"
chmod 1777 "$R/tmp"
for l in bin lib lib64 sbin; do [ -e "/$l" ] && ln -sfn "usr/$l" "$R/$l"; done
for d in /usr /etc {binds}; do
    mkdir -p "$R$d"; mount --bind "$d" "$R$d"; mount -o remount,bind,ro "$R$d"
done
mount -t proc proc "$R/proc"
for n in null zero urandom random full tty; do : > "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
printf 'TOKEN=%s\n' "$SECRET" > "$R/work/.env"
exec chroot "$R" "$@"
"""


# Instead of chroot: the same directory made the root of the mount namespace.
PIVOT = 'mkdir -p "$R/.old"; cd "$R"; pivot_root . .old; umount -l /.old; rmdir /.old; exec "$@"'


def _in_chroot(tmp_path: Path, bind: bool, *argv: str,
               pivot: bool = False) -> subprocess.CompletedProcess:
    script = BUILD.replace("{binds}", " ".join(sorted({sys.prefix, sys.base_prefix, str(ROOT)})))
    if pivot:
        script = script.replace('exec chroot "$R" "$@"', PIVOT)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": str(ROOT), "HOME": "/root",
           "CAPER_NO_GATE": "1", "CAPER_STATE_DIR": "/tmp/state", "SECRET": SECRET}
    (tmp_path / "root").mkdir()
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                           str(tmp_path / "root"), "bind" if bind else "dir",
                           "sh", "-c", 'cd /work && exec "$@"', "sh", *argv],
                          env=env, capture_output=True, text=True, timeout=120)


RUN = [sys.executable, "-m", "caper", "run", "--approver", "policy", "--task", "list the files"]


@pytest.mark.parametrize("bind", [True, False], ids=["chroot-on-a-mount", "chroot-on-a-dir"])
def test_caper_run_in_a_chroot_refuses_and_shows_nothing(tmp_path, bind):
    p = _in_chroot(tmp_path, bind, *RUN, "-c", "cat .env")
    assert p.returncode == 125, p.stdout + p.stderr
    assert SECRET not in p.stdout and SECRET not in p.stderr
    assert "not the root of its mount namespace" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_caper_trace_in_a_chroot_refuses(tmp_path):
    p = _in_chroot(tmp_path, True, sys.executable, "-m", "caper", "trace", "--", "cat", ".env")
    assert p.returncode == 125 and "not the root of its mount namespace" in p.stderr, p.stderr
    assert SECRET not in p.stdout


def test_the_same_tree_entered_with_pivot_root_runs(tmp_path):
    """The refusal is the chroot's, not the tree's: the same directory as the
    root of a mount namespace runs the command, and the report names the
    read of .env in the workspace /work (sealed: the agent's report of a
    blocked credential read names nothing but that it was withheld)."""
    p = _in_chroot(tmp_path, True, *RUN, "--json", "-c", "cat .env", pivot=True)
    assert p.returncode == 125, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["decision"] == "block" and "report" in out, out
    report = out["report"]
    assert report["workspace"] == "/work" and report["withheld"], report
    assert SECRET not in p.stdout
