"""`caper doctor`: is caper really in front of each agent on this machine?

For each agent CLI found on PATH: caper's hook is present and active (Claude
Code: not disabled, not overridden by managed-only hooks; Codex: the entry
trusted with the hash Codex computes, the project trusted, hooks on, a
sandbox mode caper can run in; Gemini: hooks on, a user-level entry that
--skip-trust cannot skip) and its command can start; whether the agent's
version lets the hook rewrite the call. Then the state directory, the gate
(a sandboxed `true` through it), and the kernel features caper uses. Every
problem comes with the exact fix. Exit status 1 if anything FAILs.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

from caper.front import claude_rules
from caper.front import hooks
from caper.fs.programs import find_program
from caper.report.workspace import find_workspace
from caper.request import RunRequest

OK, WARN, FAIL, INFO = "ok", "WARN", "FAIL", "--"
VERSION_TIMEOUT_S = 15
BINARIES = {"claude-code": "claude", "codex": "codex", "gemini": "gemini"}


@dataclass(frozen=True)
class Check:
    status: str
    what: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:4}  {self.what}" + (f"\n      fix: {self.fix}" if self.fix else "")


def _json(path: str) -> dict | None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _version(exe: str) -> str | None:
    try:   # from /: nothing of the project's is loaded by the way
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, cwd="/",
                           timeout=VERSION_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\d+\.\d+\.\d+", p.stdout)
    return m.group(0) if m else None


def _entries(agent: hooks.Agent, path: str) -> list[str]:
    """caper's hook commands in one settings file."""
    doc = _json(path) or {}
    groups = (doc.get("hooks") or {}).get(agent.event) if isinstance(doc.get("hooks"), dict) \
        else None
    return [h["command"] for g in groups or [] if isinstance(g, dict)
            for h in g.get("hooks") or [] if hooks._ours(h, agent)]


def _starts(command: str) -> str | None:
    """Why the hook command cannot start, or None: its program must exist."""
    try:
        exe = shlex.split(command)[0]
    except (ValueError, IndexError):
        return "it cannot be parsed"
    if not (os.path.isabs(exe) and os.access(exe, os.X_OK)) and shutil.which(exe) is None:
        return f"{exe} does not exist"
    return None


def check_agent(name: str, cwd: str) -> list[Check]:
    agent = hooks.AGENTS[name]
    # Doctor runs the agent's binary: never one an empty or relative PATH
    # entry finds in the project (an earlier run may have committed a ./claude).
    exe = find_program(BINARIES[name], os.environ.get("PATH"),
                       avoid=(os.path.realpath(cwd), find_workspace(cwd)))
    if exe is None:
        return [Check(INFO, f"{name}: not installed ({BINARIES[name]} is not on PATH, outside "
                            "the project)")]
    version = _version(exe)
    label = f"{name} {version or '(version unknown)'}"
    reinstall = f"caper install {name}"
    if name == "claude-code":
        files = dict(claude_rules.settings_files(cwd))
    else:   # Codex reads a project's hooks at its root
        files = {"user": hooks.settings_path(agent, "user"), "project": hooks.settings_path(
            agent, "project", hooks.codex_project_root(cwd) if name == "codex" else cwd)}
    found = {scope: _entries(agent, path) for scope, path in files.items()}
    found = {scope: cmds for scope, cmds in found.items() if cmds}
    if not found:
        return [Check(FAIL, f"{label}: caper's hook is not installed; the agent runs commands "
                            "without caper", reinstall)]
    out = []
    for scope, cmds in found.items():
        for cmd in cmds:
            why = _starts(cmd)
            if why:
                out.append(Check(FAIL, f"{label}: the hook in {files[scope]} cannot start ({why}); "
                                       "the agent then blocks every shell command", reinstall))
    return out + ACTIVE[name](label, found, files, cwd, version)


def _active_claude_code(label, found, files, cwd, version) -> list[Check]:
    docs = {scope: _json(path) or {} for scope, path in files.items()}
    if docs.get("managed", {}).get("allowManagedHooksOnly") and "managed" not in found:
        return [Check(FAIL, f"{label}: managed settings allow only managed hooks, so caper's "
                            f"hook in {', '.join(files[s] for s in found)} never runs",
                      f"ask the administrator to add caper's entry to "
                      f"{claude_rules.MANAGED_SETTINGS}")]
    off = [files[s] for s, d in docs.items() if d.get("disableAllHooks") is True]
    if off:
        return [Check(FAIL, f"{label}: disableAllHooks is set in {', '.join(off)}: caper's hook "
                            "never runs", f"remove disableAllHooks from {', '.join(off)}")]
    return [Check(OK, f"{label}: caper's hook is active ({', '.join(files[s] for s in found)}); "
                      "it rewrites each Bash call and applies your deny/ask rules")]


def _active_codex(label, found, files, cwd, version) -> list[Check]:
    try:
        config, _, parsed = hooks.codex_config()
    except ValueError as e:
        return [Check(FAIL, f"{label}: {e}", "fix the TOML, then caper install codex")]
    out = []
    if (parsed.get("features") or {}).get("hooks") is False:
        out.append(Check(FAIL, f"{label}: hooks are turned off ([features] hooks = false in "
                               f"{config})", f"remove that line from {config}"))
    for scope in found:
        path = files[scope]
        state = hooks.codex_hook_states(parsed, path, _json(path) or {})
        if state != "trusted":
            out.append(Check(FAIL, f"{label}: caper's hook in {path} is {state} in {config}, "
                                   "so Codex skips it and runs commands without caper",
                             f"caper install codex{' --project' if scope == 'project' else ''}"))
        if scope == "project":
            root = hooks.codex_project_root(cwd)
            if (parsed.get("projects") or {}).get(root, {}).get("trust_level") != "trusted":
                out.append(Check(FAIL, f"{label}: {root} is not a trusted project, so Codex "
                                       f"does not load {path}",
                                 f"trust it in Codex, or add [projects.{json.dumps(root)}] "
                                 f'trust_level = "trusted" to {config}, or caper install codex '
                                 "--user"))
    mode = parsed.get("sandbox_mode")
    if mode != "danger-full-access":
        out.append(Check(WARN, f"{label}: sandbox_mode is {mode or 'unset (workspace-write)'}; "
                               "inside Codex's own sandbox every gated command fails closed",
                         f'set sandbox_mode = "danger-full-access" in {config} (caper is the '
                         "sandbox), or start codex with --sandbox danger-full-access"))
    v = tuple(int(x) for x in version.split(".")) if version else None
    how = "rewrites each call (updatedInput)" if v and v >= hooks.CODEX_REWRITES_FROM else \
        "denies and asks the model to resubmit the wrapped command (one more model turn per " \
        "command; Codex before 0.171 takes no updatedInput)"
    if not any(c.status == FAIL for c in out):
        out.append(Check(OK, f"{label}: caper's hook is active and trusted "
                             f"({', '.join(files[s] for s in found)}); it {how}"))
    return out


def _active_gemini(label, found, files, cwd, version) -> list[Check]:
    # Any layer that turns hooks off turns caper's off, whichever holds it.
    off = [path for path in files.values()
           if ((_json(path) or {}).get("hooksConfig") or {}).get("enabled") is False]
    if off:
        return [Check(FAIL, f"{label}: hooksConfig.enabled is false in {', '.join(off)}: "
                            "caper's hook never runs",
                      f"remove hooksConfig.enabled = false from {', '.join(off)}")]
    if "user" not in found:
        return [Check(WARN, f"{label}: caper's hook is only in {files['project']}, which Gemini "
                            "skips with --skip-trust and in folders it does not trust",
                      "caper install gemini --user")]
    return [Check(OK, f"{label}: caper's hook is active ({files['user']}); it rewrites each "
                      "shell call")]


ACTIVE = {"claude-code": _active_claude_code, "codex": _active_codex, "gemini": _active_gemini}


def check_state_dir() -> list[Check]:
    from caper.fs import mountinfo
    from caper.errors import CaperError
    from caper.view.overlay import OverlaySnapshot
    from caper.state import default_state_dir
    state = default_state_dir()
    try:
        os.makedirs(state, mode=0o700, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=state, prefix=".doctor-")
        os.close(fd)
        os.unlink(probe)
        OverlaySnapshot.check_state_dir(state, mountinfo.read())
    except (OSError, CaperError) as e:
        return [Check(FAIL, f"state directory {state}: {e}",
                      "set CAPER_STATE_DIR to a writable directory on ext4, xfs, btrfs or tmpfs")]
    return [Check(OK, f"state directory {state} is usable")]


def check_gate() -> list[Check]:
    """A sandboxed `true` through the gate (or in this process with the
    gate off): the whole pipeline once."""
    from caper.front import gate
    from caper.state import default_state_dir
    where = tempfile.mkdtemp(prefix="caper-doctor-")
    t = time.monotonic()
    try:
        request = RunRequest("true", approver="allow", workspace=where, cwd=where, timeout=60.0)
        if os.environ.get("CAPER_NO_GATE") == "1":
            from caper.transaction import run_request
            out = run_request(request)
            ok, how, err = out.committed, "in this process (CAPER_NO_GATE=1)", out.reason
        else:
            answer = gate.request(default_state_dir(), request.to_wire())
            ok = "error" not in answer and answer["outcome"]["committed"]
            how = f"through the gate (pid {answer.get('gate_pid')})"
            err = answer.get("error") or answer.get("outcome", {}).get("reason")
    except Exception as e:   # any failure is the finding
        ok, how, err = False, "", f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(where, ignore_errors=True)
    ms = (time.monotonic() - t) * 1000
    if not ok:
        return [Check(FAIL, f"a sandboxed `true` failed: {err}",
                      "see the kernel checks above; `caper run -c true` shows the same error")]
    return [Check(OK, f"a sandboxed `true` ran {how} in {ms:.0f} ms")]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def check_kernel() -> list[Check]:
    out = []
    fs = _read("/proc/filesystems") or ""
    out.append(Check(OK, "kernel: overlayfs") if re.search(r"\boverlay\b", fs) else
               Check(FAIL, "kernel: overlayfs is not available", "modprobe overlay"))
    if os.geteuid() != 0:
        limits = [("/proc/sys/user/max_user_namespaces", "0", "sysctl -w user.max_user_namespaces"
                   "=15000"),
                  ("/proc/sys/kernel/unprivileged_userns_clone", "0",
                   "sysctl -w kernel.unprivileged_userns_clone=1"),
                  ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
                   "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")]
        bad = [(p, fix) for p, off, fix in limits if (_read(p) or "").strip() == off]
        out += [Check(FAIL, f"kernel: unprivileged user namespaces are off ({p})", fix)
                for p, fix in bad] or [Check(OK, "kernel: unprivileged user namespaces")]
    else:
        out.append(Check(OK, "kernel: user namespaces not needed (running as root)"))
    actions = _read("/proc/sys/kernel/seccomp/actions_avail") or ""
    out.append(Check(OK, "kernel: seccomp filters with SECCOMP_RET_TRACE") if "trace" in actions
               else Check(FAIL, "kernel: seccomp RET_TRACE is not available",
                          "a kernel built with CONFIG_SECCOMP_FILTER"))
    from caper.sandbox import limits
    cg = limits.sandbox_cgroups(1 << 30, None)
    cg.remove()
    if cg.memory is not None:
        out.append(Check(OK, "kernel: a memory cgroup can be made (the sandbox's memory limit)"))
    else:
        out.append(Check(WARN, "kernel: no memory cgroup is delegated to this user: the memory "
                               "limit falls back to RLIMIT_AS per process",
                         "run caper under a delegated cgroup, e.g. systemd-run --user --scope "
                         "-p Delegate=yes <agent>"))
    out.append(_openat2())
    return out


def _openat2() -> Check:
    """openat2(2) (Linux 5.6): given a NULL how, a kernel that has it says
    EFAULT, one that does not ENOSYS."""
    import ctypes
    import errno
    libc = ctypes.CDLL(None, use_errno=True)
    SYS_openat2 = 437                        # the same number on every architecture
    AT_FDCWD = -100
    if libc.syscall(SYS_openat2, AT_FDCWD, b"/", None, 24) == -1 and \
            ctypes.get_errno() == errno.ENOSYS:
        return Check(WARN, "kernel: no openat2 (Linux < 5.6): programs that use it see ENOSYS "
                           "in the sandbox too", "a Linux 5.6 or later kernel")
    return Check(OK, "kernel: openat2")


def run(cwd: str | None = None, agents: list[str] | None = None, sandbox: bool = True
        ) -> list[Check]:
    cwd = os.path.abspath(cwd or os.getcwd())
    checks = [c for name in (list(hooks.AGENTS) if agents is None else agents)
              for c in check_agent(name, cwd)]
    checks += check_state_dir() + check_kernel()
    if sandbox:
        checks += check_gate()
    return checks


def report(checks: list[Check]) -> tuple[str, int]:
    text = "\n".join(c.line() for c in checks)
    return text, 1 if any(c.status == FAIL for c in checks) else 0
