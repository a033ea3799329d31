"""Write-ahead journals of the commit engines (caper.commit.engine, caper.view.btrfs).

One record per commit, `<state_dir>/<kind>/<id>.json`, replaced atomically
and durably (tmp, fsync, rename, fsync dir), with `<id>.lock` held by the
process that owns it, so recovery can tell an abandoned commit from a
running one. A record carries an HMAC under the state directory's record
key (caper.state.record_key): recovery acts on what a record names (it
empties upper dirs, renames, sets modes), and an agent's own file tools can
write the state directory; a record that does not verify is set aside,
never acted on. Every step that changes the filesystem, here and in the
engines, calls `step()` first: the crash tests set `fault_hook` to kill the
process at each one.
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import stat
from typing import Callable

from caper.errors import ForgedJournal
from caper.state import RECORD_KEY, record_key

# Fault injection for the crash tests, shared by both commit engines.
fault_hook: Callable[[str], None] | None = None


def step(what: str) -> None:
    """Called with a short description before each filesystem change."""
    if fault_hook is not None:
        fault_hook(what)


def write_atomic(path: str, data: bytes, mode: int = 0o600, tmp: str | None = None) -> None:
    """Replace `path` with `data`, atomically and durably: a temporary file
    beside it, fsync, rename, fsync of the directory. Both steps are fault
    points for the crash tests.

    The temporary name is created new (O_EXCL|O_NOFOLLOW) in the target's
    directory, opened once: a symlink or file planted at that name (by a
    run a user approved, say) is removed, never written through."""
    name = os.path.basename(tmp or path + ".tmp")
    step(f"write {os.path.basename(path)}")
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, mode, dir_fd=dfd)
        except FileExistsError:   # left by a crash, or planted: unlink never follows
            os.unlink(name, dir_fd=dfd)
            fd = os.open(name, flags, mode, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        step(f"rename {os.path.basename(path)}")
        os.rename(name, os.path.basename(path), src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    finally:
        os.close(dfd)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


SET_ASIDE = "not caper's, set aside"     # what recovery says of a ForgedJournal


def record_key_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECORD_KEY)


class Journal:
    def __init__(self, state_dir: str, kind: str, jid: str):
        self.state_dir, self.kind = state_dir, kind
        self.dir = os.path.join(state_dir, kind)
        self.id = jid
        self.path = os.path.join(self.dir, jid + ".json")
        self.lock_path = os.path.join(self.dir, jid + ".lock")
        self.lock_fd: int | None = None
        self._key: bytes | None = None     # record_key, read once per journal

    def lock(self, block: bool) -> bool:
        os.makedirs(self.dir, exist_ok=True)
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            # Between our open and our flock the owner may have finished and
            # unlinked the file: a lock on an unlinked inode guards nothing
            # (two processes could each "own" the journal). Only the inode
            # the path names now counts.
            try:
                current = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                self.lock_fd = fd
                return True
            os.close(fd)

    def _mac(self, data: dict) -> str:
        body = json.dumps(["journal", self.kind, self.id, data], sort_keys=True,
                          separators=(",", ":"))
        if self._key is None:      # a commit writes its journal at each phase
            self._key = record_key(self.state_dir)
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def write(self, data: dict) -> None:
        """Atomically replace the record, durably, under its MAC."""
        record = {**data, "mac": self._mac(data)}
        write_atomic(self.path, json.dumps(record, separators=(",", ":")).encode("ascii"))

    def read(self) -> dict | None:
        """The record, if it is a regular file of the caller's holding a JSON
        object whose MAC verifies (its fields are checked by the engine that
        wrote it). One that does not verify is renamed to `<id>.rejected`,
        out of recovery's way, and raises ForgedJournal."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise ValueError(f"journal {self.path} is not a file of yours; not read")
            raw = f.read()
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        # Written whole by rename (write_atomic), so a crash leaves no torn
        # record: one that does not parse or verify was written by someone else.
        mac = data.pop("mac", None) if isinstance(data, dict) else None
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac(data)):
            aside = os.path.join(self.dir, self.id + ".rejected")
            os.rename(self.path, aside)
            raise ForgedJournal(f"journal {self.path}: not a record caper wrote (it does not "
                                f"parse, or its MAC does not verify under "
                                f"{record_key_path(self.state_dir)}); nothing it names was "
                                f"touched; set aside as {aside}")
        return data

    def remove(self) -> None:
        step("journal-remove")
        for p in (self.path, self.path + ".tmp"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        fsync_dir(self.dir)
        self.unlock(remove=True)

    def unlock(self, remove: bool = False) -> None:
        if self.lock_fd is not None:
            if remove:
                try:
                    os.unlink(self.lock_path)
                except FileNotFoundError:
                    pass
            os.close(self.lock_fd)
            self.lock_fd = None
