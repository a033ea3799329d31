"""System calls the os module lacks, shared by the commit engines."""
from __future__ import annotations

import ctypes
import os

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                            ctypes.c_uint]
_libc.syncfs.argtypes = [ctypes.c_int]


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
