"""System calls the os module lacks, and safe opens, shared by the commit engines
and the report."""
from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                            ctypes.c_uint]
_libc.syncfs.argtypes = [ctypes.c_int]
_libc.open_by_handle_at.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]


def renameat2(dfd: int, old: str, new: str, flags: int, new_dfd: int | None = None) -> None:
    """renameat2(dfd, old, new_dfd or dfd, new, flags); OSError naming both paths."""
    if _libc.renameat2(dfd, os.fsencode(old), dfd if new_dfd is None else new_dfd,
                       os.fsencode(new), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), old, None, new)


def syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_by_handle(mount_fd: int, handle_type: int, handle: bytes, flags: int) -> int:
    """open_by_handle_at(2): the inode a file handle names, on the filesystem
    of mount_fd (needs CAP_DAC_READ_SEARCH)."""
    # struct file_handle { unsigned int handle_bytes; int handle_type; unsigned char f_handle[]; }
    buf = ctypes.create_string_buffer(len(handle).to_bytes(4, sys.byteorder)
                                      + handle_type.to_bytes(4, sys.byteorder, signed=True) + handle)
    fd = _libc.open_by_handle_at(mount_fd, buf, flags)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), "open_by_handle_at")
    return fd


def open_quiet(path: str, flags: int, dir_fd: int | None = None) -> int:
    """os.open for reading with O_NOATIME where caper may (its own files;
    any file, as root): caper reads host files because of what a run did,
    and a read that moved their access times would let a blocked run choose
    which host files' atimes move (read file i or not), for anyone to stat.
    Another user's file, caper not root (EPERM), is opened without it."""
    try:
        return os.open(path, flags | os.O_NOATIME, dir_fd=dir_fd)
    except PermissionError as e:
        if e.errno != errno.EPERM:
            raise
        return os.open(path, flags, dir_fd=dir_fd)


def stamp(path: str) -> tuple[int, int]:
    """The file's (mtime_ns, size), (0, -1) when there is none: the key of a
    cache that reads the file again only when it changed."""
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def read_quiet(path: str, limit: int) -> bytes:
    """The first `limit` bytes (all, for -1) of the file at path, opened as
    open_quiet opens."""
    with os.fdopen(open_quiet(path, os.O_RDONLY | os.O_CLOEXEC), "rb") as f:
        return f.read(limit)


def open_regular(name: str, dir_fd: int) -> int:
    """A read-only fd on name (below dir_fd, the last component not followed)
    if it is a regular file; OSError (EINVAL) for anything else. The object
    is looked at by an O_PATH fd first, which opens nothing: opening a FIFO,
    even non-blocking, releases a writer waiting on the host, and opening a
    device runs its driver (a watchdog arms, a tape rewinds on close).
    Opened as open_quiet opens: its access time does not move."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", name)
        return open_quiet(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)
