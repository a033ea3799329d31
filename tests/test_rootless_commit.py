"""Rootless commits leave what a native run by the same user leaves: on
read-only files and directories of the user's own, on files whose only
change is times or mode, and in a real git repository (git refreshes its
0444 objects by touching them). A commit that fails and cannot be undone
does not stop caper: only that commit's paths are refused, and `caper
recover` says, by its exit code, that it could not recover."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from caper.commit.stage import journal_at
from helpers.rootless import NOBODY, ROOTLESS_VENV, as_nobody, need_rootless_venv, source_root


RUN = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import caper
out = caper.run(sys.argv[3], cwd=sys.argv[2], workspace=sys.argv[2], approver="allow",
                state_dir=sys.argv[4], env=dict(os.environ))
print(json.dumps({"committed": out.committed, "reason": out.reason, "exit": out.exit_code,
                  "notes": list(out.notes)}))
"""

GIT_ENV = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@x", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1"}


def _env(home: Path) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LC_ALL": "C", **GIT_ENV}


def native(ws: Path, command: str, home: Path) -> subprocess.CompletedProcess:
    return as_nobody("/bin/sh", "-c", command, cwd=ws, env=_env(home), timeout=60)


def through_caper(ws: Path, command: str, state: Path, home: Path) -> dict:
    p = as_nobody(ROOTLESS_VENV, "-c", RUN, str(source_root()), str(ws), command, str(state),
                  cwd="/", env=_env(home), timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


RECENT = 1577836800     # 2020-01-01


def tree(root: Path, skip: tuple[str, ...] = ()) -> dict:
    """Everything a user sees of a tree but ctimes and inode numbers:
    type, mode, owner, content, symlink target, mtime (files), which
    names share an inode. A file's mtime counts where a date was given
    (before 2020); "now" differs between two runs by nature."""
    out, inodes = {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            st = p.lstat()
            entry = [stat.filemode(st.st_mode), st.st_uid, st.st_gid]
            if stat.S_ISREG(st.st_mode):
                entry += [st.st_mtime_ns if st.st_mtime < RECENT else "recent", None if rel in skip else p.read_bytes()]
                inodes.setdefault(st.st_ino, []).append(rel)
            elif stat.S_ISLNK(st.st_mode):
                entry.append(os.readlink(p))
            out[rel] = entry
    out["<links>"] = sorted(v for v in inodes.values() if len(v) > 1)
    return out


@pytest.fixture
def pair():
    """Two identical workspaces of uid 65534's (native, caper) and a state dir."""
    need_rootless_venv()
    base = Path(tempfile.mkdtemp(prefix="caper-rlcommit-"))
    os.chmod(base, 0o755)
    dirs = {n: base / n for n in ("native", "caper", "state", "home")}
    for d in dirs.values():
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
    yield dirs
    for d in dirs.values():     # read-only dirs of nobody's: give them back first
        subprocess.run(["chmod", "-R", "u+rwX", str(d)], check=False)
    shutil.rmtree(base, ignore_errors=True)


def _same_start(dirs, setup: str) -> None:
    for side in ("native", "caper"):
        p = native(dirs[side], setup, dirs["home"])
        assert p.returncode == 0, p.stderr


SETUP = ("echo a > ro_file && chmod 444 ro_file && touch -d 2001-01-01 ro_file && "
         "mkdir ro_dir && echo b > ro_dir/f && echo c > ro_dir/g && chmod 555 ro_dir && "
         "mkdir -p ro_tree/sub && echo d > ro_tree/sub/x && chmod 444 ro_tree/sub/x && "
         "chmod 555 ro_tree/sub ro_tree && echo e > plain && ln plain plain_link && "
         "find . -type f -exec touch -d 2000-02-02 {} +")

CASES = {
    "touch a read-only file": "touch -d 2011-11-11 ro_file",
    "touch a file in a read-only directory": "touch -d 2011-11-11 ro_dir/f",
    "chmod a read-only file": "chmod 600 ro_file",
    "chmod a hard-linked file (both names follow)": "chmod 600 plain; touch -d 2012-01-01 plain",
    "create and delete in a read-only directory":
        "chmod u+w ro_dir && echo n > ro_dir/new && rm ro_dir/g && chmod u-w ro_dir",
    "replace a read-only file": "rm -f ro_file && echo z > ro_file && chmod 444 ro_file",
    "delete a read-only tree": "chmod -R u+w ro_tree && rm -rf ro_tree",
    "make a read-only tree": ("mkdir -p new/sub && echo q > new/sub/q && touch -d 2003-03-03 new/sub/q"
                              " && chmod 444 new/sub/q && chmod 555 new/sub new"),
    "chmod a read-only directory open": "chmod 755 ro_dir",
}


@pytest.mark.parametrize("command", CASES.values(), ids=CASES.keys())
def test_a_rootless_commit_on_read_only_files_matches_a_native_run(pair, command):
    _same_start(pair, SETUP)
    assert native(pair["native"], command, pair["home"]).returncode == 0
    out = through_caper(pair["caper"], command, pair["state"], pair["home"])
    assert out["committed"] and out["notes"] == [], out
    assert tree(pair["caper"]) == tree(pair["native"])
    assert not os.listdir(pair["state"] / "journal")        # nothing left to recover


def test_git_add_and_commit_in_a_real_repository_matches_a_native_run(pair):
    """git add on content it has seen before refreshes the existing 0444
    object by touching it: that failed as a normal user, with an undo that
    failed too, and caper refused all work after it."""
    if not shutil.which("git"):
        pytest.skip("git missing")
    _same_start(pair, "git init -q . && echo one > f && mkdir d && echo x > d/x && git add -A && "
                      "git commit -qm one && echo two > f && git commit -qam two")
    # back to content git has an object for: the blob and the first tree get touched
    command = "echo one > f && git add -A && git commit -qm back && git log --oneline | wc -l"
    assert native(pair["native"], command, pair["home"]).returncode == 0
    out = through_caper(pair["caper"], command, pair["state"], pair["home"])
    assert out["committed"], out["reason"]
    # .git/index holds inode numbers and ctimes: the same commit, not the same bytes
    assert tree(pair["caper"], (".git/index",)) == tree(pair["native"], (".git/index",))
    status = as_nobody("git", "status", "--porcelain", cwd=pair["caper"], env=_env(pair["home"]))
    assert status.returncode == 0 and status.stdout == ""
    again = through_caper(pair["caper"], "echo three > f && git commit -qam three", pair["state"],
                          pair["home"])
    assert again["committed"], again["reason"]          # caper still takes work


def test_recover_exits_non_zero_when_it_cannot_recover_and_other_work_goes_on(pair, tmp_path):
    """A journal whose undo keeps failing (here: its layer is another
    filesystem now) is kept; `caper recover` exits 1; a later run that
    touches other paths commits, with a note saying what to do; one that
    touches the journal's paths is refused."""
    ws, state = pair["caper"], pair["state"]
    jdir = state / "journal"
    journal = {"version": 1, "id": "0123456789ab", "phase": "staged",
               "layers": [{"mount_point": str(ws), "upper": str(tmp_path / "gone"), "dev": 1}],
               "units": [{"op": "create", "layer": 0, "parent": [], "name": "stuck",
                          "upper": ["stuck"], "host_ino": None, "stage": ".caper-0123456789ab-0",
                          "staged_ino": 1}],
               "metas": [], "times": []}
    jdir.mkdir()
    journal_at(str(state), "0123456789ab").write(journal)      # under the state's record key
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(jdir), str(state / "tasks")],
                   check=True)
    p = as_nobody(ROOTLESS_VENV, "-m", "caper", "recover", "--state-dir", str(state),
                  cwd=source_root(), env={**_env(pair["home"]), "PYTHONPATH": str(source_root())})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAILED" in p.stdout
    out = through_caper(ws, "echo fine > other", state, pair["home"])
    assert out["committed"], out["reason"]
    assert (ws / "other").read_text() == "fine\n"
    assert any("0123456789ab" in n and "caper recover" in n for n in out["notes"]), out["notes"]
    out = through_caper(ws, "echo no > stuck", state, pair["home"])
    assert not out["committed"] and "caper recover" in out["reason"], out
    assert not (ws / "stuck").exists()


KILLED = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from caper.commit import journal
from caper.changes import Layer
from caper.commit.engine import commit
from caper.commit.recover import recover
base = sys.argv[2]
host, upper, state = (os.path.join(base, n) for n in ("host", "upper", "state"))
os.makedirs(os.path.join(host, "ro"))
os.makedirs(os.path.join(upper, "ro"))
with open(os.path.join(upper, "ro", "new"), "w") as f:
    f.write("new\n")
for d in (os.path.join(host, "ro"), os.path.join(upper, "ro")):
    os.chmod(d, 0o555)
since = time.time_ns() + 1
pid = os.fork()
if pid == 0:     # killed at the swap, inside the directory opened for it
    journal.fault_hook = lambda what: os._exit(9) if what == "rename" else None
    commit([Layer(host, upper, True)], state_dir=state, since_ns=since)
    os._exit(0)
os.waitpid(pid, 0)
left = os.stat(os.path.join(host, "ro")).st_mode & 0o777
done = recover(state)
print(oct(left), oct(os.stat(os.path.join(host, "ro")).st_mode & 0o777),
      os.path.exists(os.path.join(host, "ro", "new")), len(done))
"""


def test_a_rootless_commit_killed_in_a_directory_it_opened_is_shut_again_by_recover(pair):
    """The commit opens the user's 0555 directory for the swap; a kill there
    left it 0755 for good. The journal records it, recover shuts it."""
    base = pair["state"]
    p = as_nobody(ROOTLESS_VENV, "-c", KILLED, str(source_root()), str(base), cwd="/",
                  env=_env(pair["home"]), timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["0o755", "0o555", "False", "1"], p.stdout
