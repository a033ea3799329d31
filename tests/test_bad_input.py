"""Bad input where it enters caper run: each gets a clear error or a
fail-closed verdict, and nothing is lost."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from caper.config import Config
from caper.errors import ConfigError
from caper.view.overlay import settle
from caper.transaction import run
from helpers.trees import tree

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    w.mkdir()
    (w / "keep").write_text("precious\n")
    return w


def go(ws, cmd, tmp_path, **kw):
    return run(cmd, cwd=ws, workspace=ws, approver=kw.pop("approver", "allow"), config=Config(),
               state_dir=str(tmp_path / "state"), **kw)


@pytest.mark.parametrize("cmd", ["echo a\0b", ["echo", "a\0b"], []])
def test_nul_bytes_and_empty_argv_are_clear_errors(ws, tmp_path, cmd):
    before = tree(ws)
    with pytest.raises(ConfigError, match="NUL|empty"):
        go(ws, cmd, tmp_path)
    assert tree(ws) == before


def test_an_argument_over_the_kernels_limit_is_a_block_that_says_why(ws, tmp_path):
    out = go(ws, "rm keep; echo " + "x" * 1_000_000, tmp_path)
    assert not out.committed and "Argument list too long" in out.reason
    assert (ws / "keep").read_text() == "precious\n"


def test_a_megabyte_of_arguments_in_many_words_runs(ws, tmp_path):
    out = go(ws, ["sh", "-c", 'echo "$#" > count', "sh"] + ["y" * 1000] * 1000, tmp_path)
    assert out.committed and (ws / "count").read_text() == "1000\n"
    assert out.report.size() <= 8192


def test_non_utf8_names_and_output_round_trip(ws, tmp_path):
    name = os.fsdecode(b"caf\xe9-\xff")
    out = go(ws, f"printf 'x\\377y' > '{name}'; printf '\\376\\n'", tmp_path)
    assert out.committed and (ws / name).read_bytes() == b"x\xffy"
    assert out.stdout.text() == b"\xfe\n"
    out.report.to_json()                                   # valid UTF-8 JSON all the same
    assert any(c.path.startswith("caf") for c in out.report.changes) or out.report.aggregates


def test_cli_with_non_utf8_and_a_missing_workspace(ws, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CAPER_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run([sys.executable, "-m", "caper", "run", "--approver", "allow", "-c",
                        b"printf '\\377' > \xe9"], cwd=ws, env=env, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert (ws / os.fsdecode(b"\xe9")).read_bytes() == b"\xff"
    p = subprocess.run([sys.executable, "-m", "caper", "run", "--workspace",
                        str(tmp_path / "missing"), "-c", "true"], cwd=ws, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 125 and "workspace does not exist" in p.stderr


def test_a_symlinked_workspace_is_the_real_one(ws, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(ws)
    out = run("echo new > n", cwd=link, workspace=link, approver="allow", config=Config(),
              state_dir=str(tmp_path / "state"))
    assert out.committed and (ws / "n").read_text() == "new\n"
    assert out.report.workspace == str(ws)


@pytest.mark.skipif(os.geteuid() != 0, reason="the test mounts a read-only filesystem")
def test_a_read_only_workspace_stays_read_only_inside(tmp_path):
    """A read-only mount is overlaid read-only: the write fails in the run as
    it would natively, and there is nothing to commit."""
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(ro)], check=True)
    try:
        (ro / "keep").write_text("precious\n")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        before = tree(ro)
        out = run("echo changed > keep; echo ran", cwd=ro, workspace=ro, approver="allow",
                  config=Config(), state_dir=str(tmp_path / "state"))
        assert out.stdout.text() == b"ran\n" and b"Read-only file system" in out.stderr.text()
        assert out.report.changes == [] and tree(ro) == before
    finally:
        settle()        # the sandbox's init, still exiting, holds the mount until reaped
        subprocess.run(["umount", str(ro)], check=True)
