"""A command should not tell the sandbox from the host without the report
saying so: the sandbox is named as the host is, and reading what does differ
(the mount table, pid 1, the cgroup, the id maps, the network) is flagged in
`uncertain`. Real sandbox runs."""
from __future__ import annotations

import os
import socket

import pytest

from caper.transaction import run
from helpers.trees import git_project

FLAG = "a-process-could-see-the-sandbox"


def report(command: str, tmp_path):
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    out = run(command, approver="block", workspace=str(ws), cwd=str(ws),
              state_dir=str(tmp_path / "state"), env={**os.environ, "HOME": str(tmp_path)})
    return out


def test_the_sandbox_has_the_hosts_name(tmp_path):
    out = report("uname -n; hostname", tmp_path)
    assert out.stdout.text().decode().split() == [socket.gethostname()] * 2
    assert FLAG not in out.report.uncertain


@pytest.mark.parametrize("path", ["/proc/self/mountinfo", "/proc/mounts", "/proc/1/cmdline",
                                  "/proc/self/cgroup", "/proc/self/uid_map", "/proc/net/dev",
                                  "/proc/self/task/$$/mountinfo"])
def test_reading_what_reveals_the_sandbox_is_uncertain(tmp_path, path):
    out = report(f"cat {path} > /dev/null; true", tmp_path)
    assert any(u.split(":")[0] == FLAG for u in out.report.uncertain), out.report.uncertain


def test_ordinary_reads_are_not_flagged(tmp_path):
    out = report("cat README /proc/cpuinfo /proc/self/maps > /dev/null", tmp_path)
    assert FLAG not in [u.split(":")[0] for u in out.report.uncertain]
