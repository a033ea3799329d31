"""Held runs and conflicting runs' kept versions are bounded together
(Config.keep_quota_mb): beyond the quota a run is neither held nor kept,
and its reason says so; freeing a held run makes room again. Real runs,
real upper layers."""
from __future__ import annotations

import os
import sys

from caper import held as pending
from caper.config import Config
from caper.transaction import run
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
