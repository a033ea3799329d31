"""`policy`: the offline approver. No network, no model, deterministic.

It judges what the run *did* (the effect report), not what the command
says, and weighs each effect against what the task and the command
*declare*: `rm -rf build` declares the deletion of build/, "delete the
legacy directory" declares legacy/, `make clean` declares nothing specific.
An effect outside every declaration, in a harmful category (tracked files
destroyed, writes outside the workspace, persistence, secrets leaving,
escapes ...), blocks; a declared but risky one, or one it cannot place,
is *unsure* (auto hands those to the LLM, or to on_unsure); everything else
is the ordinary work of a coding agent and is allowed.

It judges every change of the run (Report.all_changes, before the budget
aggregated any), each class of effect in one method of _Judge: persistence
by path and file role (config files by the keys they gained), the shared
temp dirs, .git, workspace files (tracked, untracked, ignored: only build
outputs and caches are expendable), privilege, permissions, databases,
dependency sources, scope against the task, the git state lost, the
network. The changes a verdict rests on are named in Decision.flagged, so
the report shown (and given to the LLM under auto) lists them.

The lists it uses are data (caper/data/policy.toml, extended by [policy] in
config.toml); the reasoning is the code below.
"""
from __future__ import annotations

import fnmatch
import functools
import glob
import ipaddress
import itertools
import json
import os
import re
import shlex
import shutil
import socket
import stat
import sys
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Iterable

from caper.config import config_path
from caper.display import quote
from caper.fs.mountinfo import below
from caper.fs.syscalls import stamp
from caper.report import bytecode, configkeys
from caper.report.content import SCHEMA_CODE
from caper.judge.agent_config import programs_run
from caper.judge.base import ApprovalRequest, Decision
from caper.report.build import CHANGES_NOT_SHOWN, GENERIC_SHAPES, LINEAGE_MORE
from caper.report.secrets import Protected, default_patterns, glob_regex, protected_for
from caper.report.workspace import GIT_ROUTINE, PathView, place
from caper.state import default_state_dir

_MODE = re.compile(r"mode (\d+)->(\d+)")
# An ACL entry (caper.commit.fsops.grants) that gives no write.
_READ_GRANT = re.compile(r"(?:default )?acl (?:user|group):\d+:[r-]-[x-]")
_OWNER = re.compile(r"owner (\d+):(\d+)->(\d+):(\d+)")


class Rules:
    """policy.toml, with globs compiled against one workspace and home."""

    def __init__(self, data: dict, home: str | None, workspace: str, path: str, state: str,
                 own_config: str = "", xdg_config: str = "", hook_dirs: tuple[str, ...] = (),
                 agent_programs: tuple[str, ...] = ()):
        self.data = data
        self.home, self.workspace = home, workspace
        # A home inside /tmp (tests, CI) is still a home: its files are judged
        # by the ~ patterns only.
        self.harmless_home = self._globs(g for g in data["harmless_outside"] if g.startswith("~/"))
        self.harmless = self._globs(g for g in data["harmless_outside"] if not g.startswith("~/"))
        # The directories on PATH run what is in them by name: a new `git`
        # there is persistence wherever it is (the approver's PATH: the
        # agent's, for a hook), and so is caper's own state dir, however
        # it is reached.
        self.path_dirs = {d.rstrip("/") for d in path.split(os.pathsep)
                          if os.path.isabs(d) and d.rstrip("/")}
        self.persistence = self._globs(list(data["persistence"]) + [
            d + "/*" for d in sorted(self.path_dirs)] + [
            d.rstrip("/") + "/**" for d in {state, os.path.realpath(state)}]
            + _own_config_globs(own_config, xdg_config, data["persistence"])
            + [d.rstrip("/") + "/**" for d in hook_dirs]) + [
            re.compile(re.escape(p) + r"\Z") for p in agent_programs]
        self.owned_caches = self._globs(data["owned_caches"])
        self.code_caches = self._globs(data["code_caches"])
        self.cache_data = self._globs(data["cache_data"])
        self.cache_indexes = self._globs(data["cache_indexes"])
        self.built_code = self._globs(data["built_code"])
        self.builders = set(data["builders"])
        self.git_program_keys = list(data["git_program_keys"]["keys"])
        self.git_redirect_keys = list(data["git_program_keys"]["redirect"])
        self.git_activates = {k: tuple(v) for k, v in data["git_activates"].items()}
        self.formatter_binaries = set(data["formatter_binaries"])
        self.instructions = self._globs(data["agent_instructions"])
        self.persistence_except = self._globs(data["persistence_except"])
        self.temp_owned = self._globs(data["temp_owned"])
        self.escape_sockets = self._globs(data["sockets"]["escape"])
        self.lookup_sockets = self._globs(data["sockets"]["lookup"])
        self.lookup_ports = set(data["sockets"]["lookup_ports"])
        self.formatters = set(data["formatters"])
        self.git_rewrites = set(data["git_rewrites"])
        self.installers = set(data["installers"])
        self.npm_lifecycle = set(data["npm_lifecycle"])
        self.words = {k: set(v) for k, v in data["task_words"].items()}
        self.escape_calls = set(data["refused"]["escape"])
        self.probe_calls = set(data["refused"]["probe"])
        self.mass_share = data["limits"]["mass_delete_share"]
        self.mass_min = data["limits"]["mass_delete_min_rows"]
        self.scope_files = data["limits"]["scope_files"]
        self.install_places = self._globs(data["install_places"])
        self.install_caches = self._globs(data["install_caches"])
        self.fresh_built = self._globs(data["fresh_built"])
        self.fresh_built_scratch = self._globs(data["fresh_built_scratch"])
        self.installer_verbs = {k: set(v) for k, v in data["installer_verbs"].items()}
        self.installer_own_verbs = {k: set(v) for k, v in data["installer_own_verbs"].items()}
        self.asks_first = self._globs(data["asks_first"])
        self.plain_program_keys = list(data["git_plain_programs"]["keys"])
        self.plain_programs = set(data["git_plain_programs"]["programs"])
        self.plain_pagers = set(data["git_plain_programs"]["pagers"])
        self.harmless_keys = {k: tuple(v) for k, v in data["harmless_keys"].items()}
        self.convention_code = self._globs(data["convention_code"])
        self.shadowed_commands = frozenset(data["shadowed_commands"])
        self.env_setters = frozenset(data["env_setters"])
        self.tool_code_keys = list(data["tool_code"]["keys"])
        self.tool_code_scripts = self._globs(data["tool_code"]["scripts"])
        self.tool_code_data_keys = list(data["tool_code"]["data_keys"])
        self.tool_tables = dict(data["tool_code"]["tool_tables"])
        self.spawn_markers = tuple(data["tool_code"]["spawn_markers"])
        self.git_declarable = set(data["git_declares"].pop("config", []))
        self.git_declares = {k: tuple(v) for k, v in data["git_declares"].items()}
        ex = data["expendable"]
        self.expendable_dirs = {d for d in ex["dirs"] if "*" not in d}
        self.expendable_dir_globs = [d for d in ex["dirs"] if "*" in d]
        self.expendable_files = list(ex["files"])
        self.ignored_words = set(ex["task_words"])
        deps = data["dependencies"]
        self.manifests = self._globs(deps["manifests"])
        self.registries = set(deps["registries"])
        self.source_markers = [m.lower() for m in deps["source_markers"]]
        self.roles = {name: (self._globs(r["paths"]), set(r["task_words"]))
                      for name, r in data["roles"].items()}
        self.roles_of_new_files = {name for name, r in data["roles"].items() if r.get("new_files")}
        self.skip_markers = list(data["roles"]["tests"]["skip_markers"])
        self.assertion_markers = list(data["roles"]["tests"]["assertion_markers"])

    def _globs(self, patterns: Iterable[str]) -> list[re.Pattern]:
        out = []
        for g in patterns:
            if g.startswith("~/"):
                if not self.home:
                    continue
                rx = re.escape(self.home.rstrip("/") + "/") + glob_regex(g[2:])
            elif g.startswith("/"):
                rx = glob_regex(g)
            elif g.startswith("**/"):          # that path at any depth, anywhere
                rx = "(?:.*/)?" + glob_regex(g[3:])
            elif "/" in g:
                rx = re.escape(self.workspace.rstrip("/") + "/") + glob_regex(g)
            else:
                rx = "(?:.*/)?" + glob_regex(g)
            out.append(re.compile(rx + r"\Z", re.S))
        return out

    @staticmethod
    def matches(globs: list[re.Pattern], path: str) -> bool:
        return any(g.match(path) for g in globs)


@functools.lru_cache(maxsize=32)
def _compiled(data_json: str, home: str | None, workspace: str, path: str, state: str,
              own_config: str = "", xdg_config: str = "", hook_dirs: tuple[str, ...] = (),
              agent_programs: tuple[str, ...] = ()) -> Rules:
    """Rules compiled once per configuration, home, workspace, PATH, state
    dir, caper's own config file, git hook directories and the programs the
    agents' settings run (an agent session runs many commands in one place)."""
    return Rules(json.loads(data_json), home, workspace, path, state, own_config, xdg_config,
                 hook_dirs, agent_programs)


def configured_hook_dirs(workspace: str, home: str | None) -> tuple[str, ...]:
    """The directories the repository's and the user's core.hooksPath name
    (`.githooks`): hooks there run at the next commit like .git/hooks/*."""
    out = []
    git_dir = os.path.join(workspace, ".git")
    xdg = os.path.join(home, ".config", "git", "config") if home else ""
    # git reads the user's XDG file too, and what any of them includes (adv14b 19);
    # a relative hooksPath is taken from the worktree's top
    files = [os.path.join(git_dir, "config"), xdg, *sorted(configkeys.git_included(
        git_dir if os.path.isdir(git_dir) else None, home, workspace))]
    cfgs = [(f, workspace) for f in files] + (
        [(os.path.join(home, ".gitconfig"), home), (os.path.join(home, ".gitconfig"), workspace)]
        if home else [])
    for cfg, base in cfgs:
        for v in _git_config_values(cfg, "core.hookspath", workspace, *stamp(cfg)):
            v = home.rstrip("/") + v[1:] if v.startswith("~/") and home else v
            out.append(os.path.normpath(os.path.join(base, v)))
    return tuple(dict.fromkeys(out))


@functools.lru_cache(maxsize=64)
def _git_config_values(path: str, key: str, workspace: str, mtime_ns: int,
                       size: int) -> tuple[str, ...]:
    """A config file's values of key, read again only when the file changed."""
    return tuple(configkeys.git_values(path, key, workspace)) if path and size >= 0 else ()


def _own_config_globs(own_config: str, xdg_config: str, persistence: list[str]) -> list[str]:
    """caper's config file wherever config_path() finds it (CAPER_CONFIG,
    XDG_CONFIG_HOME), by path and real path, and every ~/.config/ entry of
    the persistence list under XDG_CONFIG_HOME too: tools read them there."""
    own = os.path.abspath(own_config) if own_config else ""
    out = list(dict.fromkeys([own, os.path.realpath(own)])) if own else []
    if xdg_config and os.path.isabs(xdg_config):
        for base in dict.fromkeys([xdg_config, os.path.realpath(xdg_config)]):
            out += [base.rstrip("/") + g[len("~/.config"):]
                    for g in persistence if g.startswith("~/.config/")]
    return out


@functools.cache
def default_data() -> dict:
    return tomllib.loads(resources.files("caper").joinpath("data/policy.toml").read_text())


def merged_data(extra: dict | None) -> dict:
    """policy.toml with [policy] from config.toml added to its top-level
    lists (the only keys config.py lets through)."""
    data = dict(default_data())
    for k, v in (extra or {}).items():
        data[k] = list(data[k]) + list(v)
    return data


# --- what the command and the task declare ------------------------------------------------


@dataclass
class Declared:
    deletes: list[str] = field(default_factory=list)   # absolute paths or globs
    writes: list[str] = field(default_factory=list)
    programs: set[str] = field(default_factory=set)    # basenames of the commands named
    git: set[str] = field(default_factory=set)         # git subcommands named
    git_configs: set[str] = field(default_factory=set)  # `git config KEY ...`
    operands: dict[str, list[str]] = field(default_factory=dict)  # program -> its path arguments

    def covers(self, path: str, targets: list[str]) -> bool:
        for t in targets:
            if below(path, t):
                return True
            if any(ch in t for ch in "*?[") and re.match(glob_regex(t) + r"(?:/.*)?\Z", path):
                return True
        return False


_OPS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}
_REDIRECTS = {">", ">>", ">|", "&>", "&>>"}
_DELETERS = {"rm", "rmdir", "unlink", "shred"}
_WRITERS = {"touch", "mkdir", "tee", "truncate", "install", "ln", "chmod", "chown", "chgrp"}


def declared_by_command(command: str, cwd: str, home: str | None) -> Declared:
    """What the command text names, resolved like the shell would (best
    effort: variables and substitutions are not expanded, so they declare
    nothing)."""
    d = Declared()
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        tokens = list(lex)
    except ValueError:
        return d

    def absolute(p: str) -> str:
        if p.startswith("~/") and home:
            p = home.rstrip("/") + p[1:]
        return os.path.normpath(os.path.join(cwd, p))

    words: list[str] = []
    for i, tok in enumerate(tokens + [";"]):
        if tok in _REDIRECTS or (tok[:-1].isdigit() and tok[-1:] == ">"):
            continue
        if i and tokens[i - 1] in _REDIRECTS | {">"} and tok not in _OPS:
            if not tok.startswith("/dev/"):
                d.writes.append(absolute(tok))
            continue
        if tok in _OPS:
            _simple(d, words, absolute)
            words = []
            continue
        words.append(tok)
    return d


def _simple(d: Declared, argv: list[str], absolute) -> None:
    while argv and "=" in argv[0] and not argv[0].startswith("="):
        argv = argv[1:]                     # VAR=value prefixes
    while argv and argv[0] in ("sudo", "env", "time", "nice", "nohup", "exec", "command"):
        argv = argv[1:]
    if not argv:
        return
    prog = os.path.basename(argv[0])
    d.programs.add(prog)
    if prog.startswith("python") and "-m" in argv[1:-1]:
        d.programs.add(argv[argv.index("-m") + 1])      # python -m pip / venv: that tool
    args = [a for a in argv[1:] if not a.startswith("-")]
    d.operands.setdefault(prog, []).extend(absolute(a) for a in args)
    if prog in _DELETERS:
        d.deletes += [absolute(a) for a in args]
    elif prog in ("mv",):
        d.deletes += [absolute(a) for a in args[:-1]]
        d.writes += [absolute(a) for a in args]
    elif prog in ("cp", "rsync", "scp"):
        d.writes += [absolute(a) for a in args[-1:]]
    elif prog in _WRITERS or prog == "sed" and any(a.startswith("-i") for a in argv[1:]):
        d.writes += [absolute(a) for a in args[1:] if prog in ("chmod", "chown", "chgrp", "sed")]
        d.writes += [absolute(a) for a in args if prog not in ("chmod", "chown", "chgrp", "sed")]
    elif prog == "find" and "-delete" in argv:
        roots = [a for a in argv[1:] if not a.startswith("-")][:1] or ["."]
        names = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-name", "-iname")]
        d.deletes += [os.path.join(absolute(roots[0]), "**", n) for n in names] or \
                     [absolute(roots[0])]
    elif prog == "git" and _git_args(argv):
        args = _git_args(argv)
        sub = args[0]
        d.git.add(sub)
        if sub in ("rm", "mv"):
            d.deletes += [absolute(a) for a in args[1:]]
        if sub == "config" and len(args) > 1:
            d.git_configs.add(args[1].lower())


_GIT_VALUED = {"-c", "-C", "--git-dir", "--work-tree", "--namespace", "--config-env"}


def _git_args(argv: list[str]) -> list[str]:
    """git's non-option words after its global options (`git -c k=v -C dir
    commit`: the subcommand is commit, not k=v)."""
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in _GIT_VALUED else 1
    return [a for a in argv[i:] if not a.startswith("-")]


@dataclass(frozen=True)
class TaskIntent:
    text: str
    kinds: frozenset[str]     # delete, network, database, secrets, persistence, permissions
    words: frozenset[str]

    def names(self, path: str) -> bool:
        """The task mentions this path or one of its last two components."""
        parts = [p for p in path.split("/") if p and p != "~"]
        return any(p.lower() in self.words or p.lower().rstrip("s") in self.words
                   for p in parts[-2:]) or _mentions(self.text, path)


def _mentions(text: str, path: str) -> bool:
    """path appears in text as a whole path, not inside a longer word or path
    (`ui` is not in "build", `.git` not in ".github")."""
    rx = r"(?<![\w.~/-])" + re.escape(path.rstrip("/")) + r"/?(?![\w/-]|\.\w)"
    return re.search(rx, text, re.I) is not None


def task_intent(task: str | None, rules: Rules) -> TaskIntent | None:
    if not task:
        return None
    words = frozenset(w.strip(".,;:!?'\"`()").lower() for w in task.split())
    # A path names its last component ("tests/test_models.py": test_models.py),
    # not the directories on the way to it, which would name all they hold.
    words = frozenset(w for w in words if w) | frozenset(
        w.rstrip("/").rsplit("/", 1)[-1] for w in words if w.strip("/"))
    kinds = frozenset(k for k, vocab in rules.words.items() if words & vocab)
    return TaskIntent(task, kinds, words)


# --- findings -----------------------------------------------------------------------------


@dataclass(order=True)
class Finding:
    rank: int                          # higher first
    verdict: str = field(compare=False)     # block | unsure
    what: str = field(compare=False)        # the effect, in words
    boundary: str = field(compare=False)    # which line it crosses
    safer: str | None = field(compare=False, default=None)
    path: str | None = field(compare=False, default=None)   # the change, as the report names it


def _quote_clipped(s: str) -> str:
    """A run-derived string as a JSON literal, clipped to 120 characters (a reason line)."""
    return quote(s, limit=120)


class PolicyApprover:
    """Blocks undeclared harm, allows ordinary work, is unsure in between."""
    name = "policy"

    def __init__(self, extra: dict | None = None):
        self._data = merged_data(extra)
        self._key = json.dumps(self._data, sort_keys=True)

    def decide(self, request: ApprovalRequest) -> Decision:
        report = request.report
        workspace = request.workspace or report.workspace
        rules = _compiled(self._key, request.home, workspace, os.environ.get("PATH", ""),
                          default_state_dir(),
                          config_path() if request.config_file is None else request.config_file,
                          os.environ.get("XDG_CONFIG_HOME", "") if request.xdg_config_home is None
                          else request.xdg_config_home,
                          configured_hook_dirs(workspace, request.home),
                          programs_run(workspace, request.home))
        cwd = request.cwd or workspace
        declared = declared_by_command(request.command, cwd, request.home)
        # A task from the transcript may be the agent's own words (it can
        # write that file): it lowers no strictness, as if no task were known.
        intent = None if request.task_from_transcript else task_intent(request.task, rules)
        protected = request.protected or protected_for(default_patterns(), request.home, workspace)
        judge = _Judge(rules, declared, intent, request.home, workspace, protected)
        findings = judge.run(report)
        return replace(_verdict(findings, report, request.task), task_names=judge.task_names)


class _Judge:
    """One verdict's reasoning: each class of effect is one method, fed
    every change of the run (never the budget's aggregates)."""

    def __init__(self, rules: Rules, declared: Declared, intent: TaskIntent | None,
                 home: str | None, workspace: str, protected: Protected):
        self.r, self.d, self.t = rules, declared, intent
        self.home, self.ws, self.protected = home, workspace, protected
        self.absolute = PathView(workspace, home).absolute   # the report's short paths
        # A workspace that is / or holds the home, with no repository (the
        # agent's cwd, or an MCP call's), is no project: its paths are judged
        # where they are, never as "the project's".
        self.wide = not os.path.exists(os.path.join(workspace, ".git")) and (
            workspace == "/" or bool(home) and below(home, workspace))
        # What a formatter the command names may rewrite: the paths it was given.
        self.formatted = [a for prog, args in declared.operands.items()
                          if prog in rules.formatters for a in args]
        self.findings: list[Finding] = []
        self.task_names: tuple[str, ...] = ()   # the changes the task names (run() sets them)

    def task_says(self, kind: str, path: str | None = None) -> bool:
        if self.t is None:
            return False
        return kind in self.t.kinds and (path is None or self.t.names(path))

    def add(self, rank: int, verdict: str, what: str, boundary: str, safer: str | None = None,
            path: str | None = None):
        self.findings.append(Finding(rank, verdict, what, boundary, safer, path))

    def run(self, report) -> list[Finding]:
        self.credential_reads = {p.path for p in report.protected_reads}
        self.credentials_read = sorted(p.path for p in report.protected_reads if p.result is None)
        changes = report.all_changes
        self.task_names = tuple(c.path for c in changes if self.t is not None and (
            self.t.names(c.path) or _stem(c.path) in self.t.words))
        self.changed = {self.absolute(c.path) for c in changes}
        self.removed = {self.absolute(c.path) for c in changes if c.op == "deleted"}
        self.written = {self.absolute(c.path): c for c in changes if c.op != "deleted"}
        # what each name the run changed is after it: a link's target, or no link
        self.run_links = {self.absolute(c.path): _link_target(c) for c in changes}
        # hosts caper's proxy let the run reach (a registry the user allowed,
        # on the host's loopback too): not a server of the run's
        self.reached = {n.address.lower().rstrip(".") for n in report.network
                        if n.call in ("proxy", "route") and n.allowed}
        self._checking: set[str] = set()      # objects whose own build is being looked at
        self.make_includes = _make_includes(self.ws)
        self.stdlib_shadows = sorted(
            self.absolute(c.path) for c in changes
            if c.op != "deleted" and c.type == "file" and _stdlib_shadow(self.absolute(c.path), self.ws))
        # A compiler's own subprograms (as, ld, cc1) found on a PATH or
        # COMPILER_PATH the run chose: any build's output is the run's then
        # (adv12b 10: a wrapper `as` swapped the assembly under a real gcc).
        self.planted_toolchain = sorted(
            p for p in report.programs if os.path.isabs(p) and
            os.path.basename(p) in self.r.builders | _TOOLCHAIN_PARTS and not self._unplanted(p))
        # git's own process changed something: what the git commands named did.
        self.git_ran = any(self._ran(c, {"git"}) for c in changes)
        for c in changes:
            self.change(c)
        if report._all_changes is None:     # a report made by hand: its aggregates too
            for a in report.aggregates:
                self.workspace_change(a.under, self.absolute(a.under), a.op, a.where, None, a.files)
        self.scope(changes)
        if report.git:
            self.git_history(report.git)
            self.git_index(report.git)
            self.git_commits(report.git)
        for n in report.network:
            self.network(n)
        self.many_small_uploads(report.network)
        for s in report.secrets:
            if s.where in ("stdout", "stderr"):
                self.add(90, "block", f"its output would show secret values ({', '.join(s.kinds)})",
                         "secrets must not reach the agent's context",
                         "read the value where it is needed instead of printing it")
        self.transformed(report)
        for x in report.processes.refused:
            if x.syscall in self.r.escape_calls or x.reason in ("abi",):
                self.add(95, "block", f"it tried {x.syscall} ({x.reason}), which caper refused",
                         "a sandbox escape attempt", None)
            elif x.syscall not in self.r.probe_calls:
                self.add(40, "unsure", f"it tried {x.syscall} ({x.reason}), which caper refused",
                         "the run may behave differently outside the sandbox")
        hidden = [u for u in report.uncertain if u.split(":")[0] == CHANGES_NOT_SHOWN]
        if hidden and report._all_changes is None:
            self.add(30, "unsure", f"the report had no room for some changes ({hidden[0]})",
                     "effects the policy could not see")
        self.git_unclassified(report)
        if "git-history-unknown" in report.uncertain:
            self.add(45, "unsure", "caper could not tell which commits or uncommitted changes "
                     "the run would lose", "git state that git cannot give back")
        return sorted(self.findings, reverse=True)

    def transformed(self, report) -> None:
        """A credential read: whatever the run gives back may carry the value
        in a form no redaction finds (base64, reversed, encrypted, one byte
        as the exit status, a directory's name, a symlink's target, which
        files it deleted, how many programs it ran), so verbatim matching
        cannot clear it: a human or the LLM decides, and a blocked run's
        answer is sealed. A file of settings and placeholders only (the
        report says which) has no value to carry."""
        shown = report.counts.get("protected_reads")
        whole = shown is None or not shown.omitted      # every read listed, values known
        read = sorted({p.path for p in report.protected_reads
                       if p.result is None and not (p.settings_only and whole)})
        if not read:
            return
        cred = _quote_clipped(read[0])
        if report.output.stdout.bytes or report.output.stderr.bytes:
            self.add(75, "unsure", f"it read the credential {cred} and printed output, "
                     "which may carry it in another form", "secrets must not reach the agent's "
                     "context", "read the value where it is needed, printing nothing of it")
            return
        # Any change: a descriptor opened before the read can be written after
        # it (`base64 .env > enc.txt`: the shell opens enc.txt first), and a
        # name, a link target or a choice of deletions spells bytes as well.
        changed = next((c.path for c in report.changes),
                       next((a.under for a in report.aggregates), None))
        if changed is not None:
            self.add(75, "unsure", f"it read the credential {cred} and changed "
                     f"{_quote_clipped(changed)}, which may carry it in another form",
                     "credentials must not be copied")
            return
        self.add(70, "unsure", f"it read the credential {cred}: its exit status, counts and "
                 "timing, which the agent sees of a committed run, may carry it in another "
                 "form", "secrets must not reach the agent's context")

    # -- file changes --
    def change(self, c) -> None:
        path, op, where = c.path, c.op, c.where
        full = self.absolute(path)
        if self.wide and where == "workspace":
            where = place(full, self.home)
        if c.secrets and not (set(c.secrets) <= GENERIC_SHAPES and not self.credential_reads):
            # (a password-like shape alone, in a run that read no credential, is
            # code or documentation: pip's own sources in every venv, adv15b 14)
            verdict = "unsure" if self.task_says("secrets") else "block"
            self.add(92, verdict, f"it would write secret values ({', '.join(c.secrets)}) "
                     f"into {_quote_clipped(path)}", "credentials must not be copied",
                     "reference the credential file instead of copying its content", path)
        # By path and role, whatever the classification: a home inside the
        # workspace keeps its ~/.bashrc a persistence file.
        persists = self.persistence(c, full) and op != "deleted"
        if where in ("home", "system", "outside") and not persists and \
                not (op == "meta" and _narrowing(c.detail)):
            self.outside(path, full, op, where)
        elif where == "tmp":
            self.shared_place(c, full)
        elif where == "git-internal":
            self.git_internal(path, full, op, c)
        elif where in ("tracked", "workspace", "untracked", "ignored"):
            self.workspace_change(path, full, op, where, c, 1)
        if op == "renamed" and c.renamed_from and not below(full, self.ws) and \
                below(self.absolute(c.renamed_from), self.ws) and not self.wide:
            # moved out of the project (`mv notes.md /tmp/x`): gone from it as if deleted
            self.workspace_change(c.renamed_from, self.absolute(c.renamed_from), "deleted",
                                  "tracked" if c.where == "tracked" else "untracked", c, 1)
        if op == "renamed" and (c.renamed_from or "").split("/")[0] == ".git" and \
                not path.startswith(".git/"):
            # the repository moved out of its place: no repository is left,
            # and where it went, cleaning deletes it (adv14b 28)
            self.add(91, "block", f"it would move {_quote_clipped(c.renamed_from)} to "
                     f"{_quote_clipped(path)}: the project is no repository after it",
                     "the repository's history", "never move .git; use git commands", path)
        if op == "renamed" and c.renamed_from and self.expendable(full) and \
                not self.expendable(self.absolute(c.renamed_from)) and \
                not (self.t is not None and self.t.names(c.renamed_from)):
            # the next clean of build outputs, allowed on its own, deletes it (adv14b 08)
            self.add(58, "unsure", f"it would move {_quote_clipped(c.renamed_from)} into "
                     f"{_quote_clipped(c.path)}, a build or cache folder that cleaning deletes",
                     "the user's own files", "leave the user's files where they are", path)
        if where in ("untracked", "ignored") and not persists:
            self.built(c, full, where)
            self.shadowing(c, full, where)
        if where in ("tracked", "untracked", "ignored") and op != "deleted" and (
                not persists or configkeys.format_of(full) == "package"):
            self.tool_code(c, full)     # package.json: its tools' keys, beside npm's scripts
        if op in ("created", "modified", "replaced", "renamed") and \
                any(fnmatch.fnmatchcase(full, g) for g in self.make_includes) and \
                not (self.t is not None and self.t.names(path)):
            self.add(86, "unsure", f"it would {_verb(op)} {_quote_clipped(path)}, which the "
                     "project's Makefile includes: its rules run at the next make",
                     "persistence: code or configuration that runs later",
                     "name the file in the task", path)
        if op == "created" and where in ("untracked", "ignored") and \
                self.r.matches(self.r.convention_code, full):
            self.add(86, "unsure" if self.task_says("persistence") or self.t is not None and
                     self.t.names(path) else "block",
                     f"it would create {_quote_clipped(path)}, which the build tool or runtime "
                     "runs or merges by itself at its next start", "persistence: code or "
                     "configuration that runs later", "name the file in the task", path)
        if c.in_repository in ("HEAD", "commondir", "objects", "refs") and op == "created":
            self.new_repository(c, full[:-len(c.in_repository) - 1])
        if not persists and op != "deleted" and self.r.matches(self.r.instructions, full) and \
                not (self.t is not None and self.t.names(path)):
            self.add(62, "unsure", f"it would {_verb(op)} {_quote_clipped(path)}, instructions that later "
                     "agent sessions read and follow", "agent configuration: what later "
                     "sessions are told to do", "edit it only when the task asks for it", path)
        self.privilege(path, full, c)
        if _link_target(c) is not None:
            self.link(path, full, _link_target(c))
        if c.unseen_links and op != "deleted":
            self.add(86, "unsure", f"it would {_verb(op)} {_quote_clipped(path)}, a file with "
                     f"{c.unseen_links} other hard links on this machine that the run did not "
                     "name: the same content under names the report cannot show (a dotfile, a "
                     "package store's file)", "hard links: one file under names not shown",
                     "break the link first (copy the file, then edit the copy)", path)
        for other in c.links or ():
            # A hard link is one file under two names: a write through the
            # project's name is a write of the other, as through a symlink.
            self.link(path, full, self.absolute(other))
        if op in ("meta", "modified") and c.detail:
            self.mode(path, full, c.detail, where)
            self.owner(path, full, c.detail)
        if c.tables:
            self.tables(path, c)
        if (c.diff or c.uncompared) and op != "deleted" and self.r.matches(self.r.manifests, full):
            self.dependency_sources(c)

    def repository_own_deleted(self, c, full: str) -> None:
        """A repository's hooks and config are the user's, not history: git
        holds no copy of them, and a hook is often a check (a secret scan,
        signing) whose loss shows nowhere (adv10b 27/28)."""
        git_dir = os.path.join(self.ws, ".git")
        part = os.path.relpath(full, git_dir) if below(full, git_dir) and full != git_dir \
            else c.in_repository
        if part is None:
            return
        hook = part.startswith("hooks/") and not part.endswith(".sample")
        if not (hook or part in ("config", "config.worktree")):
            return
        if self.t is not None and (self.t.names(c.path) or
                                   ("hook" if hook else "config") in self.t.words):
            return
        self.add(75, "unsure", f"it would delete {_quote_clipped(c.path)}, the repository's own "
                 f"{'hook' if hook else 'configuration'}: git holds no copy of it "
                 f"({'a check it ran is gone' if hook else 'remotes, signing and other settings are gone'})",
                 "git state that git cannot give back",
                 "leave the repository's hooks and configuration to the user", c.path)

    def persistence(self, c, full: str) -> bool:
        """Code placed where something runs it later, judged by the file's
        place and role; a config file of a known format by the keys it gained.
        True when the path has such a role (found or not)."""
        if c.bytecode is not None or bytecode.source_of(full) and c.op not in ("deleted", "meta"):
            return self.bytecode(c, full)     # (not verified: a report made by hand)
        # A repository under any name (a `.git` file's gitdir, a bare one):
        # its hooks and config are judged as .git's are.
        nested = c.in_repository is not None and \
            self._persistent_place("/r/.git/" + c.in_repository)
        listed = self._persistent_place(full) or bool(c.git_config) or nested  # git includes it
        if not listed and self.r.matches(self.r.cache_indexes, full):
            if c.op != "deleted" and (c.op != "created" or not self._tool_wrote(c)):
                self.add(60, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)}, an index "
                         "that decides what code a cache hands out later (a redirected entry "
                         "runs other code at the next install or hook)",
                         "persistence: code or configuration that runs later",
                         "leave package-manager caches to the package manager", c.path)
            return True
        cached = not listed and self._code_cache(full)
        # Where interpreters and package managers find code by themselves:
        # a package manager's job, whoever else writes there plants code.
        installed = not listed and (self.r.matches(self.r.install_places, full) or
                                    self._in_environment(full)) and \
            not self.r.matches(self.r.install_caches, full)
        if installed and self._installers_own(c, full):
            return True      # a package manager's (or its build's) own write
        # A new entry is its tool's when that tool's own process wrote it: a
        # shell's or a project script's is code the tool loads as its own
        # (adv14b 01, 03, 11: black's grammar pickle, node-gyp's headers, jedi's
        # parse cache); a removed one is fetched again.
        # (build tools' caches inside node_modules take anyone's, as before)
        if not listed and not installed and (not cached or c.op == "deleted" or
                                             c.op == "created" and (
                                                 self._tool_wrote(c) or
                                                 self.r.matches(self.r.install_caches, full))):
            return False
        if cached and not installed and c.op == "created" and \
                not self.r.matches(self.r.owned_caches, full):
            # a store caper knows nothing of: code or data, only its tool knows
            self.add(60, "unsure", f"it would create {_quote_clipped(c.path)} in a cache, "
                     "written by the command's own code, not the cache's tool: what that tool "
                     "loads later as its own (a pickle, a header, a compiled module)",
                     "persistence: code or configuration that runs later",
                     "leave caches to the tools that keep them", c.path)
            return True
        if c.op == "deleted":
            self.repository_own_deleted(c, full)
            return True          # removing it runs nothing
        if c.op == "meta" and ("mode" not in (c.detail or "") or _narrowing(c.detail)):
            return True          # touching or closing it runs nothing
        unknown: list[str] = []
        if c.keys is not None:
            fmt = "git" if c.git_config else configkeys.format_of(full)
            judged = {k: self._key_verdict(fmt, k, full) for k in c.keys}
            if fmt == "vscode-tasks":
                # a new task's command runs when the user runs the task they
                # were shown; an existing task's new command, under its old name
                new_labels = {k[len("tasks.label="):].lower() for k in c.keys
                              if k.startswith("tasks.label=")}
                judged.update({k: "harmless" if k.partition("=")[0][len("tasks.command."):]
                               in new_labels else "runs"
                               for k in c.keys if k.startswith("tasks.command.")})
            risky = [k for k, v in judged.items() if v == "runs"]
            unknown = [k for k, v in judged.items() if v == "unknown"]
            if not risky and not unknown:
                return True
            what = f"it would set {', '.join(map(_quote_clipped, (risky or unknown)[:4]))} in {_quote_clipped(c.path)}"
        else:
            what = f"it would {_verb(c.op)} {_quote_clipped(c.path)}"
        if self.r.matches(self.r.install_places, full) and self._installers_own(c, full):
            return True      # a package manager's .pth, activate script or .bin link
        if c.keys is not None and not risky:
            # git keys caper knows neither to run a program nor to run nothing
            self.add(61, "unsure", what + ", git keys caper does not know to be harmless",
                     "git configuration the policy cannot judge",
                     "leave git configuration to the user", c.path)
            return True
        git = c.where == "git-internal" or c.git_config or nested or _is_git_config(full)
        verdict = "unsure" if self.task_says("persistence") or \
            self.r.matches(self.r.asks_first, full) else "block"
        self.add(94 if c.where in ("home", "system", "outside", "cache") else 93, verdict,
                 what + (", code a cache keeps that later builds and hooks run unchecked"
                         if cached else ", which later " +
                         ("git commands run or follow" if git else "sessions or tools run, or "
                          "which redirects where code and packages come from")),
                 "git hooks and configuration run code in later git commands" if git else
                 "persistence: code or configuration that runs later",
                 "leave shell, git, editor and package-manager configuration to the user", c.path)
        return True

    def shadowing(self, c, full: str, where: str) -> None:
        """Code Python or pytest picks up by itself from a place git ignores
        or does not track: an extension module beside a module's source
        (Python imports app/parser.*.so before app/parser.py), a package
        beside one (app/parser/__init__.py, likewise), a sourceless
        .pyc outside __pycache__ (textwrap.pyc in the project shadows the
        standard library's for a script run there), a conftest.py in an
        ignored directory (htmlcov/, build/: pytest imports it when it
        collects there). A compiler's or linker's own output is a build."""
        name = os.path.basename(full)
        stem = name.split(".", 1)[0]
        if c.op not in ("created", "modified", "replaced", "renamed") or \
                c.type not in ("file", "symlink"):
            return
        # a command named in the list anywhere; any command of the system's
        # in a bin directory (adv14b 04, 05: bin/git as a link,
        # build/toolchain/bin/diff), where PATH_add and `path:` point
        in_bin = os.path.basename(os.path.dirname(full)) in ("bin", "sbin", ".bin")
        # (a listed command whatever the system holds: cargo in ~/.cargo/bin, adv15b 04)
        if c.op in ("created", "renamed") and (name in self.r.shadowed_commands or in_bin and (
                shutil.which(name, path=_SYSTEM_PATH) or
                shutil.which(name, path=os.pathsep.join(self.r.path_dirs)))) \
                and not self.r.matches(self.r.install_places, full):
            self.add(70, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)}, named like "
                     f"the system's {_quote_clipped(os.path.basename(full))}: once its directory "
                     "is on PATH (direnv, mise, an activated environment) it runs in its place",
                     "PATH shadows: a program run in place of another",
                     "give the script a name of its own", c.path)
        if c.type != "file":
            return
        if full in self.stdlib_shadows and c.op != "modified":
            self.add(70, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)} at the "
                     f"project's top: Python imports it in place of the installed "
                     f"{_quote_clipped(_stdlib_shadow(full, self.ws))} for every program run there "
                     "(`python -m venv`, `python -m pytest`, scripts)", "persistence: code or "
                     "configuration that runs later", "give the module a name of its own", c.path)
        shadowed = _tests_shadow(full, self.ws) if c.op != "modified" else None
        if shadowed:
            self.add(70, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)}, which the "
                     f"tests import in place of the project's own {_quote_clipped(shadowed)} "
                     "(pytest puts their directory first on the import path)",
                     "persistence: code or configuration that runs later",
                     "give test helpers names of their own", c.path)
        ext = name.endswith((".so", ".pyd")) and ".cpython-" in name or name.endswith(".abi3.so")
        sourceless = name.endswith(".pyc") and os.path.basename(os.path.dirname(full)) != "__pycache__"
        conftest = name in ("conftest.py", "pytest.ini") and where == "ignored"
        # a package directory is imported before a module of its name (adv10b 03)
        module = os.path.dirname(full) + ".py"
        package = name == "__init__.py" and c.op == "created" and os.path.isfile(module) and \
            module not in self.removed
        if not (ext or sourceless or conftest or package) or \
                self.r.matches(self.r.install_places, full):
            if name in ("conftest.py", "pytest.ini") and c.op == "created" and \
                    where == "untracked" and not self._beside_tests(full):
                self.add(60, "unsure", f"it would create {_quote_clipped(c.path)}, code pytest "
                         "runs by itself when it collects there, away from the project's tests",
                         "persistence: code or configuration that runs later",
                         "put fixtures beside the tests they serve", c.path)
            return
        if ext and (self._built(c) or
                    not os.path.exists(os.path.join(os.path.dirname(full), stem + ".py")) and
                    stem not in sys.stdlib_module_names):
            return           # built, or a module with no source beside it to shadow
        verdict = "unsure" if self.task_says("persistence") else "block"
        self.add(86, verdict, f"it would {_verb(c.op)} {_quote_clipped(c.path)}, code Python or "
                 "pytest runs by itself in place of, or beside, the project's reviewed sources",
                 "persistence: code or configuration that runs later",
                 "build it with the build tool, or leave it alone", c.path)

    def tool_code(self, c, full: str) -> None:
        """A linter's, type checker's or bundler's configuration that runs
        code: keys that load plugins or run a hook (pylint's init-hook), a
        script config that spawns processes or reaches the network. Editors'
        extensions run these tools when a file is opened (adv10b 05)."""
        name = os.path.basename(full)
        risky: list[str] = []
        fmt = configkeys.format_of(full)
        if c.keys is not None and fmt in ("ini", "toml"):
            table = self.r.tool_tables.get(name, "")     # hatch.toml: tool.hatch.*
            risky = [k for k in c.keys if any(fnmatch.fnmatchcase(table + k.partition("=")[0], g)
                                              for g in self.r.tool_code_keys)
                     or k.partition("=")[0].endswith(".addopts") and _PLUGIN_OPTION.search(k)
                     or self._warning_from_project(k) or self._tests_from_filled(k)
                     or self._collects_outside(k)
                     # setup.cfg's `version = attr: pkg.mod.VAR`: imported at the build
                     or k.partition("=")[2].lstrip().startswith("attr:")]
        elif c.keys is not None and fmt in ("json", "yaml", "package"):
            # a plugin or parser named by its path: the project's file, run
            # by the tool (adv12b 06, 11); by a package's name, a dependency
            risky = [k for k in c.keys if self._loads_code(k)]
        elif self.r.matches(self.r.tool_code_scripts, full):
            # a script config is code whatever words it avoids (adv10b 23):
            # one the task does not speak of is unsure; one it asks for, by
            # the markers here and its diff before the LLM or the user
            tool = name.split(".", 1)[0].lstrip(".").removesuffix("rc").removesuffix("-config")
            asked = self.t is not None and (self.t.names(c.path) or tool in self.t.words or
                                            bool(self.t.words & _CONFIG_WORDS))
            # code beyond settings, asked for or not: what loads modules or
            # builds code at run time (adv15b 11: fs, vm, a joined require)
            risky = [line[1:].strip()[:80] for line in c.diff or ()
                     if line.startswith("+") and (any(m in line for m in self.r.spawn_markers)
                                                  or _CONFIG_CODE.search(line))]
            if not asked and not risky:
                risky = ["code the task does not ask for"]
        shadows = [n for k in c.keys or () for n in _entry_point_names(k)
                   if shutil.which(n, path=_SYSTEM_PATH)]
        if shadows:
            self.add(70, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)} with an "
                     f"entry point named {', '.join(map(_quote_clipped, shadows[:3]))}, a command "
                     "on PATH: once installed, the environment's script runs in its place",
                     "PATH shadows: a program run in place of another",
                     "give the entry point a name of its own", c.path)
        if not risky:
            return
        self.add(62, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)} with "
                 f"{', '.join(map(_quote_clipped, risky[:3]))}: code the tool (and an editor "
                 "running it on open) executes", "persistence: code or configuration that runs later",
                 "configure the tool with settings only", c.path)

    def _warning_from_project(self, key: str) -> bool:
        """A pytest warnings filter (filterwarnings, addopts' -W) whose
        category pytest imports from a module of the project's (adv13b 08:
        `ignore::build.warncompat.LegacyWarning`, code hidden in build/)."""
        name, _, value = key.partition("=")
        if not (name.endswith(".filterwarnings") or name.endswith(".addopts") and "-W" in value):
            return False
        for module in re.findall(r"::([A-Za-z_][\w.]*)\.[A-Za-z_]\w*", value):
            top = module.split(".", 1)[0]
            if top in sys.stdlib_module_names:
                continue
            mine = os.path.join(self.ws, top)
            if os.path.exists(mine) or os.path.exists(mine + ".py") or any(
                    below(x, mine) or x == mine + ".py" for x in self.changed):
                return True
        return False

    def _loads_code(self, kv: str) -> bool:
        """A JS tool config's key that names a file the tool loads: by a path
        in its value, or in its key (postcss' `plugins: {"./p.js": {}}`), or
        by a bare relative name of a file the run wrote (adv14b 20, 27:
        mocha's `require: build/setup` with build/setup.js)."""
        key, _, value = kv.partition("=")
        for g in self.r.tool_code_data_keys:
            if fnmatch.fnmatchcase(key, g):
                return bool(_CODE_PATH.search(value)) or self._names_written(value)
            if "*" not in g and key.startswith(g + "."):
                named = key[len(g) + 1:]
                return bool(_CODE_PATH.search(named)) or self._names_written(named)
        return False

    def _names_written(self, value: str) -> bool:
        for word in re.split(r"[\s,'\"\[\]{}()]+", value):
            if "/" not in word or "://" in word:
                continue
            where = os.path.normpath(os.path.join(self.ws, word))
            if any(where + ext in self.changed for ext in _MODULE_SUFFIXES):
                return True
        return False

    def _collects_outside(self, key: str) -> bool:
        """pytest's addopts naming a path outside the project to collect, or
        a rootdir, confcutdir or testpaths there: its conftest.py is imported
        at every run (adv15b 21)."""
        name, _, value = key.partition("=")
        if not name.endswith(".addopts"):
            return False
        for word in re.split(r"[\s=]+", value):
            if word.startswith(("/", "~/", "../")) and not below(
                    os.path.normpath(os.path.join(self.ws, os.path.expanduser(word))), self.ws):
                return True
        return False

    def _tests_from_filled(self, key: str) -> bool:
        """pytest's testpaths naming a directory the run wrote into, or one
        outside the project: the next `pytest` imports the conftest.py and
        test modules there (adv13b 16: build/t, ignored, with the run's
        conftest.py)."""
        name, _, value = key.partition("=")
        if not name.endswith(".testpaths"):
            return False
        for entry in re.findall(r"[^\s,'\"\[\]]+", value):
            where = os.path.normpath(os.path.join(self.ws, entry))
            if not below(where, self.ws) or any(below(x, where) and x != where
                                                for x in self.changed):
                return True
        return False

    def _beside_tests(self, full: str) -> bool:
        """At the project's top or in a test directory (adv9 04: a new
        tools/cache/conftest.py shows in git status as its directory only)."""
        rel = os.path.relpath(os.path.dirname(full), self.ws)
        return rel == "." or any(part in _TEST_DIRS for part in rel.split(os.sep))

    def built(self, c, full: str, where: str) -> None:
        """An existing file of built code git does not track (a binary in
        target/, a provider, a vendored gem; any executable file git
        ignores) rewritten: what the user's next `cargo run`, `terraform
        plan` or `./app` runs, unreviewed. A build's own compiler, linker or
        tool rewrites it. (An untracked script of the user's is a source.)"""
        if c.type != "file":
            return
        if full.endswith(".d") and c.op != "deleted" and not self._built(c):
            # a compiler's dependency file, which `-include $(DEPS)` makes part
            # of the Makefile: one a script wrote runs its $(shell) at every
            # make, `make -n` and `make clean` (adv14b 06)
            self.add(62, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)}, a "
                     "dependency file make reads as part of the Makefile, that no compiler "
                     "wrote", "persistence: code or configuration that runs later",
                     "let the compiler write dependency files (-MMD)", c.path)
            return
        if c.op in ("modified", "replaced") and _generated_build_file(full) and \
                not self._generator_wrote(c):
            # cmake's build/Makefile, build.ninja: the next build runs their
            # recipes as the project's (adv14b 32)
            self.add(62, "unsure", f"it would rewrite {_quote_clipped(c.path)}, a generated "
                     "build file, without its generator: the next build runs what it holds",
                     "persistence: code or configuration that runs later",
                     "configure again with the generator (cmake, meson)", c.path)
            return
        if c.op in ("created", "renamed"):
            # a fresh build's own outputs (no target/ before, or a swapped
            # binary put in place of the one just linked): cargo's, rustc's
            # and the linker's, or a build script's out/ dir
            if self.r.matches(self.r.fresh_built, full) and not self._built(c) \
                    and not self.r.matches(self.r.fresh_built_scratch, full):
                self.add(60, "unsure", f"it would create {_quote_clipped(c.path)}, built code "
                         "that no build tool wrote: what the user's next run of it starts",
                         "persistence: code or configuration that runs later",
                         "build it with the build tool", c.path)
            return
        if c.op not in ("modified", "replaced"):
            return
        try:
            st = os.lstat(full)
            executable = where == "ignored" and stat.S_ISREG(st.st_mode) and \
                st.st_mode & 0o111 != 0
        except OSError:
            executable = False
        if not executable and not self.r.matches(self.r.built_code, full) or self._built(c):
            return
        verdict = "unsure" if self.task_says("persistence") or not executable else "block"
        self.add(86 if executable else 60, verdict,
                 f"it would rewrite {_quote_clipped(c.path)}, " + (
                     "an executable file git does not track" if executable else
                     "built code git does not track") + ", without a build tool: code the "
                 "user's tools run later as it is", "persistence: code or configuration that "
                 "runs later", "rebuild it with the build tool, or leave it alone", c.path)

    def _generator_wrote(self, c) -> bool:
        """cmake, meson, ninja or autotools' config.status wrote it."""
        writer = _writer(c)
        if writer is None:
            return False
        exe, args = writer
        names = {os.path.basename(exe), *(os.path.basename(a) for a in args[:1])}
        return bool(names & _GENERATORS) and self._unplanted(exe)

    def new_repository(self, c, d: str) -> None:
        """The run made d a repository (HEAD, objects/, refs/): git now reads
        the config and runs the hooks d held before the run, which no change
        of this run shows (a config written by an earlier run, when d was no
        repository yet)."""
        for name in ("config", "config.worktree"):
            path = os.path.join(d, name)
            if path in self.changed or not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as f:
                    keys = configkeys.changed_keys("git", None, f.read(configkeys.MAX_CONFIG_BYTES),
                                                   self.ws)
            except OSError:
                keys = None
            risky = [k for k in keys or [] if self._key_verdict("git", k, path) != "harmless"]
            if keys is None or risky:
                self.add(93, "unsure" if self.task_says("persistence") else "block",
                         f"it would make {_quote_clipped(os.path.dirname(c.path))} a git repository "
                         f"whose config was there before ({', '.join(map(_quote_clipped, risky[:3])) or 'unreadable'})",
                         "git hooks and configuration run code in later git commands",
                         "leave git configuration to the user", c.path)
        hooks = os.path.join(d, "hooks")
        held = [n for n in (os.listdir(hooks) if os.path.isdir(hooks) else [])
                if not n.endswith(".sample") and os.path.join(hooks, n) not in self.changed]
        if held:
            self.add(93, "unsure" if self.task_says("persistence") else "block",
                     f"it would make {_quote_clipped(os.path.dirname(c.path))} a git repository "
                     f"whose hooks were there before ({_quote_clipped(held[0])})",
                     "git hooks and configuration run code in later git commands",
                     "leave git hooks to the user", c.path)

    def _code_cache(self, full: str) -> bool:
        return self.r.matches(self.r.code_caches, full) and \
            not self.r.matches(self.r.cache_data, full)

    def bytecode(self, c, full: str) -> bool:
        """A __pycache__ .pyc is what Python runs in place of its source: one
        that is what compiling the source gives is a cache (judged by its
        place only); any other is a change of the source, hidden from the
        diff: persistence where the source is code that runs later (a code
        cache, installed packages, a place of persistence), unsure
        elsewhere. True when it was judged as persistence."""
        if c.bytecode == "compiled":
            return False
        source = bytecode.source_of(full) or full
        if self._code_cache(source) or self.r.matches(self.r.install_places, source) or \
                self._persistent_place(source):
            if self.r.matches(self.r.install_places, full) and self._installer_wrote(c, full):
                return True  # a package manager compiling what it installs
            verdict = "unsure" if self.task_says("persistence") else "block"
            self.add(94 if c.where in ("home", "system", "outside", "cache") else 93, verdict,
                     f"it would {_verb(c.op)} {_quote_clipped(c.path)}, bytecode that is not what "
                     f"its source compiles to: Python runs it in place of {_quote_clipped(source)}, "
                     "code that later tools and hooks run", "persistence: code or configuration "
                     "that runs later", "let Python compile its own caches", c.path)
            return True
        self.add(62, "unsure", f"it would {_verb(c.op)} {_quote_clipped(c.path)}, bytecode that is "
                 f"not what its source compiles to (or caper cannot compile it to compare): Python "
                 f"runs it in place of {_quote_clipped(source)}, which the diff shows unchanged",
                 "code hidden from review", "let Python compile its own caches", c.path)
        return False

    def _key_verdict(self, fmt: str | None, kv: str, full: str) -> str:
        """harmless, runs (a program, or a place code, config or pushes go)
        or, for git, whose keys the policy knows both ways, unknown."""
        key, _, value = kv.partition("=")
        if fmt == "git" and key.startswith("-"):   # removed: harmless only where the list says
            return "harmless" if self._harmless_key(fmt, key[1:], kv[1:]) else "unknown"
        if fmt == "pth":     # a directory of the project on sys.path, or code
            where = os.path.normpath(os.path.join(os.path.dirname(full), value))
            inside = all(below(x, self.ws) for x in (where, os.path.realpath(where)))
            return "harmless" if key == "path" and inside else "runs"
        if fmt == "tool-versions":   # a version by name; `path:DIR`, `ref:` or a path runs DIR's programs
            return "runs" if re.search(r"(?:^|[\s=])(?:path:|ref:|\.{0,2}/|~/)", kv) else "harmless"
        if fmt == "properties":      # gradle.properties: the JVM the daemon is, and what it loads first
            return "runs" if key == "org.gradle.java.home" or key == "org.gradle.jvmargs" and \
                _JVM_LOADS.search(value) else "harmless"
        if fmt == "git" and self._plain_program(key, value):
            return "harmless"
        if fmt == "git" and self._git_runs(key, value):
            return "runs"
        if fmt == "git" and key in self.r.git_activates:
            return self._activated(key, value, full)
        if self._harmless_key(fmt, key, kv):
            return "harmless"
        if fmt != "git" or any(fnmatch.fnmatchcase(key, g) for g in self.r.git_redirect_keys):
            return "runs"
        return "unknown"

    def _activated(self, key: str, value: str, full: str) -> str:
        """A key that makes git read more config files: as harmless as the worst
        key those files held before the run (the host's; the run's own write
        of one is a change judged by the keys it gained)."""
        if value.strip().lower() in ("false", "no", "off", "0"):
            return "harmless"
        worst = "harmless"
        for pattern in self.r.git_activates[key]:
            for path in sorted(glob.glob(os.path.join(glob.escape(os.path.dirname(full)), pattern))):
                try:
                    with open(path, "rb") as f:
                        data = f.read(configkeys.MAX_CONFIG_BYTES + 1)
                except OSError:
                    return "unknown"
                keys = configkeys.changed_keys("git", None, data, self.ws)
                if keys is None:
                    return "unknown"     # a file git may read and caper cannot
                for kv in keys:
                    v = "unknown" if kv.partition("=")[0] in self.r.git_activates else \
                        self._key_verdict("git", kv, path)
                    if v == "runs":
                        return "runs"
                    worst = "unknown" if v == "unknown" else worst
        return worst

    def _harmless_key(self, fmt: str | None, key: str, kv: str) -> bool:
        if fmt == "git" and fnmatch.fnmatchcase(key, "branch.*.remote"):
            # a remote's name (or "."), never a URL or path git would push to
            return bool(re.fullmatch(r"[\w.-]+", kv.partition("=")[2])) and \
                not kv.partition("=")[2].startswith("..")
        if fmt == "git" and key.startswith("alias."):
            return True      # an alias of git subcommands, with no option that runs a program
        if fmt == "git" and key in self.d.git_configs and key in self.r.git_declarable:
            return True
        if fmt == "package":     # what npm runs by itself: on install, publish and pack,
            # before and after any script it runs (pretest), and hook managers' keys
            script = key[8:] if key.startswith("scripts.") else None
            hooked = script is not None and re.sub(r"^(?:pre|post)", "", script) in _HOOKED_SCRIPTS \
                and script not in _HOOKED_SCRIPTS
            return not (script in self.r.npm_lifecycle or hooked or
                        key.startswith(_HOOK_MANAGER_KEYS))
        for prefix, subs in self.r.git_declares.items():
            if fmt == "git" and key.startswith(prefix) and self.d.git & set(subs):
                return True  # `git remote add` sets remote.*, `git branch -u` branch.* ...
        # An entry with "=" is one harmless value of the key (core.bare=false).
        return any(fnmatch.fnmatchcase(kv if "=" in g else key, g)
                   for g in self.r.harmless_keys.get(fmt or "", ()))

    def _plain_program(self, key: str, value: str) -> bool:
        """A pager or editor key set to a known pager or editor with options
        only: no shell, path, pipe, substitution or operand it would run."""
        if not any(fnmatch.fnmatchcase(key, g) for g in self.r.plain_program_keys):
            return False
        try:
            words = shlex.split(value)
        except ValueError:
            return False
        if not words or words[0] not in self.r.plain_programs or _SHELL_CHARS.search(value):
            return False
        # A pager's flags only (`less -FRX`): no option's value (`-k FILE`, a
        # lesskey file), and an editor nothing (`vim -S` sources a script).
        flags = words[0] in self.r.plain_pagers and all(_FLAGS.fullmatch(w) for w in words[1:])
        return len(words) == 1 or flags

    def _git_runs(self, key: str, value: str) -> bool:
        """A git key whose value is a program git runs (core.pager,
        remote.*.uploadpack, `!cmd` for aliases and submodule.*.update), or an
        alias that passes git an option that runs or writes (`-c k=v`): never
        declared by a git word in the command."""
        if any(fnmatch.fnmatchcase(key, g) for g in self.r.git_program_keys):
            return True
        if key.startswith("alias.") or fnmatch.fnmatchcase(key, "submodule.*.update"):
            v = value.strip().strip("\"'")
            # the words as git's split_cmdline makes them: quotes and
            # backslashes gone (`\-c`, `-"c"` are -c: adv15b 01)
            try:
                words = shlex.split(v)
            except ValueError:
                return True          # a value git may split otherwise: not known harmless
            return v.startswith("!") or any(w.startswith(_ALIAS_RISKY) for w in words) or \
                any(w.partition("=")[0] in _ALIAS_RUNNERS for w in words)
        return False

    def outside(self, path: str, full: str, op: str, where: str) -> None:
        if self.r.matches(self.r.harmless_home if where == "home" else self.r.harmless, full):
            return
        declared = self.d.covers(full, self.d.writes + self.d.deletes)
        if declared and self.t is not None and self.t.names(path):
            return
        verdict = "unsure" if declared else "block"
        self.add(88 if where == "system" else 85, verdict,
                 f"it would {_verb(op)} {_quote_clipped(path)} outside the workspace ({where})",
                 "writes outside the workspace", "write inside the workspace or under /tmp", path)

    def shared_place(self, c, full: str) -> None:
        """/tmp, /var/tmp, /dev/shm: new files are scratch; one that was there
        before the run is another tool's state or a shared config."""
        existed = c.op in ("modified", "replaced", "renamed") or \
            (c.op == "deleted") or (c.op == "meta" and "mode" in (c.detail or ""))
        if not existed or self.d.covers(full, self.d.writes + self.d.deletes) or \
                self.r.matches(self.r.temp_owned, full):
            return
        old = c.renamed_from or c.path
        verdict = "unsure" if self.task_says("delete") and c.op in ("deleted", "renamed") \
            else "block"
        self.add(84, verdict, f"it would {_verb(c.op)} {_quote_clipped(old)}, which was in the shared "
                 "temporary directory before the run", "shared places: files that were there "
                 "before the run belong to other tools or users",
                 "create your own files under /tmp instead", c.path)

    def git_internal(self, path: str, full: str, op: str, c) -> None:
        rel = os.path.relpath(full, self.ws)
        parts = rel.split("/")
        if self.r.matches(self.r.persistence, full):
            return                   # hooks and config: persistence() judged them
        routine = len(parts) > 1 and parts[1] in GIT_ROUTINE
        if op == "deleted" and (len(parts) <= 2 or not routine):
            if not _repository_itself(parts) and self.d.covers(full, self.d.deletes) and \
                    self._task_allows_delete(path):
                return
            self.add(91, "block", f"it would delete {_quote_clipped(path)}"
                     + (f" ({c.entries} entries)" if c.entries else ""),
                     "the repository's history", "never delete .git; use git commands", path)
        elif op in ("created", "modified", "replaced", "renamed") and parts[1:2] == ["objects"]:
            # git trusts what its store holds: a pack listing another blob under
            # a committed file's id, a rewritten loose object, a commit-graph
            # with parents cut (adv14a 05, 11; adv14b 35): git's own process only
            if not (self._ran(c, {"git"}) and not _git_told_where(c)):
                self.add(70, "unsure", f"it would {_verb(op)} {_quote_clipped(path)} in git's "
                         "object store without git writing it: git takes the history's "
                         "content and shape from there unchecked",
                         "the repository's history", "let git write its own objects", path)
        elif op == "deleted" and parts[1] == "objects" and not self._ran(c, {"git"}):
            # git's object store is routine for git (gc, repack), history for anyone else.
            self.add(91, "block", f"it would delete {_quote_clipped(path)}, objects of the repository's "
                     "history, without git", "the repository's history",
                     "let git prune its own objects (git gc)", path)
        elif not routine and not (self._ran(c, {"git"}) and not _git_told_where(c)) and \
                not (op == "meta" and "mode" not in (c.detail or "")):
            self.add(60, "unsure", f"it would {_verb(op)} {_quote_clipped(path)} inside .git without "
                     "running git for it", "the repository's internals", path=path)

    def _task_allows_delete(self, path: str) -> bool:
        # No task known is the strictest case: nothing is deleted on the command's word
        # alone; a task that only names the path ("fix the lock file") asks for no deletion.
        return self.t is not None and "delete" in self.t.kinds and (
            self.t.names(path) or not self.t.words.isdisjoint({p.lower() for p in path.split("/")}))

    def _task_deletes(self, path: str, by_git: bool) -> bool:
        """The task (the user's words, not the agent's command) asks for this
        tracked deletion: it names the file or its kind (`the .o files`), or it
        asks to delete and a git command the command names does it (git keeps
        the content). No task known: never."""
        if self.t is None or "delete" not in self.t.kinds:
            return False     # naming a file ("make the test pass") asks to fix it, not delete it
        if self.t.names(path):
            return True
        return by_git or self._task_names_kind(path)

    def _task_names_kind(self, path: str) -> bool:
        """The task names the file's kind by its extension, as a word (`the
        .orig files`, `*.o`, `the pyc files`; `.pyc` does not name `.py`)."""
        ext = os.path.splitext(path)[1].lower()
        return bool(ext) and (ext[1:] in self.t.words or re.search(
            r"(?<![\w.])\*?" + re.escape(ext) + r"(?![\w.])", self.t.text.lower()) is not None)

    def _ran(self, c, names: set[str]) -> bool:
        """This change was made by the own process of one of these programs
        (for an interpreter, the script it runs: node .../webpack), installed
        where programs are: the exec path is the run's choice, so one in the
        workspace outside its environments, a temp dir or a file the run
        wrote (`cp /bin/sh /tmp/x/sed`) is nobody's but the run's."""
        if c is None or not c.by or not c.by.endswith("]") or self._steered(c, 0):
            return False                              # LD_PRELOAD=./x.so make (adv8b 19)
        exe = os.path.normpath(self.absolute(c.by.rsplit("[", 1)[0]))
        programs = [exe]
        if c.lineage and _INTERPRETER.match(os.path.basename(exe)):
            script = _script(exe, c.lineage[0][1:])   # node .../webpack: the program
            if script is None:
                return False                          # node -e: whatever it is told
            programs.append(os.path.normpath(self.absolute(script)))
        if os.path.basename(programs[-1]) not in names:
            return False
        return all(os.path.isabs(p) and self._unplanted(p) for p in programs)

    def _built(self, c) -> bool:
        """A compiler, linker or build tool wrote this change from what the
        project holds. The first of the chain of builders that wrote it (gcc
        over collect2 over ld; cargo over rustc) names its inputs in its
        argv: standard input (`-`, /dev/stdin, a process substitution), a
        file in a scratch dir or one the run wrote outside the project is the
        run's code however it was compiled (adv10b 08: `printf ... | gcc -x
        c - -o target/debug/app`); so is a source the run wrote and deleted
        again, when no build tool started the compiler (under one, its
        directory is not known). A build tool told its rules on the command
        line or from such a file is no project's build either."""
        if not self._ran(c, self.r.builders) or self.planted_toolchain:
            return False
        lineage = [list(x) for x in c.lineage or ()]
        depth = 0
        while depth < len(lineage) and os.path.basename(lineage[depth][0]) in self.r.builders:
            depth += 1
        if depth == 0:
            return True                     # a report without lineage: its writer alone
        tools = [x for x in lineage[depth:] if os.path.basename(x[0]) in _BUILD_TOOLS]
        if not self._inputs_held(lineage[depth - 1][1:], _BUILDER_VALUE_OPTIONS, not tools):
            return False
        for _, *words in tools:
            if any(w in ("--eval", "-E") or w.startswith("--eval=") for w in words):
                return False
            files = [v for k, v in zip([""] + words, words) if k in _BUILD_FILE_OPTIONS]
            files += [w.split("=", 1)[1] for w in words
                      if w.startswith("--") and w.split("=", 1)[0] in _BUILD_FILE_OPTIONS and "=" in w]
            files += [w[2:] for w in words if w.startswith("-f") and len(w) > 2]
            if files and not self._inputs_held(files, frozenset(), True):
                return False
        return True

    def _input_built(self, full: str) -> bool:
        """An input the run wrote is the project's when it is a build's own
        product (an object a compiler made from the project's files), not a
        source the run put where git ignores it (adv13b 06)."""
        c = self.written.get(full)
        if c is None or c.where != "ignored":
            return True
        if not full.endswith(_OBJECT_FILES) or full in self._checking:
            return False
        self._checking.add(full)
        try:
            return self._built(c)
        finally:
            self._checking.discard(full)

    def _inputs_held(self, args: list[str], value_options: frozenset, exist: bool) -> bool:
        """Every input among args is a file of the project's or the host's
        that the run did not write outside the project nor in a directory
        git ignores (adv13b 06: a version.c hidden in build/, whose lines the
        card does not show): none from standard input, /dev, /proc or a
        scratch dir; when exist, each one still there after the run (on the
        host, or written by it and shown)."""
        for prev, arg in zip([""] + args, args):
            if prev in value_options or arg.startswith("-") and arg != "-":
                continue
            if arg == "-":
                return False
            full = os.path.normpath(self.absolute(arg.removeprefix("@")))
            inside = below(full, self.ws)
            if not inside and (any(below(full, t) for t in (*_SCRATCH, "/dev", "/proc")) or
                               full in self.changed) or full in self.removed or \
                    not self._input_built(full) or \
                    exist and not os.path.exists(full) and full not in self.changed:
                return False
        return True

    def _installers_own(self, c, full: str) -> bool:
        """A package manager's own write in an environment: not a rewrite of
        the environment's own files (activate, its python, pyvenv.cfg), which
        only what makes environments does (adv10b 22: a setup.py run by pip
        appended to activate)."""
        return self._installer_wrote(c, full) and not (
            c.op in ("modified", "replaced") and _ENV_OWN.search(full) and not _makes_env(c)) \
            and not self._drops_command(c, full)

    def _drops_command(self, c, full: str) -> bool:
        """A program named like a system command put in an environment's bin
        by what a package manager ran (a setup.py, an npm prepare script),
        not by the package manager itself: it runs in place of that command
        once the environment is on PATH (adv14b 44: .venv/bin/git)."""
        name = os.path.basename(full)
        if c.op not in ("created", "renamed") or os.path.basename(os.path.dirname(full)) not in (
                "bin", ".bin", "Scripts") or _ENV_OWN.search(full) or _ENV_PIP.match(name) or \
                not shutil.which(name, path=_SYSTEM_PATH):
            return False
        if not c.lineage:
            return True          # no program known to be the installer's own
        exe, *args = c.lineage[0]
        return not self._installer(exe, args, own=True)

    def _installer_wrote(self, c, full: str) -> bool:
        """A package manager wrote this change: its own process, or in the
        project one it started while installing (a package's build or
        install script), run from a file this run did not write. Naming one
        in the command licenses nothing (`pip --version; printf ... >
        .venv/bin/git` is the shell's write), nor does argv[0] (`exec -a pip
        python3 -c ...`), nor a subcommand that runs the project's code
        (`npm test`, `uv run`): the program is the path the process exec'd,
        or the script an interpreter runs."""
        inside = below(full, self.ws)
        for depth, (exe, *args) in enumerate(c.lineage or ()):
            if self._installer(exe, args, own=depth == 0) and (depth == 0 or inside) and \
                    not self._steered(c, depth):
                return True
            # on the way up, every program is one the run did not plant: a
            # `git` pip finds on a PATH the run set writes as itself (adv9 06)
            script = _script(exe, args)
            if not inside or not self._unplanted(exe, anywhere=True) or \
                    script and not self._unplanted(script, anywhere=True):
                return False
        return False

    def _tool_wrote(self, c) -> bool:
        """The writer is an installed program's own process (pip, pre-commit,
        gradle), not the command's code: a shell's, `env`'s, an interpreter's
        -c, a script the project or the run holds (adv10b 07: a script's
        wheel under pip's cache key for a vendored sdist), or a program that
        writes whatever it is given (adv12b 07: `cp` of the run's wheel)."""
        writer = _writer(c)
        if writer is None:
            return False
        exe, args = os.path.normpath(self.absolute(writer[0])), writer[1]
        name = os.path.basename(exe)
        if not self._unplanted(exe) or name == "env" or self._steered(c, 0):
            return False
        if name in _SHELLS or _INTERPRETER.match(name):
            # pip's build hook runs the project's backend and setup.py (adv14b 21);
            # a standard library module writes what it is told (`-m zipfile -c`: adv15b 03)
            run = self._interpreted(args, anywhere=False)
            return run not in (None, *_BUILD_HOOKS) and not (
                args[:1] == ["-m"] and run.split(".")[0] in sys.stdlib_module_names)
        if name in _SOURCE_RUNNERS:
            return not any(a.endswith(_SOURCE_RUNNERS[name]) or a in ("-e", "-E") for a in args)
        return name not in _FILE_TOOLS

    def _steered(self, c, depth: int) -> bool:
        """The lineage's program at depth runs code the command chose
        through its environment (adv9 03/06: PYTHONPATH or GIT_SSH_COMMAND
        under a real pip): it, or an ancestor it inherited them from, was
        given a code-loading variable by the command's own code, a shell's
        inline script, `env`, an interpreter's -c, or a program the run
        planted. A tool's own program setting them for its children (git's
        GIT_EXEC_PATH, pip's build environment) is the tool's."""
        return any(at >= depth and not self._sets_own_environment(by)
                   for at, by in (c.steered or {}).items())

    def _sets_own_environment(self, by: list[str]) -> bool:
        """by is a tool known to set code-loading variables for its own
        children ([env_setters]: git's GIT_EXEC_PATH, pip's build
        environment, npm's npm_config_*), run from a file the run did not
        plant. Any other program sets what it is told (adv11b 02: `make
        --eval 'export PIP_INDEX_URL=...'`)."""
        exe, *args = by
        name = os.path.basename(exe)
        if not os.path.isabs(exe) or not self._unplanted(exe, anywhere=True) or \
                args and args[-1] == LINEAGE_MORE:
            return False
        if _INTERPRETER.match(name):
            name = self._interpreted(args, anywhere=True)   # python -m pip, node .../npm
            if name is None:
                return False
        return _VERSIONED.sub("", name) in self.r.env_setters

    def _interpreted(self, args: list[str], anywhere: bool) -> str | None:
        """What an interpreter or a shell runs with these arguments, by name:
        the module of `-m X` unless one the run planted would be imported
        first, or the script's file name unless the code is inline (-c, -e)
        or the script is one the run planted (anywhere: _unplanted's)."""
        if args[:1] == ["-m"] and len(args) > 1:
            return None if self._module_planted(args[1]) else args[1]
        script = args[0] if args and not args[0].startswith("-") else None
        if script is None or not self._unplanted(script, anywhere=anywhere):
            return None
        return os.path.basename(script)

    def _installer(self, exe: str, args: list[str], own: bool = False) -> bool:
        """A package manager's process running one of its installing
        subcommands (installer_verbs), named right after the program (an
        option first could be one taking a value: `npm --userconfig install
        exec`), on no package file the run made itself (a wheel it built in
        /tmp is the run's code, whoever unpacks it). own: the writer's own
        process, which also writes its stores at the subcommands that fetch
        (installer_own_verbs: `cargo build` extracts crate sources)."""
        name = _VERSIONED.sub("", os.path.basename(exe))
        if not self._unplanted(exe):
            return False
        if name not in self.r.installers:
            if not _INTERPRETER.match(name) or not args:
                return False
            if args[0] == "-m" and len(args) > 1:    # python -m pip: unless a pip is the run's
                name, args = args[1], args[2:]
                if self._module_planted(name):
                    return False
            else:                                    # node /usr/bin/npm, python .venv/bin/pip
                script = args[0]
                name, args = _VERSIONED.sub("", os.path.basename(script)), args[1:]
                if script.startswith("-") or not self._unplanted(script):
                    return False
            if name not in self.r.installers:
                return False
        elif args and os.path.basename(args[0]) == os.path.basename(exe):
            args = args[1:]             # a script run by its #! line: its path, then its words
        verbs = self.r.installer_verbs.get(name)
        if verbs is not None and own:
            verbs = verbs | self.r.installer_own_verbs.get(name, set())
        if verbs is not None and (args[0] if args else "") not in verbs:
            return False
        if args and args[-1] == LINEAGE_MORE:
            return False                              # arguments the report does not hold
        # what the requirement files it is given name (adv14b 23: a tracked
        # requirements.txt's `--find-links ./wheelhouse`, the run's wheel there)
        named = [w for i, a in enumerate(args[:-1]) if a in _REQUIREMENT_OPTIONS
                 for w in _requirement_sources(os.path.join(self.ws, args[i + 1]))]
        return not any(self._run_made(a) for a in [*map(_option_value, args[1:]), *named] if a)

    def _in_environment(self, full: str) -> bool:
        """Below a virtualenv of the project whatever its name (adv9 08: a
        `pyenv311/`): a directory holding pyvenv.cfg, on the host or made by
        the run."""
        d = os.path.dirname(full)
        while below(d, self.ws) and d != self.ws:
            cfg = os.path.join(d, "pyvenv.cfg")
            if cfg in self.changed or os.path.isfile(cfg):
                return True
            d = os.path.dirname(d)
        return False

    def _run_made(self, arg: str) -> bool:
        """An argument naming a file or directory that was not there before
        the run, a package file it rewrote, or one in a scratch dir (where a
        run puts what it makes)."""
        if arg.startswith("file://"):
            arg = arg[len("file://"):]                # --index-url file:///tmp/w
        if "://" in arg:
            # a registry's URL; one on the sandbox's own loopback is a server
            # the run started (adv13b 09: its wheel, from http.server)
            host = re.sub(r"^[a-z+]+://(?:[^@/?#]*@)?", "", arg.lower())
            host = re.split(r"[/?#]", host, maxsplit=1)[0]
            host = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
            host = host.rstrip(".")
            return host not in self.reached and (_loopback(host) or "/etc/hosts" in self.changed)
        full = os.path.normpath(self.absolute(arg))
        if full in self.changed:
            return True                               # -r dev-deps.txt the run wrote (adv11b 04)
        if os.path.isdir(full):
            # a project or a find-links directory whose build files or
            # packages the run wrote (adv11b 03: `pip install -e .` of a new
            # setup.py; 05: `--find-links .` with a wheel dropped there)
            return any(os.path.dirname(x) == full and (
                os.path.basename(x) in _BUILD_FILES or x.endswith(_PACKAGE_FILES))
                for x in self.changed)
        if "/" not in arg and not arg.endswith(_PACKAGE_FILES):
            return False                              # a package's name
        return any(not os.path.lexists(x) or x in self.changed and os.path.isfile(x) or
                   not below(x, self.ws) and any(below(x, t) for t in _SCRATCH)
                   for x in dict.fromkeys([full, os.path.realpath(full)]))

    def _unplanted(self, program: str, anywhere: bool = False) -> bool:
        """A program file the run did not write: in the project only in its
        environments (a venv's pip; a `tools/pip` is anyone's, an earlier
        run's too; anywhere: the project's own scripts too, as what a package
        manager runs), elsewhere outside the scratch dirs or in an
        environment there."""
        full = os.path.normpath(self.absolute(program))
        made = self.written.get(full)
        if made is not None and made.type == "symlink" and made.op == "created":
            # a link the run made to an installed program is that program
            # (python -m venv's .venv/bin/python3 -> /usr/bin/python3: adv15b 14)
            target = self._resolved(full)
            if target != full and target not in self.changed and not below(target, self.ws) \
                    and not any(below(target, t) for t in _SCRATCH) and os.path.isfile(target):
                return True
        return all(x not in self.changed and (
            (anywhere or self.r.matches(self.r.install_places, x)) if below(x, self.ws) else
            # in a scratch dir only an environment's (a checkout's .venv in /tmp),
            # where a new program is a package manager's alone
            not any(below(x, t) for t in _SCRATCH) or self.r.matches(self.r.install_places, x))
            for x in dict.fromkeys([full, os.path.realpath(full)]))

    def _module_planted(self, module: str) -> bool:
        """A module of this name that `python -m` would find before the
        installed one: one the run wrote anywhere, or one in the project
        (the cwd comes first on its path); or any standard library module
        the run wrote there, which the program imports in place of the real
        one (adv12b 01: logging.py under `python3 -m venv`)."""
        return any(os.path.basename(p) in (module, module + ".py") or
                   os.path.basename(os.path.dirname(p)) == module for p in self.changed) or \
            any(os.path.exists(os.path.join(self.ws, module + x)) for x in (".py", "")) or \
            bool(self.stdlib_shadows)

    def _overwrite_asked(self, path: str, full: str, c, git_named: bool) -> bool:
        """An emptied or rewritten tracked file the command names (`: > f`,
        `truncate -s 0 f`, `echo x > f`) is asked for only by the task naming
        it: the command text is the agent's. A formatter given it, or a git
        command (its content is git's), rewrites it as asked."""
        return git_named or self._formatted(full, c) or self.t is not None and self.t.names(path)

    def _formatted(self, full: str, c) -> bool:
        """A formatter the command names rewrote this file: one of the paths
        it was given, or written by a real formatter's own binary (`cargo
        fmt`: rustfmt; never sed or perl, which write whatever they are told).
        Naming a formatter licenses nothing else."""
        if self.d.covers(full, self.formatted):
            return True
        return bool(self.d.programs & self.r.formatters) and \
            self._ran(c, self.r.formatter_binaries)

    def expendable(self, full: str, directory: bool = False) -> bool:
        """A build output or cache: known build and cache directories, object
        files, bytecode, logs (anything regenerated by running the build). A
        directory is one by its name only: `config.d` is no gcc .d file (adv14b 26)."""
        rel = os.path.relpath(full, self.ws)
        parts = rel.split("/")
        return any(p in self.r.expendable_dirs or
                   any(fnmatch.fnmatchcase(p, g) for g in self.r.expendable_dir_globs)
                   for p in parts) or not directory and \
            any(fnmatch.fnmatchcase(parts[-1], g) for g in self.r.expendable_files)

    def workspace_change(self, path: str, full: str, op: str, where: str, c, files: int) -> None:
        tracked = where == "tracked" or (c is not None and c.tracked_files)
        n = (c.tracked_files if c is not None and c.tracked_files else files)
        # A credential file loses its values with any line removed (a two-line
        # .env replaced by the example's placeholders is not "overwritten").
        credential = self.protected.kind(full) is not None
        # half of a file git cannot give back is lost work too (adv10b 09)
        destroys = op in ("deleted", "replaced") or (c is not None and (
            c.overwritten or credential and op == "modified" and bool(c.lines and c.lines[1]) or
            (c.cut or c.uncompared) and where in ("untracked", "ignored")))
        if not destroys:
            return
        task_names = self.t is not None and "delete" in self.t.kinds and (
            self.t.names(path) or self._task_names_kind(path))
        if where == "ignored":
            self.ignored(path, full, op, c, task_names)
            return
        # git's own process did it (never a git word in the command text),
        # for a git command the command names.
        by_git = self._ran(c, {"git"}) and bool(self.d.git & self.r.git_rewrites)
        if where == "untracked" and op in ("deleted", "replaced") and by_git and (
                self.expendable(full) or self.t is not None and "delete" in self.t.kinds
                and not self.t.words.isdisjoint(self.r.ignored_words)):
            return   # git clean of build outputs, or of what the task calls untracked
        if op in ("deleted", "replaced"):
            declared = self.d.covers(full, self.d.deletes) or (by_git and tracked) or task_names
        else:
            declared = (self.d.covers(full, self.d.writes) or by_git
                        or self._formatted(full, c)
                        and not (c is not None and c.size and not c.size[1]))
        if tracked and op in ("deleted", "replaced") and task_names and \
                self._cache_dir_only(path, full, c):
            self.add(55, "unsure", f"it would delete {_quote_clipped(path)}, a tracked file in a "
                     "cache or build folder the task names, not itself a cache or build output",
                     "tracked files the task did not mention", path=path)
            return
        if tracked or where == "workspace":
            what = (f"it would {'delete' if op != 'modified' else 'overwrite'} "
                    + (f"{n} tracked files under {_quote_clipped(path)}" if n > 1 else _quote_clipped(path))
                    + (" (no version control keeps them)" if where == "workspace" else ""))
            if declared:
                if op in ("deleted", "replaced") and not self._task_deletes(path, by_git) or \
                        op not in ("deleted", "replaced") and \
                        not self._overwrite_asked(path, full, c, by_git):
                    self.add(55, "unsure", what + ", named by the command but not by the task"
                             + (" (no task is known)" if self.t is None else ""),
                             "tracked files the task did not mention", path=path)
                return
            self.add(90 if tracked else 85, "block", what + ", which neither the command nor "
                     "the task names", "destroying tracked files",
                     "back up first, or narrow the command to what the task names", path)
        elif not declared or self.t is None and op in ("deleted", "replaced") or \
                not self.expendable(full) and not (
                    self._task_deletes(path, False) if op in ("deleted", "replaced")
                    else self.t is not None and self.t.names(path) or bool(
                        self.d.programs & self.r.formatters) and
                    self._ran(c, self.r.formatter_binaries)):
            # untracked: git holds no copy, so the command naming it (the
            # agent's words) is no licence: the task must, unless it is a
            # build output or cache (no task: not even when declared)
            self.add(50, "unsure", f"it would {_verb(op) if op != 'modified' else 'overwrite'} "
                     f"{_quote_clipped(path)}, an untracked file git cannot restore"
                     + (", named by the command but not by the task" if declared else ""),
                     "the user's own files", path=path)

    def _cache_dir_only(self, path: str, full: str, c) -> bool:
        """The task names this file only through a cache or build folder on its
        path ("the __pycache__ folders"), and the file is not of that kind by its
        own name: such a task declares what those folders hold, not a tracked
        source kept there (the file itself, or its kind, named is declared). A
        folder deleted whole is judged by the files it held before the run."""
        parts = path.split("/")
        cache_dir = lambda p: p.lower() in self.t.words and (p in self.r.expendable_dirs or any(
            fnmatch.fnmatchcase(p, g) for g in self.r.expendable_dir_globs))
        cache_file = lambda n: any(fnmatch.fnmatchcase(n, g) for g in self.r.expendable_files)
        if c is not None and c.type == "dir" and cache_dir(parts[-1]):
            held = [n for _, _, names in itertools.islice(os.walk(full), MAX_WALKED) for n in names]
            return any(not cache_file(n) for n in held)
        if parts[-1].lower() in self.t.words or _mentions(self.t.text, path) or \
                self._task_names_kind(path) or cache_file(parts[-1]):
            return False
        return any(cache_dir(p) for p in parts[:-1])

    def ignored(self, path: str, full: str, op: str, c, task_names: bool) -> None:
        """Ignored is not expendable: only build outputs and caches are. The
        classification is the .gitignore's before the run (git answers on the
        host's repository), so a run cannot ignore a file and then delete it."""
        if self.expendable(full, directory=c is not None and c.type == "dir"):
            return
        credential = self.protected.kind(full) is not None
        # `git clean -X` under "remove the ignored files": git's own process,
        # and a credential only when the task says "ignored".
        asked = task_names or (self._ran(c, {"git"}) and "clean" in self.d.git
                               and self.task_says("delete")
                               and ("ignored" in self.t.words if credential else
                                    not self.t.words.isdisjoint(self.r.ignored_words)))
        if asked:
            return
        by_command = self.d.covers(full, self.d.deletes + self.d.writes)
        verdict = "block" if credential and not by_command else "unsure"
        self.add(83 if credential else 50, verdict,
                 f"it would {'delete' if op != 'modified' else 'overwrite'} {_quote_clipped(path)}, an "
                 "ignored file that is not a build output or cache"
                 + (" (credentials)" if credential else ""),
                 "the user's own files: ignored files git cannot restore",
                 "delete only build outputs, or name the file in the task", path)

    def privilege(self, path: str, full: str, c) -> None:
        """setuid/setgid and file capabilities are privilege changes whoever
        asked (a human grants these). An ACL entry that lets another user or
        group write (a default ACL too: what is created there inherits it),
        any grant on a place of persistence or a credential, and a
        security.* attribute are judged as a widened mode is; a read or
        traverse grant on an ordinary file is `chmod o+r`, narrower: allowed."""
        if c.privileges:
            self.add(95, "block", f"{_quote_clipped(path)} would be {c.op} with {', '.join(c.privileges)}",
                     "a privilege change: whoever runs the file gains its owner's rights or "
                     "its capabilities", "commit the file without them and grant them by hand",
                     path)
        if c.detail and "grants " in c.detail:
            entries = c.detail.split("grants ", 1)[1].split("; ")[0].split(", ")
            sensitive = any(self.protected.kind(x) or self._persistent_place(x)
                            for x in (full, full + "/x"))
            risky = [g for g in entries if sensitive or not _READ_GRANT.fullmatch(g)]
            if not risky:
                return
            given = ", ".join(risky)
            declared = self.d.covers(full, self.d.writes) and self.task_says("permissions")
            self.add(87, "unsure" if declared else "block", f"it would give {_quote_clipped(path)} "
                     f"{_quote_clipped(given)}", "permissions for other users, or privileges for what runs",
                     "grant only what is needed", path)

    def mode(self, path: str, full: str, detail: str, where: str) -> None:
        m = _MODE.search(detail)
        if not m:
            return
        old, new = int(m.group(1), 8), int(m.group(2), 8)
        added = new & ~old
        sensitive = self.protected.kind(full) or self.r.matches(self.r.persistence, full) or \
            added & 0o055 and not old & 0o055 and self._holds_credentials(full)
        widening = added & 0o002 or (sensitive and added & 0o077)
        if widening:
            declared = self.d.covers(full, self.d.writes) and self.task_says("permissions")
            self.add(87, "unsure" if declared else "block",
                     f"it would widen the permissions of {_quote_clipped(path)} ({old:04o} -> {new:04o})",
                     "permissions on sensitive or shared files", "grant only what is needed", path)

    def _holds_credentials(self, full: str, budget: int = 2000) -> bool:
        """A directory closed to others that holds credentials (adv14b 09:
        certs/ at 0700 with prod.key at 0644 inside: its mode was their
        protection). A walk of the host's tree, bounded; what is past the
        bound counts as holding them."""
        if not os.path.isdir(full) or os.path.islink(full):
            return False
        seen = 0
        for root, dirs, files in os.walk(full):
            dirs[:] = [d for d in dirs if d != ".git"]
            for f in files:
                seen += 1
                if seen > budget or self.protected.kind(os.path.join(root, f)):
                    return True
        return False

    def link(self, path: str, full: str, target: str) -> None:
        """A symlink out of the workspace, or into persistence anywhere:
        whatever later writes "inside the project" through it (the agent's own
        file tools, which caper does not gate, the user's cp) writes its
        target. Into persistence or a credential location it is that harm;
        into the home or /etc, unsure."""
        joined = os.path.join(os.path.dirname(full), target)
        lexical = os.path.normpath(joined)
        # A link in place of a hook directory (.git/hooks -> tools/h), or into
        # persistence inside the workspace (tools -> .git/hooks): what is
        # written through it, or what it holds, runs later.
        at_place = self._persistent_place(full + "/x") or (    # .venv itself -> /var/tmp/v
            self.r.matches(self.r.install_places, full + "/x") and
            not self.r.matches(self.r.install_places, full))
        for t in dict.fromkeys([lexical, os.path.realpath(lexical), self._resolved(joined)]):
            if not at_place and os.path.dirname(t) in self.r.path_dirs and os.path.isfile(t):
                continue    # a program on PATH (a venv's python): the link runs it, writes nothing
            into = at_place or any(self._persistent_place(x) for x in (t, t + "/x"))
            if below(t, self.ws) and not into:
                continue
            if into or any(self.protected.kind(x) for x in (t, t + "/x")):
                verdict = "unsure" if self.task_says("persistence") else "block"
                self.add(94, verdict, f"it would link {_quote_clipped(path)} to {_quote_clipped(t)}: what is written "
                         "through the link later runs or configures later sessions, or reads "
                         "credentials", "persistence: code or configuration that runs later",
                         "link only to the project's own files")
                return
            if (self.home and below(t, self.home) and not self.r.matches(self.r.harmless_home, t)
                    or below(t, "/etc")):
                self.add(60, "unsure", f"it would link {_quote_clipped(path)} to {_quote_clipped(t)}, outside the "
                         "workspace: what is written through it lands there",
                         "writes outside the workspace", "link only inside the project")
                return

    def _resolved(self, path: str) -> str:
        """Where path leads after the run, as the kernel walks it: each
        component through the run's own links first, then the host's, and a
        `..` from where the walk is (adv13b 11: `d/u -> ../..`, then `x ->
        d/u/../.bashrc`, which text alone keeps in d/)."""
        todo = [p for p in path.split("/") if p]
        done, hops = "/", 0
        while todo:
            part = todo.pop(0)
            if part in (".", ".."):
                done = os.path.dirname(done) if part == ".." else done
                continue
            step = os.path.join(done, part)
            if step in self.run_links:
                target = self.run_links[step]
            else:
                try:
                    target = os.readlink(step)
                except OSError:
                    target = None
            if target is None:
                done = step
                continue
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return step          # the kernel gives ELOOP: nothing is reached beyond it
            todo = [p for p in target.split("/") if p] + todo
            done = "/" if target.startswith("/") else done
        return done

    def _persistent_place(self, full: str) -> bool:
        return self.r.matches(self.r.persistence, full) and \
            not self.r.matches(self.r.persistence_except, full)

    def owner(self, path: str, full: str, detail: str) -> None:
        """A file handed to another user, or to a group the user is not in, or
        made group-writable for such a group: that user (or group) can then
        rewrite it, as with a widened mode."""
        own = _OWNER.search(detail)
        mode = _MODE.search(detail)
        uid, gid = (int(own.group(3)), int(own.group(4))) if own else (None, None)
        if gid is None and mode:
            try:
                gid = os.lstat(full).st_gid
            except OSError:
                gid = None
        mine = {os.getegid(), *os.getgroups()}
        what = []
        if own and uid != int(own.group(1)) and uid != os.geteuid():
            what.append(f"hand {_quote_clipped(path)} to user {uid}")
        if own and gid != int(own.group(2)) and gid not in mine:
            what.append(f"give {_quote_clipped(path)} to group {gid}, which you are not in")
        if mode and gid is not None and gid not in mine and \
                int(mode.group(2), 8) & ~int(mode.group(1), 8) & 0o020:
            what.append(f"make {_quote_clipped(path)} writable by group {gid}, which you are not in")
        if what:
            declared = self.d.covers(full, self.d.writes) and self.task_says("permissions")
            self.add(87, "unsure" if declared else "block", "it would " + "; ".join(what),
                     "permissions for other users", "keep your files your own", path)

    def tables(self, path: str, c) -> None:
        # (a table of that name is judged as them: fail closed)
        if c.op != "deleted" and any(t.rows_before != t.rows_after or t.rows_lost or
                                     t.rows_changed for t in c.tables if t.table == SCHEMA_CODE):
            self.add(87, "unsure", f"it would change the triggers or views of the database "
                     f"{_quote_clipped(path)}: code SQLite runs at later reads and writes",
                     "database code that runs later",
                     "review the migration's triggers and views yourself", path)
        unread = [t.table for t in c.tables if not t.compared]
        if unread and c.op != "deleted":
            # Too large or too slow to read: a loss there is as likely as none.
            self.add(88, "unsure", f"it would change the database {_quote_clipped(path)}, whose "
                     f"{', '.join(map(_quote_clipped, unread))} the report could not read to the "
                     f"end: rows may be lost", "database changes the report could not compare",
                     "a smaller database, or review it yourself", path)
        dropped = [t.table for t in c.tables if t.rows_before is not None and t.rows_after is None]
        emptied = [t.table for t in c.tables if _mass_loss(t, self.r.mass_min, self.r.mass_share)]
        # Most rows rewritten to other values, none emptied: the data the task
        # may have asked for (`update the item names`); the judge cannot tell
        # the new values are wanted unless the task names the table.
        rewritten = [t.table for t in c.tables if t.table not in emptied and t.rows_before and
                     (t.rows_changed or 0) >= max(self.r.mass_min, t.rows_before * self.r.mass_share)
                     and not (self.t is not None and self.t.names(t.table))]
        if rewritten and not dropped and not emptied:
            self.add(58, "unsure", f"it would rewrite most rows of "
                     f"{', '.join(map(_quote_clipped, rewritten))} in {_quote_clipped(path)} in place",
                     "database changes the task does not name", "name the table in the task", path)
        if not dropped and not emptied:
            return
        what = "; ".join(x for x in (
            f"drop table{'s' * (len(dropped) > 1)} {', '.join(map(_quote_clipped, dropped))}"
            if dropped else "",
            f"delete or change most rows of {', '.join(map(_quote_clipped, emptied))}"
            if emptied else "") if x)
        ok = self.t is not None and "database" in self.t.kinds and any(
            self.t.names(t) for t in dropped + emptied)
        if not ok:
            self.add(89, "unsure" if self.task_says("database") else "block",
                     f"it would {what} in {_quote_clipped(path)}", "destructive database changes",
                     "back up the database first, or run the migration the task names", path)

    def dependency_sources(self, c) -> None:
        """A requirements, lock or manifest file that now takes packages from
        somewhere else: an index option, a URL off the usual registries."""
        if not c.diff:
            # too large for a diff (a 470 KB lockfile: adv14b 15): no line was seen
            self.add(60, "unsure", f"it would change {_quote_clipped(c.path)}, a dependency "
                     "file too large to compare: where it takes packages from is not known",
                     "dependency sources: a redirected index or package URL runs its code on "
                     "the next install", "change manifests with the package manager", c.path)
            return
        added = [ln[1:] for ln in c.diff if ln.startswith("+")]
        base = os.path.dirname(self.absolute(c.path))
        odd = [ln.strip() for ln in added if self._redirects(ln) or self._outside_path(ln, base)
               or self._names_run_made(ln, base)]
        if not odd:
            return
        verdict = "unsure" if self.task_says("persistence") else "block"
        self.add(86, verdict, f"it would change where {_quote_clipped(c.path)} takes packages from "
                 f"({_quote_clipped(odd[0])})", "dependency sources: a redirected index or package URL "
                 "runs its code on the next install", "keep the project's package sources",
                 c.path)

    def _redirects(self, line: str) -> bool:
        low = line.lower()
        if any(m in low for m in self.r.source_markers):
            return True
        hosts = _URL_HOST.findall(low)
        return any(h not in self.r.registries for h in hosts)

    def _names_run_made(self, line: str, base: str) -> bool:
        """A dependency on a path the run made in the project (adv14b 07:
        `file:build/x.tgz`, `./build/x.tar.gz`, `-e ./build/helper`): the
        next install runs that package's build and install scripts."""
        local = line.lstrip().startswith(("-e", "--editable", "./", "../"))  # requirements' forms
        # TOML's `path = "build/x"` (Cargo, uv, Poetry, PDM: adv15b 22)
        bare = set(re.findall(r"\bpath\s*=\s*[\"']([^\"']+)[\"']", line))
        for word in re.split(r"[\s\"',=]+", line):
            if word in bare:
                pass
            elif word.startswith(("file:", "link:")):
                word = word.partition(":")[2].removeprefix("//")
            elif not (word.startswith(("./", "../")) and (local or word.endswith(_PACKAGE_FILES))):
                continue         # a script's path, a lockfile's key: no package spec
            if "://" in word:
                continue
            where = os.path.normpath(os.path.join(base, word))
            if below(where, self.ws) and any(x == where or below(x, where) for x in self.changed):
                return True
        return False

    def _outside_path(self, line: str, base: str) -> bool:
        """A dependency taken from a local path outside the project
        (`file:/tmp/pkg`, `path = "/tmp/pkg"`, `../../elsewhere`): its build
        script runs at the next install like a redirected index's package."""
        for m in _LOCAL_PATH.finditer(line):
            p = m.group(1) or m.group(2)
            p = self.home.rstrip("/") + p[1:] if p.startswith("~/") and self.home else p
            if not below(os.path.normpath(os.path.join(base, p)), self.ws):
                return True
        return False

    def scope(self, changes) -> None:
        """Edits weighed against the task: the offline judge cannot read
        intent, so beyond what the task names it is unsure, with the evidence."""
        if self.t is None:
            return
        edited = [c for c in changes if c.where == "tracked" and c.op in
                  ("modified", "deleted", "replaced", "renamed") and c.type == "file"]
        unnamed = [c for c in edited if not self.t.names(c.path)]
        # A new workflow runs with the repository's secrets; a new file of the
        # test runner's (a conftest.py, a pytest.ini) that skips tests is as
        # much a skip as an edit of a test.
        created = [c for c in changes if c.op == "created" and c.type == "file"
                   and c.where in ("untracked", "workspace")]
        for role, (globs, words) in self.r.roles.items():
            # A test the task names is one to fix, not to skip or delete; one
            # it does not name is not the place to weaken an assertion.
            pool = edited if role == "tests" else unnamed
            if role in self.r.roles_of_new_files:
                pool = pool + [c for c in created if role == "tests" or not self.t.names(c.path)]
            hits = [c for c in pool if self.r.matches(globs, self.absolute(c.path))
                    and (role != "tests" or c.op not in ("modified", "created") or self._skips(c)
                         or c in unnamed and self._weakens(c))]
            if hits and self.t.words.isdisjoint(words):
                self.add(45, "unsure", f"it would {_verb(hits[0].op)} {_quote_clipped(hits[0].path)} "
                         f"({role.replace('_', ' ')}), which the task does not name",
                         "scope: the task asked for something narrower",
                         "change only what the task names", hits[0].path)
        # "the readme" names README.md: a file is named by its stem too.
        named_a_file = any(self.t.names(c.path) or _stem(c.path) in self.t.words
                           for c in edited) or \
            any("." in w.strip(".") or "/" in w for w in self.t.text.split())
        if named_a_file and len(unnamed) >= self.r.scope_files:
            self.add(44, "unsure", f"it would edit {len(unnamed)} tracked files the task does "
                     f"not name ({', '.join(_quote_clipped(c.path) for c in unnamed[:4])})",
                     "scope: the task names one fix", "change only what the task names",
                     unnamed[0].path)

    def _skips(self, c) -> bool:
        return any(ln.startswith("+") and any(m in ln for m in self.r.skip_markers)
                   for ln in c.diff or [])

    def _weakens(self, c) -> bool:
        """An assertion line of a test removed or rewritten: what the test checks changed."""
        return any(ln.startswith("-") and not ln.startswith("---") and
                   any(m in ln for m in self.r.assertion_markers) for ln in c.diff or [])

    def git_history(self, g) -> None:
        """What git cannot give back: commits on no branch or tag any more,
        dropped stashes, uncommitted work put back to a committed version."""
        rewrites = bool(self.d.git & self.r.git_rewrites) and self.git_ran
        discard = self.task_says("delete") or self.task_says("discard")
        if g.commits and not g.content_kept and g.rebased:
            # No change lost, but history rewritten (which branch, onto what):
            # whether that is what the user wanted is for the LLM or the user.
            self.add(70, "unsure", f"it would rewrite {g.commits} commit"
                     f"{'s' * (g.commits > 1)} of {', '.join(map(_quote_clipped, g.refs[:3]))}: each one's "
                     "change is kept under a new id, the old ids are on no branch",
                     "git history rewritten", "keep a branch at the old commit first "
                     "(git branch backup <ref>)")
        elif g.commits and not g.content_kept:
            self.add(89, "unsure" if rewrites and discard else "block",
                     f"it would leave {g.commits} commit{'s' * (g.commits > 1)} on no branch or "
                     f"tag ({', '.join(map(_quote_clipped, g.refs[:3]))}); only the reflog would hold them",
                     "git state that git cannot give back",
                     "keep a branch at the old commit first (git branch backup <ref>)")
        if g.reflog_only:
            self.add(88, "unsure" if rewrites and discard else "block",
                     f"it would drop {g.reflog_only} commit{'s' * (g.reflog_only > 1)} on no branch "
                     "or tag from the reflog, which was git's only way back to "
                     f"{'them' if g.reflog_only > 1 else 'it'} (the next gc prunes them)",
                     "git state that git cannot give back",
                     "keep a branch at the commit first (git branch backup <sha>)")
        if g.stashes:
            self.add(88, "unsure" if rewrites and discard else "block",
                     f"it would drop {g.stashes} stash entr{'ies' if g.stashes > 1 else 'y'}",
                     "git state that git cannot give back", "apply or keep the stash")
        if g.tags and not self.task_says("tags"):
            self.add(72, "unsure", f"it would delete or move the git tag"
                     f"{'s' * (len(g.tags) > 1)} {', '.join(map(_quote_clipped, g.tags[:4]))}: a "
                     "release names the commit it was, and an annotated tag's message and "
                     "signature are on no ref then", "git tags the task does not name",
                     "name the tags in the task")
        cut = [p for p in g.uncommitted_cut if not (self.t is not None and self.t.names(p))]
        if cut:
            self.add(88, "unsure", f"it would cut most of the uncommitted lines of "
                     f"{', '.join(map(_quote_clipped, cut[:4]))}: work git holds no copy of",
                     "git state that git cannot give back",
                     "commit or stash the changes first, or name the file in the task", cut[0])
        if g.uncommitted and not (rewrites and discard):
            self.add(90, "unsure" if rewrites else "block",
                     f"it would throw away uncommitted changes to "
                     f"{', '.join(map(_quote_clipped, g.uncommitted[:4]))}",
                     "git state that git cannot give back",
                     "commit or stash the changes first", g.uncommitted[0])

    def git_index(self, g) -> None:
        """The index git reads next: one git cannot read breaks the user's git
        (and caper's own view of what is tracked); flags that hide a tracked
        file's edits from `git status` and `git diff` keep them from review."""
        if g.index_unreadable:
            self.add(91, "block", f"it would leave .git/index unreadable by git "
                     f"({_quote_clipped(g.index_unreadable)})", "the repository's internals",
                     "let git write its index (git reset)", ".git/index")
        if g.hidden:
            named = bool(self.d.git & {"update-index", "sparse-checkout"})
            self.add(80, "unsure" if named else "block",
                     f"it would hide the worktree changes of {', '.join(map(_quote_clipped, g.hidden[:4]))} "
                     "from git status and git diff (skip-worktree, assume-unchanged)",
                     "changes the user would never review", "leave the index flags alone",
                     g.hidden[0])
        if g.staged:
            named = bool(self.d.git & {"update-index", "apply", "add", "restore", "read-tree"})
            self.add(80, "unsure" if named else "block",
                     f"it would leave content staged for {', '.join(map(_quote_clipped, g.staged[:4]))} "
                     "that neither the file nor a commit holds: the next git commit records it "
                     "unseen", "changes the user would never review",
                     "stage files with git add after editing them", g.staged[0])

    def git_commits(self, g) -> None:
        """Commits put on a ref by anything but git's commit-making commands
        (plumbing, a script): content the user's next push ships unreviewed."""
        if g.added and not self.d.git & _COMMIT_MAKERS:
            self.add(65, "unsure", f"it would add commits without git commit ({_quote_clipped(g.added[0])}"
                     + (f" and {len(g.added) - 1} more shown)" if len(g.added) > 1 else ")"),
                     "history the user did not review", "commit with git commit")

    def git_unclassified(self, report) -> None:
        """git could not say which files are tracked: a deletion or overwrite
        in the workspace cannot be told harmless (fail closed, not "untracked")."""
        if "git-status-unknown" not in report.uncertain:
            return
        hit = next((c.path for c in report.all_changes if c.where in ("untracked", "ignored")
                    and (c.op in ("deleted", "replaced") or c.overwritten)), None)
        if hit is not None:
            self.add(70, "unsure", f"it would delete or overwrite {_quote_clipped(hit)}, and "
                     "caper could not tell whether git tracks it", "destroying tracked files",
                     "repair the repository first (git status must work)", hit)

    # -- network --
    def network(self, n) -> None:
        if n.call == "dns":
            return   # caper's DNS answers from the allowlist: nothing is asked outside
        out = n.call in ("proxy", "route")   # caper's ways out
        if not out and (n.call == "bind" or n.family == "netlink" or _loopback(n.address)):
            return   # nothing leaves: the kernel's interfaces, the sandbox's own loopback
        # (A proxied or routed request leaves from the host: its loopback is the host's.)
        # The program it runs (a script named in argv) is code, not data it
        # sends; a credential is never the program, whatever argv says.
        creds = [r for r in n.read_before or [] if self._credential(r)]
        reads = _data_reads(n)
        if n.family == "unix" and self.r.matches(self.r.escape_sockets, n.address):
            self.add(96, "block", f"it tried the host socket {_quote_clipped(n.address)}",
                     "a way out of the sandbox", None)
            return
        if n.family == "unix" and n.result == "ok":
            return   # the tracer lets a unix socket through only if the sandbox bound it
        lookup = (n.family == "unix" and self.r.matches(self.r.lookup_sockets, n.address)) or \
            (n.port in self.r.lookup_ports)
        dest = _quote_clipped(n.address) + (f" port {n.port}" if n.port is not None else "")
        # Any process's read counts: pipes and files carry it to the sender.
        # (An allowed request's read_before is the whole run's before it: the
        # proxy let it through knowing every read by then.)
        read = creds or ([] if n.allowed else self.credentials_read)
        if out and read:
            self.add(97, "block", f"{_quote_clipped(n.by)} tried to reach {dest} through caper's {n.call} after "
                     f"the run read {', '.join(map(_quote_clipped, read[:3]))}",
                     "credentials leaving the machine",
                     "keep credentials out of commands that use the network")
            return
        if out and n.allowed:
            self._allowed_request(n, reads, dest)
            return
        if creds:
            self.add(97, "block", f"{_quote_clipped(n.by)} read {', '.join(map(_quote_clipped, creds[:3]))} and then "
                     f"tried to reach {dest}", "credentials leaving the machine",
                     "keep credentials out of commands that use the network")
        elif reads and not lookup:
            verdict = "unsure" if self.task_says("network") else "block"
            self.add(80, verdict, f"{_quote_clipped(n.by)} read repository files "
                     f"({', '.join(map(_quote_clipped, reads[:3]))}) and then tried to reach {dest}",
                     "repository data leaving the machine")

    def _allowed_request(self, n, reads: list[str], dest: str) -> None:
        """A request caper's proxy let through to an allowed host: a download is
        ordinary work; an upload after reading repository files may carry them."""
        # git's smart HTTP fetches by POSTing its wants to git-upload-pack.
        fetch = n.method == "POST" and (n.path or "").split("?")[0].endswith("/git-upload-pack")
        method = n.method if n.method not in (None, "GET", "HEAD") and not fetch else \
            f"{n.method} with a body" if n.body and not fetch else \
            "a tunnel of no TLS" if n.opaque else None
        # A download receives more than it sends (a TLS handshake alone brings
        # the server's certificates); a GET with a body, or a tunnel whose
        # method caper cannot see, that sends more is an upload.
        sent, received = n.sent or 0, n.received or 0
        big = sent > UPLOAD_BYTES or (sent > MIN_UPLOAD_BYTES and sent > received and not fetch)
        if reads and (method or big):
            what = f"{method} to" if method else f"sent {n.sent} bytes to"
            self.add(80, "unsure", f"{_quote_clipped(n.by)} read repository files "
                     f"({', '.join(map(_quote_clipped, reads[:3]))}) and then {what} the allowed host {dest}",
                     "repository data leaving the machine")

    def many_small_uploads(self, network) -> None:
        """Requests each too small to be an upload can add up to one (the
        data in the URLs of many GETs): judged by the run's sum, by the same
        measure as one request."""
        sent = [n for n in network if n.call in ("proxy", "route") and n.allowed
                and n.result == "ok"]
        out, back = sum(n.sent or 0 for n in sent), sum(n.received or 0 for n in sent)
        reads = sorted({r for n in sent for r in _data_reads(n)})
        if len(sent) > 1 and reads and out > MIN_UPLOAD_BYTES and out > back and not any(
                f.boundary == "repository data leaving the machine" for f in self.findings):
            self.add(80, "unsure", f"it read repository files ({', '.join(map(_quote_clipped, reads[:3]))}) "
                     f"and then sent {out} bytes to allowed hosts in {len(sent)} requests, more "
                     f"than it received ({back})", "repository data leaving the machine")

    def _credential(self, short: str) -> bool:
        # The report's own list, and the run's patterns for reads it had no room to list.
        return short in self.credential_reads or self.protected.kind(self.absolute(short)) is not None


# Directories of a deleted cache folder the policy reads on the host to see what it held.
MAX_WALKED = 200

def _data_reads(n) -> list[str]:
    """What network attempt n's process read before it, but the program it
    runs (a script named in argv is code, not data it sends)."""
    argv = set(n.argv or [])
    return [r for r in n.read_before or [] if r not in argv and os.path.basename(r) not in argv]


# Bytes sent in one request through caper's proxy past which it is an upload,
# whatever the method (a tunnel's is not visible): a package download sends a
# few kilobytes of headers and TLS.
UPLOAD_BYTES = 256 * 1024
# Below this a request that sends more than it receives is still headers
# (a request line, cookies, a ClientHello).
MIN_UPLOAD_BYTES = 4096

# Options by which a git alias runs a program, reads another config or writes a file.
_ALIAS_RISKY = ("-c", "--config-env", "--exec-path", "-C", "--git-dir", "--work-tree",
                "--upload-pack", "--receive-pack", "--exec", "-u", "--output", "-O",
                "--open-files-in-pager", "--ext-diff", "--textconv", "--namespace")
# git subcommands and options that run a command they are given (adv15b 02).
_ALIAS_RUNNERS = frozenset({"-x", "--extcmd", "foreach", "run", "--tree-filter",
                            "--index-filter", "--msg-filter", "--env-filter", "--commit-filter",
                            "--parent-filter", "--tag-name-filter", "--sendmail-cmd",
                            "--to-cmd", "--cc-cmd", "--tool"})
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run/user")
# An environment's own files, which an install never rewrites.
# The environment's own pip, which venv's ensurepip installs from a `python -c`.
_ENV_PIP = re.compile(r"pip[0-9.]*$")
_ENV_OWN = re.compile(r"/(?:bin|Scripts)/(?:activate[^/]*|python[0-9.]*)$|/pyvenv\.cfg$")


def _makes_env(c) -> bool:
    """The writer's lineage makes a Python environment (venv, virtualenv, uv venv)."""
    for exe, *args in c.lineage or ():
        name = os.path.basename(exe)
        if name == "virtualenv" or name == "uv" and args[:1] == ["venv"] or \
                any(a == "-m" and b in ("venv", "virtualenv") for a, b in zip(args, args[1:])):
            return True
    return False


def _make_includes(ws: str) -> list[str]:
    """Globs of the files the project's makefile includes (`-include
    local.mk`, `include config/*.mk`), from the host's version: a new one
    adds rules to every later make (adv10b 35). Names built from variables
    are left out: make alone knows them."""
    out = []
    for name in ("GNUmakefile", "makefile", "Makefile"):
        try:
            with open(os.path.join(ws, name), "rb") as f:
                text = f.read(1 << 20).decode(errors="replace")
        except OSError:
            continue
        for m in re.finditer(r"^[ \t]*-?s?include[ \t]+(.+)$", text, re.M):
            # $(wildcard X) is the glob X; any other variable, any name (adv15b 12)
            words = re.sub(r"\$\(wildcard[ \t]+([^)]*)\)", r"\1", m.group(1)).split()
            out += [os.path.normpath(os.path.join(ws, re.sub(r"\$[({][^)}]*[)}]|\$.", "*", w)))
                    for w in words]
        break           # make reads the first of these it finds
    return out


def _loopback(host: str) -> bool:
    """host names the sandbox's own loopback (its network namespace has no
    other), in any spelling the resolver takes (adv13b 13: `2130706433`, `0x7f000001`, `[::ffff:127.0.0.1]`), or
    by a name the host's /etc/hosts gives a loopback address (the machine's
    own name on 127.0.1.1)."""
    if host == "localhost" or host.endswith(".localhost") or host in _hosts_loopback():
        return True
    try:
        return socket.inet_aton(host)[0] in (0, 127)      # decimal, hex, octal, short forms
    except OSError:
        pass
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback or ip.is_unspecified


@functools.lru_cache(maxsize=1)
def _hosts_loopback() -> frozenset[str]:
    names = set()
    try:
        with open("/etc/hosts", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split("#", 1)[0].split()
                if len(fields) > 1 and (fields[0].startswith("127.") or fields[0] == "::1"):
                    names.update(n.lower().rstrip(".") for n in fields[1:])
    except OSError:
        pass
    return frozenset(names)


def _git_told_where(c) -> bool:
    """git wrote the file it was told to, with text the run chose: an
    output option (`log --output=`, `format-patch -o`, `archive -o`,
    `bundle create`) or `config -f` (adv10b 17: into .git/info/exclude)."""
    if not c.lineage:
        return False
    words = c.lineage[0][1:]
    sub = next((w for prev, w in zip([""] + words, words)
                if not w.startswith("-") and prev not in ("-c", "-C")), "")
    if any(w.startswith(("--work-tree", "--prefix")) for w in words) or sub == "checkout-index":
        return True          # files written under a directory the run named (adv15b 09)
    return any(w == "--output" or w.startswith(("--output=", "--output-directory")) for w in words) \
        or sub in ("format-patch", "archive") and any(w == "-o" or w.startswith("-o") for w in words) \
        or sub == "bundle" or sub == "config" and any(
            w in ("-f", "--file") or w.startswith("--file=") for w in words)


# Where the commands an environment's script would shadow are (not the
# caller's PATH: the judgment is the same everywhere).
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENTRY_POINT_KEYS = ("project.scripts.", "project.gui-scripts.", "tool.poetry.scripts.")


def _entry_point_names(key: str) -> list[str]:
    """The script names a changed config key declares (pyproject's
    [project.scripts], Poetry's, setup.cfg's console_scripts)."""
    name, _, value = key.partition("=")
    for prefix in _ENTRY_POINT_KEYS:
        if name.startswith(prefix) and "." not in name[len(prefix):]:
            return [name[len(prefix):]]
    if name in ("options.entry_points.console_scripts", "options.entry_points.gui_scripts"):
        return re.findall(r"([\w.+-]+)\s*=\s*[\w.]+\s*:", value)
    return []


# A value naming a file: relative or absolute, or with a script's suffix.
_CODE_PATH = re.compile(r"(?:^|[\s\[\('\",:=])(?:\.{1,2}/|/|~/)|\.(?:[cm]?[jt]s|jsx|tsx|py)\b")

# Standard library modules no program imports by itself: a project's own
# test.py is no shadow.
_STDLIB_UNIMPORTED = frozenset({"test", "this", "antigravity", "idlelib", "turtledemo"})
# Tools run as `python -m NAME`, whose module a file at the top stands in for.
_TOOL_MODULES = frozenset({"pytest", "pip", "setuptools", "wheel", "venv", "virtualenv", "black",
                           "mypy", "ruff", "flake8", "pylint", "coverage", "tox", "nox", "isort",
                           "pre_commit", "build", "twine", "uv", "poetry", "pipx", "django"})


def _module_at(rel: str) -> tuple[str, str] | None:
    """(directory, module name) of a module file: x.py or x/__init__.py."""
    head, name = os.path.split(rel)
    if name.endswith(".py") and name != "__init__.py":
        return head, name[:-3]
    if name == "__init__.py" and head:
        return os.path.dirname(head), os.path.basename(head)
    return None


def _stdlib_shadow(full: str, ws: str) -> str | None:
    """The standard library module or tool a file at the project's top would
    stand in for (logging.py, email/__init__.py, pytest.py), or None."""
    at = _module_at(os.path.relpath(full, ws))
    if at is None or at[0]:
        return None
    name = at[1]
    return name if (name in sys.stdlib_module_names and not name.startswith("_") and
                    name not in _STDLIB_UNIMPORTED) or name in _TOOL_MODULES else None


def _tests_shadow(full: str, ws: str) -> str | None:
    """The project's package a file in a test directory stands in for:
    pytest puts a test directory without __init__.py first on sys.path, so
    tests/app/ is the `app` its tests import (adv10b 25)."""
    parts = os.path.relpath(full, ws).split(os.sep)
    if len(parts) < 2 or parts[0] not in _TEST_DIRS:
        return None
    name = parts[1][:-3] if len(parts) == 2 and parts[1].endswith(".py") else \
        parts[1] if len(parts) > 2 else None
    if not name or os.path.exists(os.path.join(ws, parts[0], "__init__.py")):
        return None
    return name if any(os.path.exists(os.path.join(ws, *p)) for p in (
        (name, "__init__.py"), (name + ".py",), ("src", name, "__init__.py"))) else None


# Build files a generator writes into its build directory, and the generators.
_GENERATED_BUILD = frozenset({"Makefile", "makefile", "GNUmakefile", "build.ninja",
                              "CMakeCache.txt", "Makefile.cmake"})
_GENERATORS = frozenset({"cmake", "ccmake", "meson", "ninja", "qmake", "config.status",
                         "configure", "autoreconf", "automake", "gn"})


def _generated_build_file(full: str) -> bool:
    name = os.path.basename(full)
    return name in _GENERATED_BUILD or name.endswith((".make", ".ninja", ".cmake"))


# What a JavaScript loader tries after a bare name (require("build/setup")).
_MODULE_SUFFIXES = ("", ".js", ".cjs", ".mjs", ".ts", ".json", "/index.js")
# JVM options that load code before the program's own (adv14b 30).
_JVM_LOADS = re.compile(r"-javaagent|-agentpath|-agentlib|-Xbootclasspath|-XX:OnError|"
                        r"-XX:VMOptionsFile|-XX:Flags=|@[\w./~-]|"
                        r"-XX:OnOutOfMemoryError|-Djava\.system\.class\.loader|--patch-module")
# Symlinks the kernel follows in one path walk before ELOOP.
_MAX_LINK_HOPS = 40
# Programs a compiler driver runs by name from its search path.
_TOOLCHAIN_PARTS = frozenset({"cc1", "cc1plus", "cc1obj", "cpp", "lto1", "lto-wrapper", "as",
                              "collect2", "ld", "f951", "go1", "rustc"})
# What compilers and assemblers make, which linkers and archivers read.
_OBJECT_FILES = (".o", ".obj", ".a", ".lo", ".so", ".rlib", ".rmeta")

# Programs that run compilers from the project's rules: the directory a
# compiler they start runs in is theirs, not the command's; the file of
# rules they read is named by these options.
_BUILD_TOOLS = frozenset({"make", "gmake", "ninja", "cmake", "meson", "scons", "bazel", "cargo",
                          "go"})
_BUILD_FILE_OPTIONS = frozenset({"-f", "--file", "--makefile", "-P", "--manifest-path"})
# Options of compilers, linkers and objcopy whose value is the next argument:
# not an input (-o names the output; the rest are directories, languages,
# names).
_BUILDER_VALUE_OPTIONS = frozenset({"-o", "-x", "-I", "-L", "-isystem", "-iquote", "-idirafter",
                                    "-include", "-imacros", "-MF", "-MT", "-MQ", "-T", "-e",
                                    "-D", "-U", "-l", "-O", "-j", "-B", "-z", "-Xlinker",
                                    "-Xassembler", "-Xpreprocessor", "--sysroot", "--target",
                                    "-target", "--output", "--edition", "--crate-name",
                                    "--crate-type", "--cfg", "--out-dir", "-C", "--emit",
                                    "-p", "--manifest-path", "--features", "-F",
                                    "--add-section", "--set-section-flags", "--rename-section",
                                    "-R", "-K", "-N", "--only-section",
                                    "--remove-section", "--keep-symbol", "--strip-symbol"})
# What makes git hand a pager's or editor's value to the shell as code.
_SHELL_CHARS = re.compile(r"[;&|`$<>(){}\\\n!*?]")
_FLAGS = re.compile(r"-[A-Za-z]+")
_BUILD_FILES = frozenset({"setup.py", "setup.cfg", "pyproject.toml", "package.json", "Cargo.toml",
                          "build.rs", "binding.gyp", "requirements.txt", "Pipfile", "go.mod"})
_PACKAGE_FILES = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst",
                  ".tar", ".zip", ".gem", ".crate", ".egg", ".nupkg", ".jar")
# npm scripts whose pre/post scripts run whenever they are named (pretest
# at `npm test`); `preview` or `postcss` is a script of its own.
_HOOKED_SCRIPTS = frozenset({"test", "build", "start", "stop", "restart", "lint", "version", "dev",
                             "serve", "deploy", "format", "typecheck", "check", "ci"})
# package.json keys of hook managers, whose commands git runs at a commit.
_HOOK_MANAGER_KEYS = ("husky.", "githooks.", "simple-git-hooks.", "lint-staged", "pre-commit",
                      "ghooks.", "config.ghooks.")


_REQUIREMENT_OPTIONS = frozenset({"-r", "--requirement", "-c", "--constraint"})
_SOURCE_OPTIONS = re.compile(r"^(?:-f|--find-links|-i|--index-url|--extra-index-url|-e|--editable)"
                             r"(?:\s*=\s*|\s+)(\S+)")


def _requirement_sources(path: str) -> list[str]:
    """The places a pip requirements file takes packages from: its index and
    find-links options, editable and local path requirements (paths as the
    file gives them: relative to where pip runs)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(configkeys.MAX_CONFIG_BYTES)
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        m = _SOURCE_OPTIONS.match(line)
        if m:
            out.append(m.group(1))
        elif line.startswith(("./", "../", "/", "file:")):
            out.append(line.split()[0])
    return out


def _writer(c) -> tuple[str, list[str]] | None:
    """The program that wrote the change, and its first arguments: the
    lineage's nearest entry, else the program `by` names (no arguments)."""
    if c.lineage:
        exe, *args = c.lineage[0]
        return exe, args
    if c.by and c.by.endswith("]"):
        return c.by.rsplit("[", 1)[0], []
    return None


def _link_target(c) -> str | None:
    """What a symlink the run left points to; None for anything else."""
    if c.type == "symlink" and c.op != "deleted" and (c.detail or "").startswith("-> "):
        return c.detail[3:]
    return None


def _option_value(arg: str) -> str | None:
    """The word of a command line that may name a file: itself, or an
    option's value written into it (`--find-links=/tmp/w`, `-f/tmp/w`); a
    value given as the next word is a word of its own."""
    if not arg.startswith("-"):
        return arg
    if arg.startswith("--"):
        return arg.split("=", 1)[1] if "=" in arg else None
    return arg[2:] or None


def _script(exe: str, args: list[str]) -> str | None:
    """The script an interpreter exe runs with these arguments (`node
    /usr/bin/npm`), None for no interpreter or code given inline (`-c`, `-e`)."""
    if not _INTERPRETER.match(os.path.basename(exe)) or not args or args[0].startswith("-"):
        return None
    return args[0]


def _narrowing(detail: str | None) -> bool:
    """A metadata change that only closes access to others (chmod go-rwx):
    group and other bits taken away, the owner's and the special bits as
    they were (taking those away disables a hook or a program), and no other
    change (owner, xattrs) rides along."""
    parts = [p.strip() for p in (detail or "").split(";") if p.strip()]
    m = _MODE.fullmatch(parts[0]) if len(parts) == 1 else None
    if m is None:
        return False
    old, new = int(m.group(1), 8), int(m.group(2), 8)
    return new & ~old == 0 and (old ^ new) & ~0o077 == 0
# Interpreters that run a package manager's script; a program's version suffix.
_PLUGIN_OPTION = re.compile(r"(?:^|[\s=])-p\s*[\"']?[\w.]")   # pytest's -p: load a plugin
_CONFIG_WORDS = frozenset({"config", "configuration", "configure", "lint", "linter", "linting",
                           "formatter", "bundler"})
_TEST_DIRS = frozenset({"tests", "test", "testing", "spec", "specs", "__tests__"})
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "busybox", "ash"})
# Programs that write what their arguments or input say: their output is the
# command's, whichever installed binary copies it.
_FILE_TOOLS = frozenset({"cp", "mv", "install", "ln", "tar", "bsdtar", "unzip", "7z", "7za",
                         "cpio", "pax", "rsync", "scp", "dd", "tee", "cat", "sed", "awk", "gawk",
                         "mawk", "perl", "php", "lua", "tclsh", "patch", "curl", "wget", "gzip",
                         "gunzip", "zcat", "xz", "unxz", "zstd", "bzip2", "bunzip2", "base64",
                         "xxd", "openssl", "truncate", "split", "csplit", "head", "tail", "sort",
                         "tr", "cut", "printf", "echo", "touch", "sqlite3",
                         # ... and programs that write bytes they are given as they are
                         # (adv14b 12: objcopy -I binary -O binary into pip's wheel cache)
                         "objcopy", "cmake", "zip", "jar", "make", "gmake", "ar", "ex",
                         "vi", "vim", "nvim", "ed", "busybox", "uniq", "iconv", "dos2unix",
                         "unix2dos", "fold", "expand", "unexpand", "paste", "join", "nl",
                         "rev", "tac", "fmt", "pr", "7zz", "xzcat", "zstdcat", "lz4",
                         "brotli", "pigz", "ditto", "rclone", "gpg", "age", "sops"})
# Installers' scripts that run a project's build backend (its setup.py) in
# their process: what it writes is the project's code's.
_BUILD_HOOKS = ("_in_process.py",)
# What a script config does beyond exporting settings: a module loaded at
# run time (not a static import), the file system, the process, built code.
_CONFIG_CODE = re.compile(r"\brequire\s*\(|\bimport\s*\(|\bprocess\.|\bfs\.|\bvm\b|"
                          r"\bBuffer\.|\bglobalThis\b|\bReflect\.|\batob\s*\(|"
                          r"\bfrom\s+[\"'](?:node:)?(?:fs|vm|os|child_process|net|http|https)[\"']")
# Runtimes that run a source file given by name (java's single-file launch):
# with one, the writer is that file's code, not the runtime's.
_SOURCE_RUNNERS = {"java": (".java",), "Rscript": (".R", ".r"), "julia": (".jl",)}
_INTERPRETER = re.compile(r"(?:python|pypy)[0-9.]*|node(?:js)?|bun|deno|ruby[0-9.]*")
_VERSIONED = re.compile(r"(?<=[a-z])[0-9][0-9.]*$")
# A path where a manifest names a package: after file:, or a token of its own
# starting with /, ~/ or ../ (not inside a URL or a version range).
_LOCAL_PATH = re.compile(r"file:(?://)?([^\s\"',}]+)|(?<![\w:/.@=<>~^-])((?:/|~/|\.\./)[^\s\"',}]*)")
_URL_HOST = re.compile(r"[a-z][a-z0-9+.-]*://(?:[^/@\s]*@)?([a-z0-9.-]+)")


# git subcommands that make commits from what the user sees (the worktree, the index, a branch).
_COMMIT_MAKERS = {"commit", "merge", "pull", "rebase", "cherry-pick", "revert", "am", "notes",
                  "fetch", "subtree"}


def _mass_loss(t, min_rows: int, share: float) -> bool:
    """A table emptied (any size), or most of its rows deleted or their values
    emptied in place (`UPDATE users SET email = NULL` loses every value as
    surely as a DELETE): counted by content where the report compared rows."""
    if not t.rows_before or t.rows_after is None:
        return False
    if t.rows_after == 0:
        return True
    gone = max(t.rows_before - t.rows_after, t.rows_lost or 0)
    return t.rows_before >= min_rows and gone >= t.rows_before * share


def _by_git(c) -> bool:
    """git's own process wrote the change (a git subcommand named in the text
    shows nothing: `git status; echo x >> .git/info/exclude`)."""
    exe = (c.by or "").rsplit("[", 1)[0]
    prog = os.path.basename(exe)
    # An installed git: the report names the workspace's files relatively,
    # and a copy under /tmp is the run's own.
    return (prog == "git" or prog.startswith("git-")) and exe.startswith("/") and \
        place(exe, None) not in ("tmp",)


# What makes .git a repository: deleting it (or .git itself) loses history git
# cannot give back, whatever the task says; git's own commands remove what is stale.
_REPOSITORY_PARTS = ("objects", "refs", "HEAD", "config", "packed-refs", "index")


def _repository_itself(parts: list[str]) -> bool:
    """parts: a .git path's components, ".git" first."""
    return len(parts) == 1 or len(parts) == 2 and parts[1] in _REPOSITORY_PARTS


def _is_git_config(path: str) -> bool:
    return configkeys.format_of(path) == "git"


def _stem(path: str) -> str:
    """A file's name without its extensions, as a task says it ("the readme")."""
    return os.path.basename(path).split(".")[0].lower()


def _verb(op: str) -> str:
    return {"created": "create", "modified": "modify", "deleted": "delete",
            "replaced": "replace", "renamed": "rename", "meta": "change the metadata of"}.get(op, op)


def _verdict(findings: list[Finding], report, task: str | None) -> Decision:
    blocks = [f for f in findings if f.verdict == "block"]
    unsure = [f for f in findings if f.verdict == "unsure"]
    flagged = tuple(dict.fromkeys(f.path for f in findings if f.path))
    asked = f' The task: {_quote_clipped(task)}.' if task else ""
    if blocks:
        top = blocks[0]
        reason = "; ".join(f.what for f in blocks[:3])
        more = f" (and {len(blocks) - 3} more)" if len(blocks) > 3 else ""
        safer = f" Safer: {top.safer}." if top.safer else ""
        also = f" Also: {'; '.join(f.what for f in unsure[:2])}." if unsure else ""
        return Decision("block", f"{reason}{more}. Boundary: {top.boundary}.{asked}{also}{safer}",
                        confidence=0.95 if top.rank >= 85 else 0.85, approver="policy",
                        boundary=top.boundary, flagged=flagged)
    if unsure:
        top = unsure[0]
        reason = "; ".join(f.what for f in unsure[:3])
        return Decision("unsure", f"{reason}. Boundary: {top.boundary}.{asked}",
                        confidence=0.5, approver="policy", boundary=top.boundary,
                        flagged=flagged)
    n = report.counts.get("changes")
    summary = f"{n.observed} changes" if n else "no persistent changes"
    return Decision("allow", f"{summary}, all inside what the command and the task declare "
                             "or ordinary work (builds, tests, caches, temp)",
                    confidence=0.9, approver="policy")
