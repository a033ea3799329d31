"""What a run inherits from its caller: the one definition.

A command the user's shell starts inherits that shell's process context. A
command caper runs must get the same, whether it runs in the caller's own
process (`caper run --no-gate`, CAPER_NO_GATE=1, the API) or in the gate,
which is another process with a context of its own (`caper serve` sets
umask 077 for its state files). The caller takes its context with
`Caller.here()`, the gate request carries it (`to_json`, `from_json`), and
the run gives it to the command (caper.sandbox.trace; csrc/ns.c `apply_caller` sets
it in the command's process just before exec).

Inherited (carried and applied):
  cwd            the working directory
  env            the environment, less caper's own variables and the caller's
                 credentials (caper.config.Config.command_env: *_TOKEN,
                 *_SECRET, *_KEY, *PASSWORD*, token-shaped values; [env]
                 allow passes some); the locale is LANG/LC_* in it
  umask
  rlimits        every resource limit (`ulimit -n`, `-s`, `-c`, ...); caper's
                 own memory limit, where set, is applied after them
  nice           the scheduling priority
  gid, groups    the effective gid and the supplementary groups
  shell          the shell that runs a command string: /bin/sh unless the
                 caller says (`caper run --shell`; the agents' hooks say bash,
                 as their shell tools run bash)
  stdin          where the caller gives it (`caper run --stdin`, a
                 Caller.here(stdin=True)): the command reads the caller's fd 0
                 where it is an anonymous pipe, else (a file, a FIFO, a socket:
                 the host's own objects) its bytes through a pipe caper relays;
                 else /dev/null. Never a terminal: fd 0 is the host tty open
                 read-write, so a run not yet approved could write escapes to
                 it (an OSC 52 clipboard write), turn its echo off or resize it
                 (Caller.here refuses; pipe the input instead). An fd does not travel in a gate request: such
                 a run is made in the caller's own process.

Checked, never carried: the uid, the mount, user and pid namespaces and the
root directory. The gate serves only a caller that shares them with it
(caper.front.gate); any other caller's command runs in the caller's own process.

Not inherited, on purpose (the sandbox, SECURITY.md): signal dispositions and
the signal mask (reset to the defaults, as a shell's child gets them),
the controlling terminal (the sandbox is a new session), stdin unless given,
file descriptors above 2, capabilities, the network, the CPU set (the tracer
and the command share one CPU, CAPER_F_SHARE_CPU).

Standard library only, and cheap: the gate's client imports it per command
(a dataclass would bring inspect along, ~8 ms of every hook's `caper run`).
"""
from __future__ import annotations

import os
import resource

DEFAULT_SHELL = "/bin/sh"
_RLIMITS = sorted((getattr(resource, n), n) for n in dir(resource) if n.startswith("RLIMIT_"))
_U64 = (1 << 64) - 1


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for a
    moment, for every thread)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)       # kernels before 4.7: no Umask line
    os.umask(mask)
    return mask


def _stdin_for_the_command() -> int:
    """A new pipe caper fills with fd 0's bytes: fd 0 itself is the host's
    own object, whose mode, owner, content, peer or other readers a run not
    yet approved would reach through the descriptor (round 8: `--stdin <
    FILE` was chmod'ed and rewritten by a blocked run; adv10a 04: the
    caller's pipe was written through /proc/self/fd/0 and set O_NONBLOCK)."""
    import threading    # here: only --stdin needs it, and the gate's client
    r, w = os.pipe()    # imports this module for every command
    os.set_inheritable(r, False)

    def relay() -> None:
        try:
            while chunk := os.read(0, 1 << 16):
                os.write(w, chunk)
        except OSError:
            pass            # the command closed its end, or stdin failed: its EOF
        finally:
            os.close(w)
    threading.Thread(target=relay, name="caper-stdin-relay", daemon=True).start()
    return r


class Caller:
    __slots__ = ("cwd", "env", "umask", "rlimits", "nice", "gid", "groups", "shell", "uid",
                 "stdin_fd")

    def __init__(self, cwd: str, env: dict[str, str], umask: int,
                 rlimits: tuple[tuple[int, int, int], ...], nice: int, gid: int,
                 groups: tuple[int, ...], shell: str = DEFAULT_SHELL, uid: int = -1,
                 stdin_fd: int | None = None):
        self.cwd, self.env, self.umask = cwd, env, umask
        self.rlimits = rlimits          # (RLIMIT_*, soft, hard), unsigned
        self.nice, self.gid, self.groups, self.shell = nice, gid, groups, shell
        self.uid = uid                  # checked by the gate, never applied
        self.stdin_fd = stdin_fd        # the caller's stdin, given to the command; None: /dev/null

    @classmethod
    def here(cls, shell: str | None = None, cwd: str | None = None,
             env: dict[str, str] | None = None, stdin: bool = False) -> "Caller":
        """This process's context (cwd and env may be given instead);
        stdin: give the command this process's stdin, which must not be a
        terminal (ValueError)."""
        if stdin and os.isatty(0):
            raise ValueError("--stdin: caper's stdin is a terminal, which a run not yet approved "
                             "could write to, or change the settings of; pipe the input instead "
                             "(`cat input | caper run --stdin ...`)")
        return cls(cwd=cwd or os.getcwd(), env=dict(os.environ if env is None else env),
                   umask=_umask(),
                   rlimits=tuple((r, *(v & _U64 for v in resource.getrlimit(r)))
                                 for r, _ in _RLIMITS),
                   nice=os.getpriority(os.PRIO_PROCESS, 0), gid=os.getegid(),
                   groups=tuple(sorted(os.getgroups())), shell=shell or DEFAULT_SHELL,
                   uid=os.geteuid(), stdin_fd=_stdin_for_the_command() if stdin else None)

    def argv(self, command: str) -> list[str]:
        return [self.shell, "-c", command]

    def to_json(self) -> dict:
        if self.stdin_fd is not None:
            raise ValueError("a caller's stdin does not travel in a gate request")
        return {"cwd": self.cwd, "env": self.env, "umask": self.umask,
                "rlimits": [list(r) for r in self.rlimits], "nice": self.nice, "gid": self.gid,
                "groups": list(self.groups), "shell": self.shell, "uid": self.uid}

    @classmethod
    def from_json(cls, doc: dict) -> "Caller":
        """A gate request's caller; any malformed field is a ValueError."""
        def ints(v, n: int | None = None) -> tuple[int, ...]:
            if not isinstance(v, list) or not all(type(x) is int and x >= 0 for x in v) \
                    or (n is not None and len(v) != n):
                raise ValueError(f"not a list of {n or 'any number of'} unsigned ints: {v!r}")
            return tuple(v)
        env, cwd, shell = doc["env"], doc["cwd"], doc.get("shell", DEFAULT_SHELL)
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in env.items())):
            raise ValueError("env: not a mapping of strings")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise ValueError(f"cwd: not an absolute path: {cwd!r}")
        if not isinstance(shell, str) or not shell or "\0" in shell:
            raise ValueError(f"shell: {shell!r}")
        if not isinstance(doc["rlimits"], list):
            raise ValueError("rlimits: not a list")
        rlimits = tuple(ints(r, 3) for r in doc["rlimits"])
        if any(max(r) > _U64 for r in rlimits):
            raise ValueError("rlimits: out of range")
        umask, nice, gid, uid = doc["umask"], doc["nice"], doc["gid"], doc.get("uid", -1)
        if not (type(umask) is int and 0 <= umask <= 0o777 and type(nice) is int
                and -20 <= nice <= 19 and type(gid) is int and gid >= 0 and type(uid) is int):
            raise ValueError("umask, nice, gid or uid out of range")
        return cls(cwd=cwd, env=dict(env), umask=umask, rlimits=rlimits, nice=nice, gid=gid,
                   groups=ints(doc["groups"]), shell=shell, uid=uid)

    def not_reproducible(self) -> str | None:
        """Why this process (the gate) cannot give a command this context,
        or None. Root can set everything; another user can lower limits and
        priority, not raise them, and cannot change its groups."""
        if os.geteuid() == 0:
            return None
        here = Caller.here()
        if (self.gid, self.groups) != (here.gid, here.groups):
            return "the caller's groups differ from the gate's"
        hard = {r: h for r, _, h in here.rlimits}
        for r, _, h in self.rlimits:
            if h > hard.get(r, _U64):
                return f"the caller's hard limit {dict((v, k) for v, k in _RLIMITS).get(r, r)} " \
                       "is above the gate's"
        if self.nice < here.nice:
            return "the caller's priority is above the gate's"
        return None
