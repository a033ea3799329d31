"""Held runs and conflicting runs' kept versions are bounded together
(Config.keep_quota_mb, and keep_quota_inodes_pct of the state filesystem's
inodes): beyond the quota a run is neither held nor kept, and its reason
says so; freeing a held run makes room again. Real runs, real upper layers
(the inode cases on a small tmpfs, as root; rootless: tests/test_rootless.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from caper import held as pending
from caper.config import Config
from caper.transaction import run
from caper.view.overlay import settle
from helpers.trees import git_project
from helpers.approvers import Unsure
from helpers.meanwhile import run_while_the_user_edits_readme

WRITE = f"{sys.executable} -c \"open('blob%d', 'wb').write(b'x' * 700_000)\""


def test_held_runs_stop_at_the_quota_and_say_so(tmp_path):
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    state = str(tmp_path / "state")
    config = Config(keep_quota_mb=1)
    kw = dict(approver=Unsure(), workspace=str(ws), cwd=str(ws), state_dir=state,
              on_unsure="ask", config=config, env={**os.environ, "HOME": str(tmp_path)})
    first = run(WRITE % 1, **kw)
    assert first.held and not first.committed
    second = run(WRITE % 2, **kw)
    assert second.held is None and not second.committed and second.decision == "block"
    assert "Not held for a human" in second.reason and "quota of 1 MiB" in second.reason
    assert second.kept_upper is None
    runs = os.listdir(os.path.join(state, "runs"))
    assert [n for n in runs if n.endswith(".kept")] == [first.held + ".kept"]
    pending.discard(state, first.held)
    third = run(WRITE % 3, **kw)
    assert third.held
    code, _, _ = pending.apply(state, third.held)
    assert code == 0 and (ws / "blob3").stat().st_size == 700_000
    assert not (ws / "blob2").exists()


def test_a_conflicting_runs_version_past_the_quota_is_not_kept(tmp_path):
    """A host edit during the run is a conflict; with no room left under the
    quota the run's version is dropped, and the reason says so and why."""
    ws = git_project(tmp_path / "ws", {"README": "hello\n"})
    state = str(tmp_path / "state")
    out = run_while_the_user_edits_readme(ws, state, "echo agent edit > README", workspace=str(ws),
                                          config=Config(keep_quota_mb=0),
                                          env={**os.environ, "HOME": str(tmp_path)})
    assert not out.committed and out.kept_upper is None
    assert "is not kept" in out.reason and "quota of 0 MiB" in out.reason
    assert (ws / "README").read_text() == "user edit\n"
    assert not [n for n in os.listdir(os.path.join(state, "runs")) if n.endswith(".kept")]


MANY = "mkdir many; cd many; seq %d | xargs touch"


def _small_state_fs(tmp_path, inodes: int):
    """A tmpfs with few inodes for the state directory, unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (rootless: tests/test_rootless.py)")
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=64m,nr_inodes={inodes}", "caper-inodes",
                    str(fs)], check=True)
    return fs


def test_a_held_run_of_empty_files_stops_at_the_inode_quota_and_later_runs_work(tmp_path):
    """adv4a F5: 9,000 empty files take no block; counted in bytes only, the
    run was held with ~90% of the state filesystem's inodes and every later
    run that made a few hundred files hit disk_limit for a day."""
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    fs = _small_state_fs(tmp_path, 10_000)
    try:
        kw = dict(approver=Unsure(), workspace=str(ws), cwd=str(ws), state_dir=str(fs / "st"),
                  on_unsure="ask", config=Config(), env={**os.environ, "HOME": str(tmp_path)})
        out = run(MANY % 9000, **kw)
        assert out.held is None and not out.committed and "Not held for a human" in out.reason
        assert "quota of 1000 for them" in out.reason and "keep_quota_inodes_pct" in out.reason
        settle()
        later = run(MANY % 600, **{**kw, "approver": "allow"})
        assert later.committed, later.reason
        assert len(os.listdir(ws / "many")) == 600
        held = run(MANY.replace("many", "few") % 50, **kw)
        assert held.held, held.reason
        pending.discard(str(fs / "st"), held.held)
    finally:
        settle()
        subprocess.run(["umount", str(fs)], check=True)


def test_no_run_is_held_where_the_state_filesystem_is_short_of_inodes(tmp_path):
    """Whatever the quota: with less than twice the floor every run keeps
    free (caper.sandbox.limits.DiskGuard), keeping a run would starve the
    next ones."""
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    fs = _small_state_fs(tmp_path, 10_000)
    try:
        filler = fs / "filler"
        filler.mkdir()
        for i in range(9_200):      # the floor is 500 inodes: leave fewer than 1,000
            (filler / str(i)).touch()
        out = run("echo x > f", approver=Unsure(), workspace=str(ws), cwd=str(ws),
                  state_dir=str(fs / "st"), on_unsure="ask", config=Config(),
                  env={**os.environ, "HOME": str(tmp_path)})
        assert out.held is None and "Not held for a human" in out.reason, out.reason
        assert "starve later runs" in out.reason and "500 inodes" in out.reason, out.reason
    finally:
        settle()
        subprocess.run(["umount", str(fs)], check=True)
