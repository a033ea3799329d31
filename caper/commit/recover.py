"""Finish or undo a commit from its journal (after it applied, after a
failure, after a crash), and find the journals no live commit holds."""
from __future__ import annotations

import errno
import os
import re
import stat
from contextlib import suppress

from caper.commit.fsops import (
    DirFds, entered, exists, no_other_links, obj_fd, open_root, proc_path, rmtree_at,
    scandir, set_meta,
)
from caper.commit.journal import SET_ASIDE, Journal, step
from caper.commit.plan import CREATE, DELETE, REPLACE, REWRITE
from caper.commit.stage import JOURNAL_DIR, JOURNAL_VERSION, STAGE_PREFIX, journal_at, rewrite_inode
from caper.errors import CommitError, ForgedJournal
from caper.fs import mountinfo
from caper.fs.syscalls import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2, syncfs

TRASH_DIR = "trash"                # beside each upper dir: see Trash


def _unit_path(lp_host: DirFds, u: dict) -> str:
    return lp_host.path(tuple(u["parent"]) + (u["name"],))


class Recovery:
    """Undo or finish a commit from its journal.  Every step checks the state
    first, so running it again after a crash in the middle is safe."""

    def __init__(self, data: dict):
        self.data = data
        self.notes: list[str] = []
        self.hosts: list[DirFds | None] = []
        for l in data["layers"]:
            try:
                d = open_root(l["mount_point"])
            except CommitError as e:
                raise CommitError(f"cannot reopen layer {l['mount_point']}: {e}") from e
            if d.dev != l["dev"]:
                d.close()
                raise CommitError(f"{l['mount_point']}: another filesystem is mounted there now", step="recover")
            self.hosts.append(d)

    def close(self) -> None:
        for d in self.hosts:
            if d is not None:
                d.close()

    def undo(self) -> None:
        phase = self.data["phase"]
        for u in reversed(self.data["units"]):
            host = self.hosts[u["layer"]]
            parent = () if u["op"] == REWRITE else tuple(u["parent"])   # its backup is in the root
            try:
                pfd = host.fd(parent)
            except CommitError:
                continue                            # the parent is gone: nothing of ours there
            with entered(pfd):
                self._undo_unit(host, pfd, u, phase)
        if phase != "prepared":
            for m in reversed(self.data["metas"]):
                host = self.hosts[m["layer"]]
                rel = tuple(m["rel"])
                pfd = host.fd(rel[:-1])
                cur = exists(pfd, rel[-1])
                if cur is not None and cur.st_ino == m["ino"]:
                    set_meta(pfd, rel[-1], m["old"])
        self._undo_moves()
        self._times("old")
        self._reshut(applied=False)
        self._sync()

    def _undo_moves(self) -> None:
        """Put the directories the commit renamed back (see Stager.move_dirs),
        in the reverse order: each destination back to its hidden name (the
        displaced directory back at the destination), deepest first, and the
        new directories they went into removed; then each source back."""
        moves, new_dirs = self.data.get("moves", []), self.data.get("new_dirs", [])
        places = [(len(m["dst"]), 1, m) for m in moves] + [(len(d["rel"]), 0, d) for d in new_dirs]
        for _, is_move, item in sorted(places, key=lambda p: p[:2], reverse=True):
            host = self.hosts[item["layer"]]
            rel = tuple(item["dst"] if is_move else item["rel"])
            try:
                pfd = host.fd(rel[:-1])
            except CommitError:
                continue                            # its parent is not there: never placed
            cur = exists(pfd, rel[-1])
            if cur is None:
                continue
            if not is_move:
                if stat.S_ISDIR(cur.st_mode) and item["ino"] in (None, cur.st_ino):
                    try:
                        step("rmdir")
                        os.rmdir(rel[-1], dir_fd=pfd)
                    except OSError as e:
                        if e.errno != errno.ENOTEMPTY:
                            raise
                        self.notes.append(f"{host.path(rel)} is not empty; kept")
                host.reset()
                continue
            if cur.st_ino != item["ino"]:
                continue
            if item["displaced"] is None:
                step("rename")
                renameat2(pfd, rel[-1], item["stage"], RENAME_NOREPLACE, new_dfd=host.fd(()))
            else:
                step("exchange")
                renameat2(pfd, rel[-1], item["stage"], RENAME_EXCHANGE, new_dfd=host.fd(()))
            host.reset()
        for m in sorted(moves, key=lambda m: len(m["src"])):
            host = self.hosts[m["layer"]]
            cur = exists(host.fd(()), m["stage"])
            if cur is None or cur.st_ino != m["ino"]:
                continue
            src = tuple(m["src"])
            step("rename")
            renameat2(host.fd(()), m["stage"], src[-1], RENAME_NOREPLACE, new_dfd=host.fd(src[:-1]))
            host.reset()

    def _undo_unit(self, host: DirFds, pfd: int, u: dict, phase: str) -> None:
        name, stage = u["name"], u["stage"]
        if u["op"] == REWRITE:
            if phase != "prepared":
                backup = (pfd, stage) if u["data"] and exists(pfd, stage) is not None else None
                if u["data"] and backup is None:
                    self.notes.append(f"{_unit_path(host, u)}: its old data is not at {stage}; "
                                      "the new data stays")
                origin = (u["origin"][0], bytes.fromhex(u["origin"][1]))
                rewrite_inode(host.fd(()), origin, u["host_ino"], backup, u["meta"]["old"],
                              u["meta"]["old_times"], _unit_path(host, u))
            if u["data"]:
                rmtree_at(pfd, stage, host.dev, host.root)
            return
        if u["op"] == DELETE:
            if exists(pfd, stage) is not None:
                if exists(pfd, name) is None:
                    step("rename")
                    renameat2(pfd, stage, name, RENAME_NOREPLACE)
                else:
                    self.notes.append(f"{_unit_path(host, u)} exists again; old version kept at {stage}")
            return
        cur = exists(pfd, name)
        if phase != "prepared" and cur is not None and cur.st_ino == u["staged_ino"]:
            if u["op"] == CREATE:
                step("rename")
                renameat2(pfd, name, stage, RENAME_NOREPLACE)
            else:
                step("exchange")
                renameat2(pfd, stage, name, RENAME_EXCHANGE)
        rmtree_at(pfd, stage, host.dev, host.path(tuple(u["parent"])))

    def finish(self) -> None:
        trash = [Trash(l["upper"]) for l in self.data["layers"]]
        try:
            for u in self.data["units"]:
                host = self.hosts[u["layer"]]
                parent = () if u["op"] == REWRITE else tuple(u["parent"])   # its backup is in the root
                pfd = host.fd(parent)
                stage = u["stage"]
                with entered(pfd):
                    if exists(pfd, stage) is None:
                        continue
                    if u["op"] == REPLACE:
                        cur = exists(pfd, u["name"])
                        if cur is None or cur.st_ino != u["staged_ino"]:
                            self.notes.append(f"{_unit_path(host, u)} is not the committed version; "
                                              f"{stage} kept")
                            continue
                    if not trash[u["layer"]].take(pfd, stage):
                        rmtree_at(pfd, stage, host.dev, host.path(parent))
            for m in self.data.get("moves", []):        # the directories the moves replaced
                host = self.hosts[m["layer"]]
                cur = exists(host.fd(()), m["stage"])
                if cur is not None and cur.st_ino == m["displaced"]:
                    if not trash[m["layer"]].take(host.fd(()), m["stage"]):
                        rmtree_at(host.fd(()), m["stage"], host.dev, host.root)
            self._times("new")
            self._reshut(applied=True)
            for l in self.data["layers"]:
                empty_upper(l["upper"])
            self._sync()
        finally:
            for t in trash:
                t.close()

    def _reshut(self, applied: bool) -> None:
        """Shut the directories a killed commit left open (shut_dirs): to
        the mode they had, or, applied, to the mode the run gave them."""
        new = {(m["layer"], tuple(m["rel"])): m["new"]["mode"] for m in self.data["metas"]}
        for d in self.data.get("shut", []):
            key = (d["layer"], tuple(d["rel"]))
            want = new.get(key, d["mode"]) if applied else d["mode"]
            try:
                fd = self.hosts[d["layer"]].fd(key[1])
            except CommitError:
                continue                            # gone: nothing to shut
            st = os.fstat(fd)
            left_open = st.st_ino == d["ino"] and stat.S_IMODE(st.st_mode) == d["mode"] | 0o300
            if left_open and want != d["mode"] | 0o300:
                step("chmod")
                os.fchmod(fd, want)

    def _sync(self) -> None:
        """Make the cleanup durable before the journal goes."""
        seen = set()
        for d in self.hosts:
            if d.dev not in seen:
                seen.add(d.dev)
                syncfs(d.fd(()))

    def _times(self, which: str) -> None:
        """The times of merged directories (which the renames in them moved)
        and of files changed in place."""
        for t in self.data["times"]:
            ts = t[which]
            if ts is None:
                continue
            host = self.hosts[t["layer"]]
            rel = tuple(t["rel"])
            try:
                ofd = obj_fd(host.fd(rel[:-1]), rel[-1]) if rel else os.dup(host.fd(()))
            except (CommitError, FileNotFoundError):
                continue                            # gone: nothing of ours to set
            try:
                st = os.fstat(ofd)
                if (st.st_atime_ns, st.st_mtime_ns) == tuple(ts):
                    continue
                step("utime")
                try:
                    os.utime(proc_path(ofd), ns=tuple(ts))
                except PermissionError:
                    # A directory of another owner (a layer's root such as /tmp): its
                    # times follow the renames in it, as a native run's would.
                    if os.geteuid() == 0 or st.st_uid == os.geteuid():
                        raise
            finally:
                os.close(ofd)


class Trash:
    """Where finish() puts the old versions: a directory beside the upper,
    in the run's scratch, which caper deletes after it has answered
    (caper.view.overlay). Deleting files that are on disk costs ~100 us each on
    some filesystems, and the user's tree is clean as soon as they are
    renamed away. Not an old version with a hard link elsewhere: unlinking
    it later would change the ctime of a host file after the commit, which
    the next run would take for an edit. Where the scratch is on another
    mount (EXDEV), finish() deletes in place as before."""

    def __init__(self, upper: str):
        self.fd: int | None = None
        try:
            path = os.path.join(os.path.dirname(upper), TRASH_DIR)
            with suppress(FileExistsError):
                os.mkdir(path, 0o700)
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            pass                 # the scratch is gone (recover after a crash): delete in place

    def take(self, dfd: int, name: str) -> bool:
        if self.fd is None or not no_other_links(dfd, name):
            return False
        try:
            step("rename")
            renameat2(dfd, name, name, RENAME_NOREPLACE, new_dfd=self.fd)
            return True
        except OSError as e:
            if e.errno in (errno.EXDEV, errno.EEXIST, errno.EACCES):
                return False
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def empty_upper(upper: str) -> None:
    """A committed upper dir is consumed: its files are now the host's files
    (hard links), and writing through it again would change the host unseen."""
    try:
        fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        dev = os.fstat(fd).st_dev
        with scandir(fd) as it:
            names = [e.name for e in it]
        with entered(fd):      # rootless, the root of a layer over another's dir is r-x
            for n in names:
                rmtree_at(fd, n, dev, upper)
    finally:
        os.close(fd)


def load_journal(journal: Journal) -> dict:
    path = journal.path
    data = journal.read()
    if data is None:
        raise CommitError(f"{path}: no journal", step="recover")
    if data.get("version") != JOURNAL_VERSION:
        raise CommitError(f"{path}: unknown journal version {data.get('version')!r}", step="recover")
    for item in (data["units"] + data["metas"] + data["times"] + data.get("shut", [])
                 + data.get("moves", []) + data.get("new_dirs", [])):
        names = (item.get("parent", []) + item.get("rel", []) + item.get("src", []) + item.get("dst", [])
                 + [item.get("name", "x"), item.get("stage", "x")])
        if any(not n or n in (".", "..") or "/" in n or "\0" in n for n in names):
            raise CommitError(f"{path}: bad path component in the journal", step="recover")
        if "stage" in item and not item["stage"].startswith(STAGE_PREFIX):
            raise CommitError(f"{path}: bad staging name in the journal", step="recover")
    return data


_JOURNAL_NAME = re.compile(r"([0-9a-f]{12})\.(?:json|json\.tmp|lock)")


def _abandoned(state_dir: str) -> list[str]:
    """Journals no live commit holds: recover() must run before the next commit."""
    out = []
    jdir = os.path.join(state_dir, JOURNAL_DIR)
    for n in sorted(os.listdir(jdir)):
        m = _JOURNAL_NAME.fullmatch(n)
        if m and n.endswith(".json"):
            j = journal_at(state_dir, m.group(1))
            if j.lock(block=False):
                # Its owner may have finished between our listing and our lock.
                alive = os.path.exists(j.path)
                j.unlock(remove=not alive)
                if alive:
                    out.append(m.group(1))
    return out


def stale_paths(state_dir: str) -> dict[str, set[str]]:
    """The host paths of each abandoned journal."""
    out = {}
    for jid in _abandoned(state_dir):
        try:
            data = load_journal(journal_at(state_dir, jid))
            roots = [l["mount_point"] for l in data["layers"]]
            out[jid] = ({_join(roots[u["layer"]], u["parent"] + [u["name"]]) for u in data["units"]}
                        | {_join(roots[m["layer"]], m["rel"]) for m in data["metas"]}
                        | {_join(roots[m["layer"]], m[k]) for m in data.get("moves", []) for k in ("src", "dst")})
        except ForgedJournal:
            pass                  # set aside: it covers nothing caper did
        except (OSError, ValueError, KeyError, IndexError, TypeError, CommitError):
            out[jid] = {"/"}      # unreadable: it may cover anything
    return out


def _join(root: str, rel: list[str]) -> str:
    return root.rstrip("/") + "/" + "/".join(rel) if rel else root


def overlaps(a: str, b: str) -> bool:
    return mountinfo.below(a, b) or mountinfo.below(b, a)


def recover(state_dir: str) -> list[str]:
    """Finish or undo every interrupted commit in `state_dir`.  Returns what it did."""
    jdir = os.path.join(os.path.abspath(state_dir), JOURNAL_DIR)
    done: list[str] = []
    try:
        names = sorted(os.listdir(jdir))
    except FileNotFoundError:
        return done
    ids = {m.group(1) for m in map(_JOURNAL_NAME.fullmatch, names) if m}
    for jid in sorted(ids):
        journal = journal_at(os.path.abspath(state_dir), jid)
        if not journal.lock(block=False):
            done.append(f"{jid}: in progress in another process; left alone")
            continue
        if not os.path.exists(journal.path):
            journal.remove()                # never reached its first change, or already done
            done.append(f"{jid}: no journal (nothing to do); removed")
            continue
        rec = None
        try:
            data = load_journal(journal)
            rec = Recovery(data)
            if data["phase"] == "applied":
                rec.finish()
                what = f"{jid}: finished (applied, {len(data['units'])} units)"
            else:
                rec.undo()
                what = f"{jid}: undone (was {data['phase']}, {len(data['units'])} units)"
            journal.remove()
            done.append(what + "".join(f"; {n}" for n in rec.notes))
        except ForgedJournal as e:
            journal.unlock(remove=True)
            done.append(f"{jid}: {SET_ASIDE}: {e}")
        except (OSError, CommitError, ValueError) as e:
            journal.unlock()
            done.append(f"{jid}: FAILED, journal kept: {e}")
        finally:
            if rec is not None:
                rec.close()
    return done
