"""caper run: snapshot -> pre-execute -> approve -> commit or roll back, end
to end on the real filesystem (overlayfs in a real mount namespace)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from caper.errors import ConfigError
from caper.view.overlay import settle
from caper.report.build import LINKS_SPLIT, NOTES, RENAMES_REFUSED
from caper.transaction import EXIT_NOT_COMMITTED, run
from helpers.meanwhile import run_while_the_user_edits_readme
from helpers.trees import tree

ROOT = Path(__file__).resolve().parent.parent
# These build their bad filesystems with mount(8); the rootless run skips them.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the test mounts filesystems")


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    w.mkdir()
    (w / "src").mkdir()
    (w / "src" / "main.c").write_text("int main(){return 0;}\n")
    (w / "README").write_text("hello\n")
    return w


@pytest.fixture
def state(tmp_path):
    return str(tmp_path / "state")


def test_allow_commits_the_run_and_returns_its_output(ws, state):
    out = run("echo built > out.txt; rm README; mkdir -p build && echo o > build/x.o; "
              "echo to-stdout; echo to-stderr >&2; exit 3", cwd=ws, approver="allow",
              state_dir=state)
    assert out.decision == "allow" and out.committed
    assert out.exit_code == 3
    assert out.stdout.text() == b"to-stdout\n" and out.stderr.text() == b"to-stderr\n"
    assert (ws / "out.txt").read_text() == "built\n"
    assert not (ws / "README").exists()
    assert (ws / "build" / "x.o").read_text() == "o\n"
    assert set(out.timings) >= {"snapshot_ms", "run_ms", "approve_ms", "commit_ms"}


def test_block_leaves_everything_byte_identical(ws, state, tmp_path):
    home_file = tmp_path / "home-rc"
    home_file.write_text("export A=1\n")
    before, home_before = tree(ws), home_file.read_bytes()
    out = run(f"rm -rf src; echo evil >> {home_file}; chmod 600 README; ln -s /etc x; "
              "echo preview", cwd=ws, approver="block", state_dir=state)
    assert out.decision == "block" and not out.committed
    assert out.stdout.text() == b"preview\n"  # held, shown in the result, not committed
    assert tree(ws) == before and home_file.read_bytes() == home_before
    assert "block" in out.reason or "preview" in out.reason
    # the report says what would have changed
    changed = {c.path: c.op for c in out.report.changes}   # workspace paths are relative
    assert changed["src"] == "deleted"
    assert [op for p, op in changed.items() if p.endswith("/home-rc")] == ["modified"]


def test_writes_outside_the_workspace_are_held_too(ws, state, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run(f"echo 1 > {outside}/a; echo 2 > /tmp/caper-test-{os.getpid()}", cwd=ws,
        approver="block", state_dir=state)
    assert not (outside / "a").exists()
    assert not Path(f"/tmp/caper-test-{os.getpid()}").exists()
    try:
        run(f"echo 1 > {outside}/a; echo 2 > /tmp/caper-test-{os.getpid()}", cwd=ws,
            approver="allow", state_dir=state)
        assert (outside / "a").read_text() == "1\n"
        assert Path(f"/tmp/caper-test-{os.getpid()}").read_text() == "2\n"
    finally:
        Path(f"/tmp/caper-test-{os.getpid()}").unlink(missing_ok=True)


def test_a_run_that_times_out_is_blocked_and_rolled_back(ws, state):
    before = tree(ws)
    out = run("echo x > new; sleep 1000", cwd=ws, approver="allow", timeout=0.5, state_dir=state)
    assert out.decision == "block" and "timeout" in out.reason
    assert tree(ws) == before


def test_host_edit_during_the_run_is_a_conflict_and_nothing_is_clobbered(ws, state):
    target = ws / "README"
    out = run_while_the_user_edits_readme(ws, state, "echo agent edit > README; echo other > other.txt")
    assert out.decision == "block" and not out.committed
    assert str(target) in out.reason
    assert target.read_text() == "user edit\n" and not (ws / "other.txt").exists()
    # the run's version is kept, recoverable
    assert out.kept_upper and any(Path(out.kept_upper).rglob("other.txt"))


def test_a_conflicting_runs_version_is_kept_said_where_and_expires(ws, state):
    """Kept for the user, the reason says where; after KEPT_S a later run
    deletes it (before, such scratch dirs stayed forever)."""
    from caper.state import KEPT_S
    out = run_while_the_user_edits_readme(ws, state, "echo agent edit > README")
    assert not out.committed and out.kept_upper and f"kept in {out.kept_upper}" in out.reason
    kept = Path(out.kept_upper)
    assert (kept / "layer0" / "upper").is_dir()
    assert run("true", cwd=ws, approver="allow", state_dir=state).committed
    assert kept.is_dir()                                   # young: left alone
    old = time.time() - KEPT_S - 60
    os.utime(str(kept) + ".kept", (old, old))
    assert run("true", cwd=ws, approver="allow", state_dir=state).committed
    assert not kept.exists() and not os.path.exists(str(kept) + ".kept")


def _spans_of_concurrent_runs(workspaces, state) -> list[tuple[float, float]]:
    """Start one run per workspace at once; each reports when its command ran."""
    spans = []

    def one(w):
        out = run("date +%s.%N; sleep 0.5; date +%s.%N", cwd=w, approver="allow", state_dir=state)
        a, b = out.stdout.text().split()
        spans.append((float(a), float(b)))

    threads = [threading.Thread(target=one, args=(w,)) for w in workspaces]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return sorted(spans)


def test_runs_on_one_workspace_take_turns(ws, state):
    (a0, a1), (b0, b1) = spans = _spans_of_concurrent_runs([ws, ws], state)
    assert a1 <= b0, f"runs overlapped: {spans}"


def test_bad_workspace_and_cwd_are_clear_errors(tmp_path, state):
    with pytest.raises(ConfigError, match="does not exist"):
        run("true", cwd=tmp_path / "missing", state_dir=state)
    with pytest.raises(ConfigError, match="workspace does not exist"):
        run("true", cwd=tmp_path, workspace=str(tmp_path / "nope"), state_dir=state)
    with pytest.raises(ConfigError, match="unknown approver"):
        run("true", cwd=tmp_path, approver="maybe", state_dir=state)


def test_file_name_with_newline_commits(ws, state):
    run("printf x > 'a\nb'", cwd=ws, approver="allow", state_dir=state)
    assert (ws / "a\nb").read_text() == "x"


def test_cli_json_and_block_status(ws, state):
    env = {**os.environ, "CAPER_STATE_DIR": state, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "caper", "run", "--json", "--approver", "block",
                        "-c", "echo hi > f; echo out"], cwd=ws, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == EXIT_NOT_COMMITTED
    doc = json.loads(p.stdout)
    assert {"decision", "reason", "exit_code", "stdout", "stderr", "report", "timings"} <= set(doc)
    assert doc["decision"] == "block" and doc["stdout"] == "out\n" and doc["exit_code"] == 0
    assert not (ws / "f").exists()
    p = subprocess.run([sys.executable, "-m", "caper", "run", "--", "sh", "-c",
                        "echo hi > f; echo out; exit 4"], cwd=ws, env=env, capture_output=True,
                       text=True, timeout=60)
    assert (p.returncode, p.stdout) == (4, "out\n")
    assert (ws / "f").read_text() == "hi\n"


@pytest.mark.parametrize("argv", [
    ["run", "--approver", "block", "-q", "--session", "s1", "--timeout", "5", "-c", "true"],
    ["run", "--json", "--", "sh", "-c", "echo --task"],
    ["session", "reset", "s1", "--state-dir", "/x"], ["commit", "abc"], ["discard", "abc"],
    ["hook", "codex"], ["install", "gemini", "--user"], ["uninstall", "claude-code"],
    ["mcp"], ["serve", "--idle", "3"], ["demo"], ["recover", "--state-dir", "/x"],
    ["doctor", "--agent", "codex", "--no-sandbox"], ["install", "codex", "--hook-timeout", "9"],
    ["trace", "--jsonl", "--max-pids", "9", "--", "ls", "-l"],
])
def test_the_cli_parser_built_for_one_subcommand_parses_it_like_the_whole(argv):
    """main() builds only the invoked subcommand's arguments (a hook's
    `caper run` saves ~3 ms): same result as the whole parser."""
    from caper.front.cli import build_parser
    whole = vars(build_parser().parse_args(argv))
    one = vars(build_parser(only=argv[0]).parse_args(argv))
    assert one == whole and whole["cmd"] == argv[0]


def test_runs_on_different_workspaces_go_in_parallel(tmp_path, state):
    workspaces = [tmp_path / "w0", tmp_path / "w1"]
    for w in workspaces:
        w.mkdir()
    (a0, a1), (b0, b1) = spans = _spans_of_concurrent_runs(workspaces, state)
    assert b0 < a1, f"runs on different workspaces were serialized: {spans}"


def test_writes_to_home_are_held_and_committed(ws, state):
    rc = Path.home() / f".caper-test-rc-{os.getpid()}"
    try:
        run(f"echo 'alias x=y' >> {rc}", cwd=ws, approver="block", state_dir=state)
        assert not rc.exists()
        run(f"echo 'alias x=y' >> {rc}", cwd=ws, approver="allow", state_dir=state)
        assert rc.read_text() == "alias x=y\n"
    finally:
        rc.unlink(missing_ok=True)


@needs_root
def test_read_only_workspace_is_a_clear_failure_and_nothing_changes(tmp_path, state):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "f").write_text("keep\n")
    subprocess.run(["mount", "--bind", str(ro), str(ro)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
    try:
        out = run("echo x > f; echo $?", cwd=ro, approver="allow", state_dir=state)
        assert out.stdout.text().strip() != b"0" and b"Read-only" in out.stderr.text()
        assert (ro / "f").read_text() == "keep\n"
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@needs_root
def test_state_dir_on_a_full_disk_fails_the_write_inside_and_loses_nothing(ws, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(small)], check=True)
    try:
        before = tree(ws)
        # The disk guard stops the writer before the filesystem is full (or the
        # write fails with ENOSPC first): either way the run does not count.
        for approver in ("block", "allow"):
            out = run("head -c 5000000 /dev/zero > big; echo rc=$?", cwd=ws, approver=approver,
                      state_dir=str(small))
            assert b"rc=0" not in out.stdout.text() and not out.committed
            assert "fell below" in out.reason or b"No space" in out.stderr.text()
            assert tree(ws) == before
        settle()                       # the scratch goes after the answer
        assert os.listdir(small / "runs") == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


@needs_root
def test_state_dir_on_overlayfs_is_refused_with_a_hint(ws, tmp_path):
    lower, upper, work, merged = (tmp_path / n for n in ("l", "u", "w", "m"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], check=True)
    try:
        with pytest.raises(ConfigError, match="CAPER_STATE_DIR"):
            run("true", cwd=ws, approver="allow", state_dir=str(merged / "state"))
    finally:
        subprocess.run(["umount", str(merged)], check=True)


def test_files_written_just_before_the_run_are_not_conflicts(ws, state):
    """The agent saves files, then runs a command at once: their ctimes (the
    coarse clock lags the real time by more than a tick here; multigrain
    timestamps can be finer) must fall below the snapshot's threshold."""
    for round_ in range(10):
        doomed = ws / "doomed"
        doomed.mkdir()
        for i in range(100):
            (doomed / f"f{i}").write_text("x")
        out = run("rm -rf doomed", cwd=ws, approver="allow", state_dir=state)
        assert out.committed, f"round {round_}: {out.reason}"
        assert not doomed.exists()


def _append_many(args) -> list[str]:
    ws, state, name, n = args
    from caper.config import Config
    bad = []
    for i in range(n):
        out = run(f"echo {name}:{i} >> log", cwd=ws, workspace=ws, approver="allow",
                  state_dir=state, config=Config())
        if not out.committed:
            bad.append(out.reason)
    return bad


def test_parallel_runs_sharing_a_state_dir_lose_no_commit(tmp_path):
    """Found by bench/test_load.py: a commit finishing while another process
    listed the journals looked 'interrupted' to it (its lock file was re-created
    after the owner unlinked it), and that run was refused. Journal locks now
    count only on the inode the path names."""
    import multiprocessing as mp
    state = str(tmp_path / "state")
    jobs = []
    for k in range(4):
        (tmp_path / f"w{k}").mkdir()
        jobs.append((str(tmp_path / f"w{k}"), state, f"p{k}", 25))
    with mp.get_context("spawn").Pool(4) as pool:
        bad = pool.map(_append_many, jobs)
    assert bad == [[]] * 4
    for ws, _, name, n in jobs:
        assert Path(ws, "log").read_text().splitlines() == [f"{name}:{i}" for i in range(n)]


def test_the_workspace_is_the_git_top_level_else_the_cwd(tmp_path):
    from caper.report.workspace import find_workspace
    repo = tmp_path / "repo"
    (repo / "a" / "b").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    assert find_workspace(str(repo / "a" / "b")) == str(repo)
    (tmp_path / "plain" / "x").mkdir(parents=True)
    assert find_workspace(str(tmp_path / "plain" / "x")) == str(tmp_path / "plain" / "x")
    sub = repo / "a" / "sub"                       # a submodule or worktree: .git is a file
    sub.mkdir()
    (sub / ".git").write_text("gitdir: ../../.git/modules/sub\n")
    assert find_workspace(str(sub)) == str(sub)
    out = run("echo hi > made", cwd=repo / "a" / "b", approver="allow", config=None,
              state_dir=str(tmp_path / "state"))
    assert out.committed and out.report.workspace == str(repo)
    assert out.report.changes[0].path == "a/b/made"


def test_a_directory_from_before_the_run_renames_as_root_and_mv_copes_rootless(ws, state):
    """As root caper's overlay has redirect_dir: rename(2) and mv of a
    directory that was there before the run rename it, and the commit renames
    the host's directory (its inode stays). Rootless the kernel refuses
    redirect_dir with userxattr: rename(2) is EXDEV, as across filesystems, and
    mv falls back to copy and delete (README: known differences); the report
    and caper run say so."""
    (ws / "d").mkdir()
    (ws / "d" / "f").write_text("f\n")
    ino = os.stat(ws / "d").st_ino
    cmd = ("python3 -c 'import os\ntry: os.rename(\"d\", \"d2\")\nexcept OSError as e: print(e.errno)'; "
           "mkdir fresh; mv fresh fresh2; mv d d3 2>/dev/null || mv d2 d3")
    out = run(cmd, cwd=str(ws), approver="allow", state_dir=state)
    assert out.committed, out.reason
    assert (ws / "d3" / "f").read_text() == "f\n" and (ws / "fresh2").is_dir()
    assert not (ws / "d").exists() and not (ws / "fresh").exists()
    if os.geteuid() == 0:
        assert out.stdout.text() == b"" and os.stat(ws / "d3").st_ino == ino
        assert RENAMES_REFUSED not in out.report.uncertain and out.notes == ()
        return
    assert out.stdout.text().decode().split() == [str(errno.EXDEV)]
    # the report says so, and caper run tells the caller why
    # two refusals: the rename(2), and mv's own first try before it copies
    assert f"{RENAMES_REFUSED}: 2" in out.report.uncertain
    assert out.notes == (NOTES[RENAMES_REFUSED],)
    env = {**os.environ, "CAPER_STATE_DIR": state, "CAPER_NO_GATE": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "caper", "run", "-q", "--approver", "allow", "-c",
                        "python3 -c 'import os; os.rename(\"d3\", \"d4\")'"],
                       cwd=ws, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and f"caper: note: {NOTES[RENAMES_REFUSED]}" in p.stderr
    assert "caper: note:" not in run("mv fresh2 fresh3", cwd=str(ws), approver="allow",
                                     state_dir=state).to_json()


@pytest.mark.skipif(os.geteuid() != 0, reason="rootless, the kernel allows no redirect_dir (see above)")
def test_git_mv_of_a_directory_commits_as_a_rename(ws, state):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=ws, check=True)
    subprocess.run([*git, "add", "-A"], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=ws, check=True)
    ino = os.stat(ws / "src").st_ino
    out = run("git mv src lib", cwd=str(ws), approver="allow", state_dir=state)
    assert out.committed and out.exit_code == 0, out.reason
    assert os.stat(ws / "lib").st_ino == ino and (ws / "lib" / "main.c").exists()
    assert not (ws / "src").exists()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ws, capture_output=True, text=True)
    assert status.stdout.split("\n")[0] == "R  src/main.c -> lib/main.c"


def test_a_write_through_one_hard_link_reaches_the_others_as_root_not_rootless(ws, state):
    """As root caper's overlay has index=on: a file written through one name
    is written for all its names, in the sandbox and after the commit (into
    the host's inode). Rootless the kernel drops index with userxattr: the
    name written through gets its own copy and the others keep the old
    content (README: known differences), which the report says."""
    (ws / "a").write_text("old\n")
    os.link(ws / "a", ws / "hl")
    out = run("echo new > a; cat hl", cwd=str(ws), approver="allow", state_dir=state)
    assert out.committed, out.reason
    assert (ws / "a").read_text() == "new\n"
    if os.geteuid() == 0:
        assert out.stdout.text() == b"new\n" and (ws / "hl").read_text() == "new\n"
        assert os.stat(ws / "a").st_ino == os.stat(ws / "hl").st_ino
        assert LINKS_SPLIT not in out.report.uncertain and out.notes == ()
        return
    assert out.stdout.text() == b"old\n"                  # what the command saw
    assert (ws / "hl").read_text() == "old\n"
    assert os.stat(ws / "a").st_ino != os.stat(ws / "hl").st_ino
    assert LINKS_SPLIT in out.report.uncertain and out.notes == (NOTES[LINKS_SPLIT],)
    out = run("echo newer > a", cwd=str(ws), approver="allow", state_dir=state)   # one link now
    assert out.committed and out.notes == () and LINKS_SPLIT not in out.report.uncertain
