"""Where caper keeps its state: journals, locks, scratch space, sessions, held
runs, the hooks' task records and the gate's socket. Light on purpose: the
CLI's fast path imports it.

Everything in the state directory is trusted by caper (a held run's record
names what `caper commit` applies; the gate's socket receives the caller's
environment), so `state_dir()` accepts it only when nobody else can write
there: the directory and each directory above it belong to the caller or to
root and are not writable by others or another group (unless sticky, like
/tmp), and the directory itself has no group or other access at all.

Every state directory caper makes or accepts holds MARKER: a run's commit
never changes anything at or below a directory that holds one (the same
user's other state directories, which caper does not know of and so cannot
hide: caper.commit.plan), and never makes one.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from contextlib import contextmanager
from typing import Iterator, Mapping

from caper.errors import ConfigError

# How long caper keeps a run's version that could not be committed (the
# workspace changed meanwhile) for the user to take: then it is deleted.
KEPT_S = 7 * 86400
ROOT_STATE_DIR = "/var/lib/caper"   # root's default


RECORD_KEY = os.path.join("tasks", "key")
# In every state directory caper makes or accepts (state_dir(), record_key()).
MARKER = "CAPER-STATE"
MARKER_TEXT = b"caper state directory: no run of caper changes what is in it\n"
KEY_BYTES = 32
KEY_PINNED_S = 3 * 86400    # a pinned key not used for this long leaves the keyring


def record_key(state: str) -> bytes:
    """The state directory's record key: records an agent's file tools could
    write (call, prompt, held-run records and commit journals) carry an HMAC
    under it.

    It is kept twice: in RECORD_KEY (32 random bytes, 0600, made on first
    use, whole, by link(), so that a hook starting at the same moment reads
    all of it or makes none), which outlives a reboot, and pinned in the
    kernel's user keyring (a `user` key named by the state directory), which
    a file tool cannot write. While it is pinned the keyring's copy is the
    key: a file replaced or removed since (an agent's own file tool wrote
    its own 32 bytes there, to MAC records of its own) is put back, so the
    records made under the replacement do not verify. Where there is no
    keyring (a container whose seccomp filter refuses keyctl, as Docker's
    does), or after a reboot until the first use pins it again, the file is
    the key. A file that is not a key (wrong length, not a regular file) is
    replaced by a new key: records made under the old one are then not
    caper's, never a refusal of all later work. caper's sandbox refuses
    keyctl, add_key and request_key, so a sandboxed command cannot read the
    pinned key."""
    state = os.path.realpath(state)
    path = os.path.join(state, RECORD_KEY)
    name = "caper-record-key:" + hashlib.sha256(os.fsencode(state)).hexdigest()[:32]
    pinned = _keyring_read(name)
    on_file = _read_key(path)
    if pinned is not None:
        if on_file != pinned:
            try:
                _write_key(path, pinned, replace=True)
            except ConfigError:
                pass          # the pinned key holds; a reboot then makes a new one
        _keyring_add(name, pinned)          # keeps it pinned: its timeout starts again
        return pinned
    if on_file is None:
        _write_key(path, os.urandom(KEY_BYTES), replace=os.path.lexists(path))
        on_file = _read_key(path)
        if on_file is None:
            raise ConfigError(f"{path}: could not make a record key there", step="state")
    _keyring_add(name, on_file)
    return on_file


def _read_key(path: str) -> bytes | None:
    """The key in the file; None if there is none or it is not a key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        key = os.read(fd, 2 * KEY_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return key if len(key) == KEY_BYTES else None


def _write_key(path: str, key: bytes, replace: bool) -> None:
    """key into path, whole: by link() where there is no file (a concurrent
    maker's wins), by rename() over one that is not the key."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        # a directory with a key is a state directory
        _write_marker(os.path.dirname(os.path.dirname(path)))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.write(fd, key)
        finally:
            os.close(fd)
        if replace:
            os.rename(tmp, path)
        else:
            os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the record key ({e.strerror})", step="state",
                          err=e.errno) from e
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


# keyctl(2) and add_key(2) by number (the C library has no wrapper for them).
_KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}
_USER_KEYRING = -4                      # KEY_SPEC_USER_KEYRING
_KEYCTL_SETPERM, _KEYCTL_SEARCH, _KEYCTL_READ, _KEYCTL_SET_TIMEOUT = 5, 10, 11, 15
_KEY_PERM = 0x3f3f0000                  # possessor and user: all; nobody else anything


def _keyctl():
    """(the syscall function, (add_key's number, keyctl's), ctypes), or None
    where the machine is not one caper knows the numbers of, or there is no
    C library to call them through."""
    nums = _KEY_SYSCALLS.get(os.uname().machine)
    if nums is None:
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None
    libc.syscall.restype = ctypes.c_long
    return libc.syscall, nums, ctypes


def _keyring_read(name: str) -> bytes | None:
    """The pinned key called name; None if there is none or no keyring."""
    k = _keyctl()
    if k is None:
        return None
    syscall, (_, keyctl), ct = k
    serial = syscall(ct.c_long(keyctl), ct.c_long(_KEYCTL_SEARCH), ct.c_long(_USER_KEYRING),
                     b"user", name.encode(), ct.c_long(0))
    if serial < 0:
        return None
    buf = ct.create_string_buffer(2 * KEY_BYTES)
    n = syscall(ct.c_long(keyctl), ct.c_long(_KEYCTL_READ), ct.c_long(serial), buf,
                ct.c_size_t(len(buf)))
    return buf.raw[:n] if n == KEY_BYTES else None


def _keyring_add(name: str, key: bytes) -> None:
    """Pin key as name in the user keyring, for KEY_PINNED_S from now (a
    key already there takes the new bytes); nothing where there is no
    keyring or no room in it (the file is then the key)."""
    k = _keyctl()
    if k is None:
        return
    syscall, (add_key, keyctl), ct = k
    serial = syscall(ct.c_long(add_key), b"user", name.encode(), key, ct.c_size_t(len(key)),
                     ct.c_long(_USER_KEYRING))
    if serial >= 0:
        syscall(ct.c_long(keyctl), ct.c_long(_KEYCTL_SETPERM), ct.c_long(serial),
                ct.c_ulong(_KEY_PERM))
        syscall(ct.c_long(keyctl), ct.c_long(_KEYCTL_SET_TIMEOUT), ct.c_long(serial),
                ct.c_ulong(KEY_PINNED_S))


def default_state_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get("CAPER_STATE_DIR"):
        return env["CAPER_STATE_DIR"]
    return ROOT_STATE_DIR if os.geteuid() == 0 else _user_state_dir(env)


def _user_state_dir(env: Mapping[str, str]) -> str:
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"),
                                                     ".local", "state")
    return os.path.join(base, "caper")


def known_state_dirs(env: Mapping[str, str]) -> list[str]:
    """The state directories caper knows a caller with env may use: its
    CAPER_STATE_DIR, root's and the user's default. (Another caller's
    CAPER_STATE_DIR elsewhere is not known.)"""
    return list(dict.fromkeys([default_state_dir(env), ROOT_STATE_DIR, _user_state_dir(env)]))


def state_dir(path: str | None = None) -> str:
    """The state directory (default_state_dir() if not given), made 0700 if
    missing, checked (see the module's docstring); its real path. A
    directory of the caller's with only group/other read access is tightened
    to 0700 (nobody else could have written in it); anything else is refused
    with the fix. Its record key is made and pinned here, before any agent
    tool could plant one (record_key)."""
    path = os.path.abspath(path or default_state_dir())
    me = os.geteuid()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        real = os.path.realpath(path)
        st = os.lstat(real)
    except OSError as e:
        raise ConfigError(f"state directory {path}: {e.strerror}", step="state",
                          err=e.errno) from e
    fix = (f"choose a directory of your own (CAPER_STATE_DIR), or fix it: "
           f"chown {me} {real} && chmod 700 {real}")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"state directory {real} is not a directory; {fix}", step="state")
    if st.st_uid != me:
        raise ConfigError(f"state directory {real} belongs to uid {st.st_uid}, not to you "
                          f"({me}): another user could plant records or a gate in it; {fix}",
                          step="state")
    if st.st_mode & 0o022:
        raise ConfigError(f"state directory {real} is writable by group or others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}): they could plant records "
                          f"or a gate in it; {fix}", step="state")
    if st.st_mode & 0o077:
        os.chmod(real, 0o700)
    parent = os.path.dirname(real)
    while True:
        pst = os.lstat(parent)
        # Group-writable is the caller's own business where the group is theirs
        # (a home directory of a user-private group, 0775).
        shared = pst.st_mode & 0o002 or pst.st_mode & 0o020 and pst.st_gid != os.getegid()
        if pst.st_uid not in (0, me) or (shared and not pst.st_mode & stat.S_ISVTX):
            raise ConfigError(f"state directory {real}: {parent} above it can be changed by "
                              f"another user (uid {pst.st_uid}, mode "
                              f"{stat.S_IMODE(pst.st_mode):04o}), who could swap the state "
                              f"directory; choose one elsewhere (CAPER_STATE_DIR)", step="state")
        if parent == "/":
            _mark(real)
            try:
                record_key(real)     # pinned from the first use on: see record_key
            except ConfigError:
                pass                 # (a read-only state directory: records then fail)
            return real
        parent = os.path.dirname(parent)


def _mark(real: str) -> None:
    """Write MARKER into the state directory real, if it is not there. One
    that holds a record key but no marker is refused, unless it is a default
    one (hidden from every run): a run could have made it, key and records
    MAC'd under it, for a later caper to take as its state."""
    path = os.path.join(real, MARKER)
    if not os.path.lexists(path) and os.path.lexists(os.path.join(real, RECORD_KEY)) \
            and real not in {os.path.realpath(d) for d in (ROOT_STATE_DIR,
                                                            _user_state_dir(os.environ))}:
        raise ConfigError(f"state directory {real} holds a record key ({RECORD_KEY}) but no "
                          f"{MARKER}: caper did not make it, and a run could have planted its "
                          f"records; choose a new directory (CAPER_STATE_DIR), or, if it is "
                          f"the state of a caper from before the marker, add it: printf "
                          f"'{MARKER_TEXT.decode().strip()}\\n' > {path}", step="state")
    _write_marker(real)


def _write_marker(state: str) -> None:
    path = os.path.join(state, MARKER)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:
        return
    except OSError as e:
        raise ConfigError(f"state directory {state}: open({MARKER}): {e.strerror}", step="state",
                          err=e.errno) from e
    try:
        os.write(fd, MARKER_TEXT)
    finally:
        os.close(fd)


def inside(state: str, path: object) -> str:
    """path, if it is an absolute, normalised path strictly inside the state
    directory (a record read back names it); else ConfigError."""
    if not isinstance(path, str) or not os.path.isabs(path) or os.path.normpath(path) != path \
            or not path.startswith(state.rstrip("/") + "/"):
        raise ConfigError(f"a record in {state} names {path!r}, which is not inside the state "
                          "directory; refusing it", step="state")
    return path


@contextmanager
def workspace_lock(state_dir: str, workspace: str) -> Iterator[None]:
    """Runs on one workspace take turns; runs on different ones go in parallel."""
    locks = os.path.join(state_dir, "locks")
    os.makedirs(locks, mode=0o700, exist_ok=True)
    name = hashlib.sha256(os.fsencode(workspace)).hexdigest()[:24] + ".lock"
    fd = os.open(os.path.join(locks, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
