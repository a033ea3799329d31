"""caper's exceptions. One class per kind of failure:

* CaperError                  base of everything caper raises
  + SetupError                the sandbox could not be built (namespaces, mounts, seccomp)
  |   + UnsupportedKernelError   a kernel feature caper needs is missing here
  + ExecError                 the command could not be executed (not found, not executable)
  + TraceError                the tracer lost control of the sandbox (it was killed)
  |   + DecodeError           a record on the event pipe is malformed (the C side broke its contract)
  + ConfigError               caper was called with bad arguments (or a bad config file)
  |   + BadRequest            a run request's option is malformed (caper.request); nothing ran
  + ReportError               the effect report could not be built (the run is blocked)
  + ApproverError             an approver gave no usable verdict (becomes a fail-closed block)
  + CommitError               the commit was refused, or failed and was undone
  |   + CommitConflict        the host changed paths the run also changed; nothing touched
  |   + CommitIncomplete      the undo (or the clean-up) failed: the journal is kept for recover
  + BtrfsError                a btrfs operation failed
      + BtrfsConflict         the workspace changed after the snapshot; nothing touched

Native failures arrive as a step code plus errno; `from_native` maps each
step to its class in one place, and a test checks that every step is mapped.
"""
from __future__ import annotations

import errno as _errno
import os
from typing import Iterable


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


class DecodeError(TraceError):
    """A record on the event pipe is malformed (the C side broke its contract)."""


class ConfigError(CaperError):
    """caper was called with bad arguments."""


class BadRequest(ConfigError):
    """A run request's option is malformed or unknown (caper.request): nothing ran."""


class ReportError(CaperError):
    """The effect report could not be built: without evidence, no approval."""


class ApproverError(CaperError):
    """Why an approver gave no usable verdict (becomes a fail-closed block)."""


class CommitError(CaperError):
    """The commit was refused, or failed and was undone: the host tree is unchanged."""


class CommitConflict(CommitError):
    """The host changed, during the run, paths the run also changed.

    Raised before anything is touched; the upper dirs are left as they are."""

    def __init__(self, message: str, paths: Iterable[str] = ()):
        super().__init__(message, step="conflict")
        self.paths = list(paths)


class CommitIncomplete(CommitError):
    """The commit did not end cleanly: the undo after a failure failed (`applied`
    False), or the cleanup after the applied mark failed (`applied` True: the
    changes stand).  The journal is kept; `recover(state_dir)` completes it."""

    def __init__(self, message: str, journal: str, applied: bool):
        super().__init__(message, step="commit")
        self.journal = journal
        self.applied = applied


class ForgedJournal(CommitError):
    """A commit journal whose MAC does not verify: set aside, nothing it names touched."""

    def __init__(self, message: str):
        super().__init__(message, step="journal")


class BtrfsError(CaperError):
    """A btrfs operation failed (the message names the call, the object and errno)."""


class BtrfsConflict(BtrfsError):
    """The workspace changed after the snapshot was taken; nothing was touched.
    `.paths`: the workspace paths that changed."""

    def __init__(self, message: str, paths: Iterable[str] = ()):
        super().__init__(message, step="conflict")
        self.paths = list(paths)


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
    "ROOT_VIEW": SetupError,
    "PROXY": SetupError,
}

CHROOT_HINT = ("caper's / is not the root of its mount namespace (a chroot?): the sandbox's "
               "paths would not be the command's, so caper refuses to run here; run it "
               "outside the chroot, or where / is a mount namespace's root (unshare -m and "
               "pivot_root, a container)")

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
    if step == "ROOT_VIEW":
        message = f"{detail}: {CHROOT_HINT}"
    return cls(message, step=step, err=err)
