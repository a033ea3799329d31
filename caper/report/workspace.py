"""The workspace a command runs against, and where a changed path stands:
tracked by git, ignored, untracked, git's own files, or outside the
workspace (home dot files, temp, caches, the system).

git runs on the host's repository with the options that keep it from running
anything the repository configures (fsmonitor hooks) or writing to it.
"""
from __future__ import annotations

import bisect
import os
import subprocess

from caper.fs.mountinfo import below
from caper.fs.programs import find_program, helper_env, safe_path

GIT_TIMEOUT_S = 10
ARG_BYTES = 128 * 1024   # of pathspecs per git call (ARG_MAX is larger; MAX_ARG_STRLEN per arg)
# Nothing the repository's configuration names may run in caper's own git
# (it runs on the host, during runs that are then thrown away): no fsmonitor,
# hooks, signature checks (log.showSignature runs gpg.program), pager.
_GIT_OPTIONS = ["-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
                "-c", "core.hooksPath=/dev/null", "-c", "log.showSignature=false",
                "-c", "gpg.program=false", "-c", "gpg.openpgp.program=false",
                "-c", "gpg.ssh.program=false", "-c", "gpg.x509.program=false",
                "-c", "core.pager=cat", "--no-pager",
                # nothing fetched (a partial clone fetches a missing object the
                # run named: adv14a 04), and the history read from the objects
                # themselves, not from indexes the run may have written beside
                # them (a forged commit-graph: adv14a 05)
                "-c", "protocol.allow=never", "-c", "core.commitGraph=false",
                "-c", "core.multiPackIndex=false"]
# Not the caller's environment (GIT_DIR, GIT_CONFIG_PARAMETERS, GIT_EXEC_PATH
# would redirect git): only these, and no system config.
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_ATTR_NOSYSTEM": "1", "GIT_NO_LAZY_FETCH": "1", "GIT_NO_REPLACE_OBJECTS": "1"}

TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/user")
# Under $HOME: caches that package managers and tools own.
HOME_CACHES = (".cache", ".npm", ".yarn", ".pnpm-store", ".cargo/registry", ".cargo/git",
               ".m2/repository", ".gradle/caches", ".rustup/tmp", ".local/share/virtualenvs")
# .git entries that git itself rewrites in ordinary work (the report ranks
# writes there low, the policy lets them pass). Not config, hooks, or info/
# (exclude hides files from git status, grafts rewrite history's view).
GIT_ROUTINE = ("objects", "logs", "refs", "index", "index.lock", "HEAD", "ORIG_HEAD", "FETCH_HEAD",
               "COMMIT_EDITMSG", "packed-refs", "AUTO_MERGE", "MERGE_RR", "description", "branches")
SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
               "/opt", "/var", "/srv", "/root", "/home")


class _Git:
    """A git command started now, its output collected by result()."""

    def __init__(self, workspace: str, *args: str, stdin: bytes = b""):
        # git by absolute path, from a PATH without the workspace or relative
        # entries, run from / (a ./git the workspace holds is never run).
        path = safe_path(os.environ.get("PATH"), avoid=(workspace,))
        git = find_program("git", path, avoid=(workspace,))
        if git is None:
            raise OSError(f"git not found in {path}")
        self.proc = subprocess.Popen([git, *_GIT_OPTIONS, "-C", workspace, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd="/",
                                     env=helper_env(path, **_GIT_ENV))
        # What fits in the pipe now, without waiting: git works on it while
        # the caller starts the next one (given in result(), it would wait).
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        try:
            sent = os.write(fd, stdin) if stdin else 0
        except BlockingIOError:
            sent = 0
        except BrokenPipeError:
            sent = len(stdin)            # git is gone already: result() says why
        os.set_blocking(fd, True)
        self.stdin: bytes | None = stdin[sent:]
        if not self.stdin:
            self.proc.stdin.close()
            self.proc.stdin = self.stdin = None

    def result(self, ok: tuple[int, ...]) -> bytes:
        try:
            out, err = self.proc.communicate(self.stdin, timeout=GIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        if self.proc.returncode not in ok:
            raise OSError(err.decode(errors="replace").strip()[:200] or
                          f"git exited {self.proc.returncode}")
        return out


HISTORY_NAMES_COMMITS = 5000   # of the whole history, read for the names it holds


def history_names(workspace: str) -> list[str] | None:
    """Every path a commit on any ref (stashes too) added or changed, of the
    last HISTORY_NAMES_COMMITS: what a `git log -p` or a read of the object
    store can print though the file is gone from the tree. None when git
    could not say (fail closed: the caller takes it as holding anything)."""
    try:
        out = _Git(workspace, "log", "--all", "--format=", "--name-only", "--no-renames",
                   "-n", str(HISTORY_NAMES_COMMITS)).result((0,))
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({ln for ln in out.decode("utf-8", "surrogateescape").splitlines() if ln})


HISTORY_COMMITS = 64           # of a credential's history, read for its values
MAX_HISTORY_BYTES = 4 << 20


def history_values(workspace: str, rel: str) -> list[str]:
    """Secret values a file at rel held in any version the repository keeps
    (the last HISTORY_COMMITS commits that touched it, on any ref): what a
    `git show REV:.env` or `git log -p -- .env` can print though the file is
    gone. None found (or git failing) is an empty list."""
    from caper.report.secrets import MAX_SECRET_FILE, values_in
    try:
        out = _Git(workspace, "log", "--all", "-p", "--format=", "--no-ext-diff", "--no-textconv",
                   "-n", str(HISTORY_COMMITS), "--", rel).result((0,))
    except (OSError, subprocess.SubprocessError):
        return []
    lines = [ln[1:] for ln in out[:MAX_HISTORY_BYTES].split(b"\n")
             if ln[:1] in (b"+", b"-") and not ln.startswith((b"+++", b"---"))]
    found: list[str] = []
    chunk: list[bytes] = []
    size = 0
    for ln in lines + [None]:            # values_in parses at most MAX_SECRET_FILE at once
        if ln is None or size + len(ln) + 1 > MAX_SECRET_FILE:
            found += values_in(b"\n".join(chunk))
            chunk, size = [], 0
        if ln is not None and len(ln) < MAX_SECRET_FILE:
            chunk.append(ln)
            size += len(ln) + 1
    return list(dict.fromkeys(found))


def find_workspace(cwd: str) -> str:
    """The git top level of cwd (the nearest directory up with a .git, a
    directory or the file of a worktree or submodule), else cwd itself. Found
    by looking, not by asking git: this runs for every command."""
    cwd = os.path.realpath(cwd)
    d = cwd
    while True:
        if os.path.lexists(os.path.join(d, ".git")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return cwd
        d = parent


def _chunks(items: list[str], max_bytes: int) -> list[list[str]]:
    """items in runs whose total length stays under max_bytes (argv limits)."""
    out: list[list[str]] = [[]]
    size = 0
    for it in items:
        n = len(os.fsencode(it)) + 1
        if out[-1] and size + n > max_bytes:
            out.append([])
            size = 0
        out[-1].append(it)
        size += n
    return out


class PathView:
    """Classifies host paths for the report, and names them briefly:
    workspace paths relative to it, home paths as ~/..., others absolute."""

    def __init__(self, workspace: str, home: str | None):
        self.workspace = workspace
        self.home = home if home and home != "/" else None
        self.is_git = os.path.exists(os.path.join(workspace, ".git"))
        self._tracked: list[str] = []     # sorted, workspace-relative
        self._ignored: set[str] = set()
        self.git_failed: str | None = None

    def inside(self, path: str) -> bool:
        return below(path, self.workspace)

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.workspace) if self.inside(path) else path

    def short(self, path: str) -> str:
        if self.inside(path):
            return self.rel(path)
        if self.home and below(path, self.home):
            return "~" + path[len(self.home.rstrip("/")):]
        return path

    def absolute(self, short: str) -> str:
        """The inverse of short()."""
        if short.startswith("~/") and self.home:
            return self.home.rstrip("/") + short[1:]
        if short.startswith("/"):
            return short
        return os.path.normpath(os.path.join(self.workspace, short))

    def learn(self, paths: list[tuple[str, bool]]) -> None:
        """Ask git once about every changed (path, is_dir) inside the workspace."""
        dirs = {self.rel(p) for p, is_dir in paths if is_dir}
        rels = sorted({self.rel(p) for p, _ in paths if self.inside(p) and p != self.workspace})
        rels = [r for r in rels if not self._git_internal(r)]
        if not self.is_git or not rels:
            return
        ignored = None
        try:
            # Both questions at once: check-ignore never reports tracked files.
            # A trailing / lets dir-only patterns (build/) match a directory
            # the host does not have yet.
            ignored = _Git(self.workspace, "check-ignore", "-z", "--stdin",
                           stdin=b"\0".join(os.fsencode(r + "/" if r in dirs else r)
                                            for r in rels))
            tracked: list[str] = []
            for chunk in _chunks(rels, ARG_BYTES):
                ls = _Git(self.workspace, "--literal-pathspecs", "ls-files", "-z", "--full-name",
                          "--", *chunk).result(ok=(0,))
                tracked += (os.fsdecode(x) for x in ls.split(b"\0") if x)
                tracked += self._committed(chunk)
            self._tracked = sorted(set(tracked))
            out = ignored.result(ok=(0, 1))    # 1: nothing ignored
            self._ignored = {os.fsdecode(x).rstrip("/") for x in out.split(b"\0") if x}
        except (OSError, subprocess.SubprocessError) as e:
            self.git_failed = str(e) or type(e).__name__
        finally:
            if ignored and ignored.proc.returncode is None:
                ignored.proc.kill()
                ignored.proc.communicate()

    def _committed(self, rels: list[str]) -> list[str]:
        """Of rels, the files HEAD holds: tracked even when the index no
        longer lists them (an index emptied by `git read-tree --empty` does
        not make the sources untracked). No commit yet: none."""
        ls = _Git(self.workspace, "--literal-pathspecs", "ls-tree", "-r", "-z", "--name-only",
                  "--full-tree", "HEAD", "--", *rels).result(ok=(0, 128))
        return [os.fsdecode(x) for x in ls.split(b"\0") if x]

    @staticmethod
    def _git_internal(rel: str) -> bool:
        return rel == ".git" or rel.startswith(".git/")

    def tracked_below(self, rel: str) -> int:
        """Tracked files at rel or below it."""
        i = bisect.bisect_left(self._tracked, rel)
        n = 0
        while i < len(self._tracked) and (self._tracked[i] == rel
                                          or self._tracked[i].startswith(rel + "/")):
            n += 1
            i += 1
        return n

    def where(self, path: str) -> str:
        """tracked | ignored | untracked | git-internal | workspace (no git) |
        tmp | cache | home | system | outside."""
        if self.inside(path):
            rel = self.rel(path)
            if not self.is_git:
                return "workspace"
            if self._git_internal(rel):
                return "git-internal"
            if self.tracked_below(rel):
                return "tracked"
            return "ignored" if rel in self._ignored else "untracked"
        return place(path, self.home)


def place(path: str, home: str | None) -> str:
    """Where a path that is not the workspace's stands: cache | home | tmp |
    system | outside."""
    if home and home != "/" and below(path, home):
        rel = path[len(home.rstrip("/")) + 1:]
        return "cache" if any(below(rel, c) for c in HOME_CACHES) else "home"
    if any(below(path, t) for t in TEMP_DIRS):
        return "tmp"
    if any(below(path, s) for s in SYSTEM_DIRS):
        return "system"
    return "outside"
