"""Runs whose effect report a test reads: the secrets planted, and the run."""
from __future__ import annotations

import os
from pathlib import Path

from caper.transaction import run

SECRET = "s3cr3t-Value-9f8e7d6c5b4a"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"


# An approver that could still allow a credential read (a human asked where
# the policy is unsure): the run is not stopped at the read, and the report
# judges it after the run, as it does with an LLM configured.
JUDGED_AFTER = {"approver": "policy", "on_unsure": "ask"}


def go(cmd: str, cwd: Path, tmp_path: Path, home: Path | None = None, **kw):
    env = {**os.environ, "HOME": str(home or tmp_path / "nohome")}
    return run(cmd, cwd=cwd, approver=kw.pop("approver", "block"), env=env,
               state_dir=str(tmp_path / "state"), **kw)
