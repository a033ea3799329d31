"""What a run would lose of the repository's state that git itself cannot
give back: commits no longer on any branch or tag (reset, rebase, a forced
ref update, `branch -D` of an unmerged branch), stash entries dropped, and
uncommitted changes to tracked files thrown away (`reset --hard`,
`checkout -- .`): a tracked file put back to a version git holds, whose
host content git holds nowhere.

Read from the refs, packed-refs, the stash's reflog and the index of both
versions of the repository: the host's (before the run) and the run's
(its changed files, read through the RunTree). git answers the
reachability questions on the host's repository, with the run's new
objects added as an alternate object directory; it never writes there.
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
import subprocess
from dataclasses import dataclass, field

from caper.report.content import RunTree, read_blob
from caper.fs.mountinfo import below
from caper.fs.programs import find_program, helper_env, safe_path
from caper.fs.syscalls import read_quiet
from caper.report.workspace import _GIT_ENV, _GIT_OPTIONS, GIT_TIMEOUT_S

MAX_HASHED = 16 << 20      # bytes of a tracked file hashed to tell a restore
MAX_FILES = 2000           # tracked files looked at per run
MAX_SHOWN_COMMITS = 8      # new commits listed per run
MAX_REWRITTEN = 200        # commits compared by patch id to tell a rebase from a drop
CUT_MIN_LINES = 5          # uncommitted lines a tracked file loses before it counts


class Repositories:
    """Directories laid out as git repositories in the run's view (HEAD with
    objects/ and refs/, or with a commondir), under any name: git reads their
    config and runs their hooks for a command in them, or in a worktree whose
    `.git` file names them (`gitdir: ../.toolsdb`), as it does .git's."""

    def __init__(self, tree: RunTree):
        self.tree = tree
        self._seen: dict[str, bool] = {}

    def part(self, path: str) -> str | None:
        """path below the repository directory holding it ("config",
        "hooks/pre-commit"), or None."""
        d = os.path.dirname(path)
        while d and d != "/":
            if self._laid_out(d):
                return os.path.relpath(path, d)
            d = os.path.dirname(d)
        return None

    def _laid_out(self, d: str) -> bool:
        if d not in self._seen:
            k = self.tree.kind
            self._seen[d] = k(os.path.join(d, "HEAD")) == "file" and (
                k(os.path.join(d, "commondir")) == "file" or
                k(os.path.join(d, "objects")) == "dir" and k(os.path.join(d, "refs")) == "dir")
        return self._seen[d]


@dataclass
class Loss:
    commits: int = 0                                  # no longer reachable from any ref
    refs: list[str] = field(default_factory=list)     # the refs whose commits they were
    content_kept: bool = True    # every lost tip's tree is still a ref's or the index's
    rebased: bool = False        # every lost commit's patch is on its ref under a new id
    stashes: int = 0                                  # stash entries dropped
    reflog_only: int = 0     # commits on no ref that only the reflog held, dropped from it
    uncommitted: list[str] = field(default_factory=list)   # tracked files, host paths
    unknown: str | None = None                        # why it could not be told
    index_unreadable: str | None = None   # why git cannot read the run's .git/index
    hidden: list[str] = field(default_factory=list)   # tracked files git status no longer shows
    added: list[str] = field(default_factory=list)    # "ref: sha subject (files)" the run put on refs
    # Tags the run deleted or moved ("v1.0 moved", "v0.9 deleted"): a release
    # names what it was, and an annotated tag's object is on no ref then.
    tags: list[str] = field(default_factory=list)
    # Tracked files whose staged content neither the file nor a commit holds:
    # what the user's next `git commit` records without anyone having seen it.
    staged: list[str] = field(default_factory=list)
    # Tracked files that lost most of their uncommitted lines (lines neither
    # the index nor HEAD holds): work git cannot give back.
    uncommitted_cut: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.commits or self.stashes or self.reflog_only or self.uncommitted or self.unknown
                    or self.index_unreadable or self.hidden or self.added or self.tags
                    or self.staged or self.uncommitted_cut)


class _Repo:
    def __init__(self, workspace: str, tree: RunTree):
        self.ws, self.tree = workspace, tree
        self.git_dir = os.path.join(workspace, ".git")
        objects = tree.locate(os.path.join(self.git_dir, "objects"))
        upper = os.path.join(*objects) if objects else None
        # git as the workspace module runs it: by absolute path, never the workspace's.
        path = safe_path(os.environ.get("PATH"), avoid=(workspace,))
        self.bin = find_program("git", path, avoid=(workspace,))
        if self.bin is None:
            raise OSError(f"git not found in {path}")
        self.env = helper_env(path, **_GIT_ENV)
        if upper and os.path.isdir(upper) and os.path.realpath(upper) != \
                os.path.realpath(os.path.join(self.git_dir, "objects")):
            self.env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = upper

    def git(self, *args: str, stdin: bytes = b"", env: dict | None = None,
            ok: tuple[int, ...] = (0,), host: bool = False) -> bytes:
        """git on the host's repository, with the run's new objects unless
        host (the object store as it was before the run)."""
        e = {**self.env, **(env or {})}
        if host:
            e.pop("GIT_ALTERNATE_OBJECT_DIRECTORIES", None)
        p = subprocess.run([self.bin, *_GIT_OPTIONS, "-C", self.ws, *args], input=stdin,
                           capture_output=True, timeout=GIT_TIMEOUT_S, cwd="/", env=e)
        if p.returncode not in ok:
            raise OSError(f"git {args[0]}: " + p.stderr.decode(errors="replace").strip()[:200])
        return p.stdout

    def new_bytes(self, path: str) -> bytes | None:
        where = self.tree.locate(path)
        blob = read_blob(where[0], where[1], MAX_HASHED + 1) if where else None
        return blob.data if blob is not None and blob.complete else None


def _sha(text: bytes | None) -> str | None:
    s = (text or b"").strip().decode(errors="replace")
    return s if len(s) in (40, 64) and all(c in "0123456789abcdef" for c in s) else None


def _packed(text: bytes | None) -> dict[str, str]:
    out = {}
    for line in (text or b"").decode(errors="replace").splitlines():
        if line and line[0] not in "#^":
            sha, _, name = line.partition(" ")
            if _sha(sha.encode()):
                out[name] = sha
    return out


def _host_loose(git_dir: str) -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(os.path.join(git_dir, "refs")):
        for f in files:
            p = os.path.join(d, f)
            try:
                sha = _sha(read_quiet(p, 100))
            except OSError:
                continue
            if sha:
                out[os.path.relpath(p, git_dir)] = sha
    return out


def _read(path: str) -> bytes | None:
    try:
        return read_quiet(path, -1)
    except OSError:
        return None


def lost(workspace: str, changes: list, tree: RunTree, tracked: set[str]) -> Loss:
    """changes: the snapshot difference (caper.changes.Change); tracked: the
    host paths among them git tracks."""
    git_dir = os.path.join(workspace, ".git")
    loss = Loss()
    if not os.path.isdir(git_dir):
        return loss
    refs_dir, packed_path = os.path.join(git_dir, "refs"), os.path.join(git_dir, "packed-refs")
    stash_log = os.path.join(git_dir, "logs", "refs", "stash")
    ref_changes = [c for c in changes if below(c.path, refs_dir) or c.path == packed_path]
    stash_changed = any(below(stash_log, c.path) for c in changes)
    log_dirs = _log_dirs(git_dir)
    log_changes = [c for c in changes if any(below(c.path, d) for d in log_dirs)
                   and not below(c.path, stash_log)]
    restored = [c.path for c in changes if c.path in tracked and c.kind == "modified"
                and c.ftype == "file"][:MAX_FILES]
    index = os.path.join(git_dir, "index")
    index_changed = any(c.path == index and c.kind != "deleted" for c in changes)
    if not (ref_changes or stash_changed or restored or index_changed or log_changes):
        return loss
    try:
        repo = _Repo(workspace, tree)
        tips = _commits(repo, ref_changes, loss) if ref_changes else []
        if log_changes:
            _reflog(repo, log_changes, loss)
        if stash_changed:
            before = _read(stash_log) or b""
            gone_too = any(below(stash_log, c.path) and c.kind == "deleted" for c in changes)
            after = b"" if gone_too else (repo.new_bytes(stash_log) or b"")
            gone = {ln.split(b" ")[1] for ln in before.splitlines() if ln.count(b" ") > 1} - \
                   {ln.split(b" ")[1] for ln in after.splitlines() if ln.count(b" ") > 1}
            loss.stashes = len(gone)
        if restored:
            kept_tips = _kept_tips(repo, ref_changes, stash_log)
            loss.uncommitted = _restored(repo, restored, _staged_only(repo, restored)
                                         if index_changed else set(), kept_tips)
            loss.uncommitted_cut = [p for p in _cut(repo, restored, kept_tips)
                                    if p not in loss.uncommitted]
        if index_changed:
            _index(repo, loss, tips)
    except (OSError, subprocess.SubprocessError) as e:
        loss.unknown = str(e) or type(e).__name__
    return loss


def _commits(repo: _Repo, ref_changes: list, loss: Loss) -> list[str]:
    """Counts what the run's refs lose; returns the commits its refs now
    name that they did not."""
    git_dir = repo.git_dir
    loose_before = _host_loose(git_dir)
    packed_path = os.path.join(git_dir, "packed-refs")
    packed_before = _packed(_read(packed_path))
    loose_after, packed_after = dict(loose_before), dict(packed_before)
    for c in ref_changes:
        rel = os.path.relpath(c.path, git_dir)
        if c.path == packed_path:
            packed_after = {} if c.kind == "deleted" else _packed(repo.new_bytes(c.path))
        elif c.kind == "deleted":
            for name in [n for n in loose_after if below(n, rel)]:
                del loose_after[name]
        elif c.ftype == "file":
            sha = _sha(repo.new_bytes(c.path))
            if sha:
                loose_after[rel] = sha
    stash = "refs/stash"        # dropped stashes are counted from the reflog
    before = {k: v for k, v in {**packed_before, **loose_before}.items() if k != stash}
    after = {k: v for k, v in {**packed_after, **loose_after}.items() if k != stash}
    grown = sorted(k for k in after if after[k] != before.get(k))
    if grown:
        loss.added = _added(repo, grown, sorted(set(before.values())), after)
    moved = sorted(k for k in before if after.get(k) != before[k])
    loss.tags = [f"{k[len('refs/tags/'):]} {'moved' if k in after else 'deleted'}"
                 for k in moved if k.startswith("refs/tags/")]
    tips = sorted({after[k] for k in grown})
    if not moved:
        return tips
    head = _sha(_read(os.path.join(git_dir, "HEAD")))
    keep = sorted(set(after.values()))
    rebased = True
    for name in moved:
        tip = before[name]
        if tip in keep or tip == head:
            continue
        n = int(repo.git("rev-list", "--count", tip, "--not", *keep, "--") or b"0")
        if n:
            loss.commits += n
            loss.refs.append(name)
            if loss.content_kept:
                loss.content_kept = _tree_kept(repo, tip, keep)
            rebased = rebased and name in after and _rebased(repo, tip, after[name])
    loss.rebased = bool(loss.commits) and rebased
    return tips


def _worktree_dirs(git_dir: str) -> list[str]:
    """The linked worktrees' own directories (.git/worktrees/<name>)."""
    top = os.path.join(git_dir, "worktrees")
    try:
        return sorted(os.path.join(top, n) for n in os.listdir(top)
                      if os.path.isdir(os.path.join(top, n)))
    except OSError:
        return []


def _log_dirs(git_dir: str) -> list[str]:
    """Where the repository's reflogs are: .git/logs, and each linked
    worktree's own HEAD log (adv12b 05: a commit made there and left by a
    checkout is held by that log alone)."""
    return [os.path.join(git_dir, "logs")] + [os.path.join(d, "logs")
                                               for d in _worktree_dirs(git_dir)]


def _reflog_shas(data: bytes) -> set[str]:
    """The commits a reflog's entries name ("old new ident\tmessage")."""
    out = set()
    for ln in data.splitlines():
        for sha in ln.split(b"\t", 1)[0].split(b" ")[:2]:
            if len(sha) >= 40 and sha.strip(b"0"):
                out.add(sha.decode())
    return out


def _reflog(repo: _Repo, log_changes: list, loss: Loss) -> None:
    """Commits on no branch or tag that only the reflog held (a reset, an
    amend, a deleted branch's last entries): git's one way back to them. The
    run's reflogs no longer naming them (`reflog expire`, a deleted log)
    loses them; the next gc prunes their objects. The stash's reflog is the
    stashes' own count; a log too big to read is taken as unchanged."""
    stash = os.path.join(repo.git_dir, "logs", "refs", "stash")
    gone = [c.path for c in log_changes if c.kind == "deleted"]
    written = {c.path for c in log_changes if c.kind != "deleted" and c.ftype == "file"}

    def run_version(p: str, old: bytes) -> bytes:
        if p in written:
            new = repo.new_bytes(p)
            return old if new is None else new
        return b"" if any(below(p, g) for g in gone) else old

    host = [os.path.join(d, n) for logs in _log_dirs(repo.git_dir)
            for d, _, names in os.walk(logs) for n in names
            if not below(os.path.join(d, n), stash)]
    touched = [p for p in host if p in written or any(below(p, g) for g in gone)]
    dropped = set()
    for p in touched:
        old = _read(p) or b""
        dropped |= _reflog_shas(old) - _reflog_shas(run_version(p, old))
    if not dropped:
        return      # entries appended (every commit), or none of a commit dropped
    after = set()
    for p in host:
        after |= _reflog_shas(run_version(p, _read(p) or b""))
    for p in written - set(host):            # logs the run created
        after |= _reflog_shas(repo.new_bytes(p) or b"")
    if not dropped - after:
        return      # each still named by another log
    before = after | dropped
    tips = repo.git("for-each-ref", "--format=%(objectname)").split()
    heads = [h.encode() for h in (_sha(_read(os.path.join(d, "HEAD")))
                                  for d in [repo.git_dir, *_worktree_dirs(repo.git_dir)]) if h]
    not_refs = b"".join(b"^" + t + b"\n" for t in tips + heads)
    types = repo.git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                     stdin="\n".join(sorted(before)).encode() + b"\n")
    commits = {ln.split()[0].decode() for ln in types.splitlines() if ln.endswith(b" commit")}
    only = lambda shas: set(repo.git("rev-list", "--stdin", stdin="".join(
        f"{s}\n" for s in sorted(shas & commits)).encode() + not_refs).split()) if shas & commits \
        else set()
    loss.reflog_only = len(only(before) - only(after))


def _added(repo: _Repo, names: list[str], old_tips: list[str], after: dict[str, str]) -> list[str]:
    """The commits the run put on refs (new ones, not a ref moved to a
    commit the repository had), each with the files it changes: what the
    user's next `git push` ships or `git checkout` brings into the worktree,
    however it was made (`commit-tree` and `update-ref` write only objects)."""
    out: list[str] = []
    for name in names:
        log = repo.git("log", "--format=%x00%h %s", "--name-only", "--no-renames",
                       "-n", str(MAX_SHOWN_COMMITS), after[name], "--not", *old_tips, "--")
        for entry in log.split(b"\0")[1:]:
            head, _, files = entry.decode(errors="replace").strip().partition("\n")
            names_changed = [f for f in files.split("\n") if f]
            more = f" and {len(names_changed) - 6} more" if len(names_changed) > 6 else ""
            out.append(f"{name}: {head[:80]} ({', '.join(names_changed[:6]) or 'no files'}{more})")
            if len(out) >= MAX_SHOWN_COMMITS:
                return out
    return out


def _index(repo: _Repo, loss: Loss, tips: list[str]) -> None:
    """The run's index: git must still read it, it must not newly hide
    tracked files' worktree changes from `git status` and `git diff`
    (skip-worktree, assume-unchanged), and what it stages anew must be what
    the files or a commit hold."""
    where = repo.tree.locate(os.path.join(repo.git_dir, "index"))
    if not where:
        return
    run_index = {"GIT_INDEX_FILE": os.path.join(*where)}
    try:
        after = repo.git("ls-files", "-v", "-z", env=run_index)
    except OSError as e:
        loss.index_unreadable = str(e) or "git cannot read it"
        return
    before = repo.git("ls-files", "-v", "-z", ok=(0, 128))    # 128: the host's is unreadable
    hidden = sorted(_hidden(after) - _hidden(before))[:MAX_FILES]
    loss.hidden = [os.path.join(repo.ws, p) for p in hidden]
    loss.staged = _staged_unseen(repo, run_index, tips)


def _entries(ls_s: bytes) -> dict[str, tuple[str, str]]:
    """`ls-files -s -z` output: path -> (mode, object id), merged entries only
    (a conflict's stages cannot be committed)."""
    out = {}
    for e in ls_s.split(b"\0"):
        head, tab, path = e.partition(b"\t")
        fields = head.split()
        if tab and len(fields) == 3 and fields[2] == b"0":
            out[os.fsdecode(path)] = (fields[0].decode(), fields[1].decode())
    return out


def _staged_unseen(repo: _Repo, run_index: dict, tips: list[str]) -> list[str]:
    """Host paths whose entry the run's index changed to an object neither
    the run's file there holds nor HEAD or a commit the run put on a ref
    does (adv10b 02: `hash-object -w` and `update-index --cacheinfo` staged
    a tool's own version of a tracked file and left the file alone)."""
    host = _entries(repo.git("ls-files", "-s", "-z", ok=(0, 128)))
    run = _entries(repo.git("ls-files", "-s", "-z", env=run_index))
    changed = sorted(p for p, e in run.items() if host.get(p) != e and e[0] != "160000")
    if not changed:
        return []
    changed = changed[:MAX_FILES]
    literal = {"GIT_LITERAL_PATHSPECS": "1"}
    committed: set[tuple[str, str]] = set()
    for tip in ["HEAD", *tips[:MAX_SHOWN_COMMITS]]:
        out = repo.git("ls-tree", "-r", "-z", "--full-tree", tip, "--", *changed, env=literal,
                       ok=(0, 128))
        for e in out.split(b"\0"):
            head, tab, path = e.partition(b"\t")
            if tab and len(head.split()) == 3:
                committed.add((os.fsdecode(path), head.split()[2].decode()))
    unseen = []
    for p in changed:
        mode, oid = run[p]
        if (p, oid) not in committed and oid not in _worktree_ids(repo, os.path.join(repo.ws, p),
                                                                  mode, len(oid)):
            unseen.append(os.path.join(repo.ws, p))
    return unseen


def _worktree_ids(repo: _Repo, path: str, mode: str, id_len: int) -> set[str]:
    """The object ids `git add` would stage for the run's file at path: its
    bytes, with line ends made LF (text=auto, autocrlf), or the Git LFS
    pointer to them; a symlink's target. Empty when there is no file or it
    is too big to hash."""
    kind = repo.tree.kind(path)
    if kind is None:
        return set()
    where = repo.tree.locate(path)
    roots = ([where] if where else []) + [("/", path.lstrip("/"))]
    data = None
    for root, rel in roots:
        full = os.path.join(root, rel)
        if os.path.lexists(full):
            if mode == "120000" and os.path.islink(full):
                data = os.fsencode(os.readlink(full))
            else:
                blob = read_blob(root, rel, MAX_HASHED + 1)
                data = blob.data if blob is not None and blob.complete else None
            break
    if data is None:
        return set()
    h = hashlib.sha256 if id_len == 64 else hashlib.sha1
    ids = lambda b: h(b"blob %d\0" % len(b) + b).hexdigest()
    lfs = (b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"
           % (hashlib.sha256(data).hexdigest().encode(), len(data)))
    return {ids(data), ids(data.replace(b"\r\n", b"\n")), ids(lfs)}


def _hidden(ls_v: bytes) -> set[str]:
    """`ls-files -v` entries git does not compare with the worktree: tag S
    (skip-worktree) or a lowercase tag (assume-unchanged)."""
    out = set()
    for entry in ls_v.split(b"\0"):
        tag, _, path = entry.partition(b" ")
        if path and (tag == b"S" or tag.islower()):
            out.add(os.fsdecode(path))
    return out


def _tree_kept(repo: _Repo, tip: str, keep: list[str]) -> bool:
    """The lost tip's tree is some remaining ref's, or the run's index holds
    it (a squash, `reset --soft`): history was rewritten, no content lost."""
    trees = repo.git("rev-parse", *[f"{t}^{{tree}}" for t in [tip] + keep]).split()
    if trees[0] in trees[1:]:
        return True
    index = repo.tree.locate(os.path.join(repo.git_dir, "index"))
    index = os.path.join(*index) if index else None
    if not index or not os.path.exists(index):      # the run left the index as it was
        index = os.path.join(repo.git_dir, "index")
    env = {"GIT_INDEX_FILE": index}
    staged = repo.git("ls-files", "-s", env=env).split(b"\n")
    committed = repo.git("ls-tree", "-r", "--full-tree", tip).split(b"\n")
    norm = lambda lines, f: sorted(f(x) for x in lines if x)
    # ls-files: "mode sha stage\tpath"; ls-tree: "mode type sha\tpath"
    a = norm(staged, lambda x: (x.split()[0], x.split()[1], x.split(b"\t", 1)[1]))
    b = norm(committed, lambda x: (x.split()[0], x.split()[2], x.split(b"\t", 1)[1]))
    return a == b


def _rebased(repo: _Repo, tip: str, now: str) -> bool:
    """The ref moved from tip to now, and every commit it no longer holds is
    there again under another id (a rebase): the same patch id among the
    commits now has that tip had not. A dropped commit's is not."""
    lost = repo.git("rev-list", f"--max-count={MAX_REWRITTEN}", tip, "--not", now, "--").split()
    new = repo.git("rev-list", f"--max-count={MAX_REWRITTEN}", now, "--not", tip, "--").split()
    if not lost or not new or len(lost) >= MAX_REWRITTEN:
        return False
    ids = lambda shas: {ln.split()[1]: ln.split()[0] for ln in repo.git(
        "patch-id", "--stable", stdin=repo.git("diff-tree", "--stdin", "--root", "-p",
                                              stdin=b"\n".join(shas) + b"\n")).splitlines()}
    before, after = ids(lost), set(ids(new).values())
    return all(before.get(sha) in after for sha in lost)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _staged_only(repo: _Repo, paths: list[str]) -> set[str]:
    """Blob ids the host's index holds for these paths that neither HEAD's
    tree nor the run's index does: staged work that only the index kept (its
    blob stays in the object store, but nothing but fsck finds it again)."""
    rels = [os.path.relpath(p, repo.ws) for p in paths]
    literal = {"GIT_LITERAL_PATHSPECS": "1"}
    where = repo.tree.locate(os.path.join(repo.git_dir, "index"))
    ids = lambda out, field: {e.split(b"\t")[0].split()[field].decode()
                              for e in out.split(b"\0") if b"\t" in e}
    host = ids(repo.git("ls-files", "-s", "-z", "--", *rels, env=literal, ok=(0, 128)), 1)
    head = ids(repo.git("ls-tree", "-z", "HEAD", "--", *rels, env=literal, ok=(0, 128)), 2)
    run = ids(repo.git("ls-files", "-s", "-z", "--", *rels,
                       env={**literal, "GIT_INDEX_FILE": os.path.join(*where)}), 1) if where else set()
    return host - head - run


def _kept_tips(repo: _Repo, ref_changes: list, stash_log: str) -> list[str]:
    """The commits the run's refs and stash entries point to that the host's
    did not: what may keep an object the run wrote reachable. A stash is
    kept by its entry in the stash list (the reflog), not by refs/stash
    alone: `git stash list` no longer shows one whose entry expired."""
    tips = set()
    for c in ref_changes:
        if c.kind == "deleted" or c.ftype != "file":
            continue
        data = repo.new_bytes(c.path) or b""
        if c.path.endswith("/packed-refs"):
            tips |= {v for k, v in _packed(data).items() if k != "refs/stash"}
        elif c.path != os.path.join(repo.git_dir, "refs", "stash") and _sha(data[:100]):
            tips.add(_sha(data[:100]))
    before = _reflog_shas(_read(stash_log) or b"")
    tips |= _reflog_shas(repo.new_bytes(stash_log) or b"") - before
    return sorted(tips)


def _reachable_new(repo: _Repo, tips: list[str]) -> set[str]:
    """Objects reachable from tips that no host ref reaches (the run's own)."""
    if not tips:
        return set()
    out = repo.git("rev-list", "--objects", *tips[:MAX_SHOWN_COMMITS * 4], "--not", "--all",
                   ok=(0, 128))
    return {ln.split()[0].decode() for ln in out.splitlines() if ln.strip()}


def _restored(repo: _Repo, paths: list[str], staged_only: set[str],
              kept_tips: list[str]) -> list[str]:
    """Tracked files the run put back to a version git held before it, whose host
    content git holds nowhere, or only in an index entry the run dropped
    (uncommitted work thrown away). A blob the run itself wrote (`git add
    -A`, `git stash`) holds it only while a ref, a stash entry or the run's
    index still reaches it: `git add -A && git reset --hard` leaves it
    dangling, `git stash && git stash drop` too."""
    pairs = []
    for p in paths:
        old, new = _read(p), repo.new_bytes(p)
        if old is None or new is None or len(old) > MAX_HASHED:
            continue
        pairs.append((p, _blob_id(old), _blob_id(new)))
    if not pairs:
        return []
    ids = sorted({x for _, a, b in pairs for x in (a, b)})
    out = repo.git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                   stdin="\n".join(ids).encode() + b"\n")
    held = {ln.split()[0].decode() for ln in out.splitlines() if ln.endswith(b" blob")}
    olds = sorted({a for _, a, _ in pairs})
    out = repo.git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                   stdin="\n".join(ids).encode() + b"\n", host=True)
    host_held = {ln.split()[0].decode() for ln in out.splitlines() if ln.endswith(b" blob")}
    run_only = [a for a in olds if a in held and a not in host_held]
    if run_only:
        kept = _reachable_new(repo, kept_tips) | _run_index_ids(repo, paths)
        held -= set(run_only) - kept
    # Put back: to a version git held before the run. A blob of the run's
    # own (`git add` of its edit) is new content, not a restore.
    return [p for p, a, b in pairs if (a not in held or a in staged_only) and b in host_held]


def _cut(repo: _Repo, paths: list[str], kept_tips: list[str]) -> list[str]:
    """Tracked files the run cut most of the user's uncommitted lines from:
    lines the host's file has that its index version has not (git holds
    them nowhere), CUT_MIN_LINES of them or more and half or more, not in
    the run's version (adv10b 18: 40 lines of work cut to 5). Not where the
    host's whole file is an object a ref, a stash entry or the run's index
    keeps (`git stash`)."""
    pairs = [(p, old, new) for p in paths for old, new in [(_read(p), repo.new_bytes(p))]
             if old is not None and new is not None and len(old) <= MAX_HASHED
             and "\n" not in p]
    if pairs:
        kept = _reachable_new(repo, kept_tips) | _run_index_ids(repo, [p for p, _, _ in pairs])
        pairs = [x for x in pairs if _blob_id(x[1]) not in kept]
    if not pairs:
        return []
    # one git for every index version: "<id> blob <size>\n<bytes>\n", or "<name> missing"
    batch = repo.git("cat-file", "--batch", host=True, stdin=b"".join(
        b":" + os.fsencode(os.path.relpath(p, repo.ws)) + b"\n" for p, _, _ in pairs))
    out, at = [], 0
    for p, old, new in pairs:
        end = batch.index(b"\n", at)
        head = batch[at:end].split()
        at = end + 1
        base = b""
        if len(head) == 3 and head[1] == b"blob":
            size = int(head[2])
            base, at = batch[at:at + size], at + size + 1
        mine = Counter(old.splitlines()) - Counter(base.splitlines())
        lost = sum((mine - Counter(new.splitlines())).values())
        if lost >= CUT_MIN_LINES and 2 * lost >= sum(mine.values()):
            out.append(p)
    return out


def _run_index_ids(repo: _Repo, paths: list[str]) -> set[str]:
    """The blob ids the run's index holds for these paths."""
    where = repo.tree.locate(os.path.join(repo.git_dir, "index"))
    if not where or not os.path.lexists(os.path.join(*where)):
        return set()
    out = repo.git("ls-files", "-s", "-z", "--", *[os.path.relpath(p, repo.ws) for p in paths],
                   env={"GIT_LITERAL_PATHSPECS": "1", "GIT_INDEX_FILE": os.path.join(*where)},
                   ok=(0, 128))
    return {e.split(b"\t")[0].split()[1].decode() for e in out.split(b"\0") if b"\t" in e}
