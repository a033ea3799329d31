"""caper's exceptions. One class per kind of failure:

* CaperError                  base of everything caper raises
  + SetupError                the sandbox could not be built (namespaces, mounts, seccomp)
  |   + UnsupportedKernelError   a kernel feature caper needs is missing here
  + ExecError                 the command could not be executed (not found, not executable)
  + TraceError                the tracer lost control of the sandbox (it was killed)
  + ConfigError               caper was called with bad arguments (or a bad config file)
  + ReportError               the effect report could not be built (the run is blocked)

Native failures arrive as a step code plus errno; `from_native` maps each
step to its class in one place, and a test checks that every step is mapped.
"""
from __future__ import annotations

import errno as _errno
import os


class CaperError(Exception):
    """Base class: every failure caper reports."""

    def __init__(self, message: str, *, step: str | None = None, err: int = 0):
        super().__init__(message)
        self.step = step
        self.errno = err


class SetupError(CaperError):
    """Building the sandbox failed before the command started."""


class UnsupportedKernelError(SetupError):
    """The kernel lacks something caper needs (user namespaces, seccomp, ...)."""


class ExecError(CaperError):
    """The command could not be executed."""


class TraceError(CaperError):
    """The tracer lost control of the sandbox; the sandbox was killed."""


class ConfigError(CaperError):
    """caper was called with bad arguments."""


class ReportError(CaperError):
    """The effect report could not be built: without evidence, no approval."""


# caper_step names (without CAPER_STEP_) -> exception class.
STEP_ERRORS: dict[str, type[CaperError]] = {
    "NONE": CaperError,
    "PIPE": SetupError,
    "CLONE": SetupError,
    "USERNS_MAP": SetupError,
    "MOUNT_PRIVATE": SetupError,
    "MOUNT_PROC": SetupError,
    "MOUNT_DEV": SetupError,
    "MOUNT_SYS": SetupError,
    "MOUNT_ROOT": SetupError,
    "PIVOT_ROOT": SetupError,
    "LOOPBACK": SetupError,
    "CGROUP": SetupError,
    "CAPS": SetupError,
    "NO_NEW_PRIVS": SetupError,
    "SECCOMP": SetupError,
    "SEIZE": SetupError,
    "CHDIR": ExecError,
    "EXEC": ExecError,
    "RLIMIT": SetupError,
    "CALLER": SetupError,
    "WAIT": TraceError,
    "EMIT": TraceError,
    "OUTPUT": TraceError,
    "CONFIG": ConfigError,
}

# errnos that mean "this kernel or host cannot do it", with a hint.
_KERNEL_HINTS = {
    _errno.ENOSYS: "the kernel lacks this call",
    _errno.EINVAL: "the kernel rejected the request (missing feature?)",
}


def from_native(step: str, err: int, detail: str) -> CaperError:
    """The exception for a native failure: names the call, its object and errno."""
    cls = STEP_ERRORS.get(step, CaperError)
    reason = os.strerror(err) if err else "failed"
    message = f"{detail}: {reason}" if detail else f"{step.lower()}: {reason}"
    if cls is SetupError and err in _KERNEL_HINTS and step in ("CLONE", "SECCOMP", "USERNS_MAP"):
        cls = UnsupportedKernelError
        message += f" ({_KERNEL_HINTS[err]})"
    return cls(message, step=step, err=err)
