"""What configures the agents caper gates, and what their settings make them
run on the host: the files an agent's own tools must never write (its
settings, which can turn caper's hook off; its skills, commands, sub-agents
and MCP servers, which run code with no shell call a hook sees), and the
programs those settings name (a hook script, a status line, an MCP server),
which run on the host at the agent's next event as they are on disk."""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
import tomllib

from caper.fs.syscalls import read_quiet, stamp
from caper.report.secrets import glob_regex

# Relative patterns are the project's; ~ is the home.
CONTROL_FILES = (
    ".claude/**", "~/.claude/**", "~/.claude.json", ".mcp.json", "/etc/claude-code/**",
    ".gemini/**", "~/.gemini/**", "/etc/gemini-cli/**",
    ".codex/**", "~/.codex/**", "/etc/codex/**",
    "~/.config/caper/**",
    # git's configuration and hooks, in every repository: the agent runs git
    # itself, on the host (Claude Code's worktrees, its status at start), and
    # a filter or hook planted there runs then (round 7).
    ".git/**",
)
# The agent's own notes (Claude Code's memory and plans): text it reads back,
# never runs, and writes with its own tools by design.
NOTES = ("~/.claude/projects/*/memory/**", "~/.claude/plans/**")

# The settings each agent reads, relative to the project or the home (~).
SETTINGS = (
    ".claude/settings.json", ".claude/settings.local.json", "~/.claude/settings.json",
    "~/.claude/settings.local.json", "/etc/claude-code/managed-settings.json", ".mcp.json",
    ".gemini/settings.json", "~/.gemini/settings.json", "/etc/gemini-cli/settings.json",
    ".codex/hooks.json", "~/.codex/hooks.json", ".codex/config.toml", "~/.codex/config.toml",
)
# The keys whose values are a program and its arguments, in any of them.
PROGRAM_KEYS = {"command", "args", "apiKeyHelper", "awsAuthRefresh", "awsCredentialExport",
                "otelHeadersHelper", "toolDiscoveryCommand", "toolCallCommand", "notify"}
_PROJECT_VARS = re.compile(r"\$\{?(?:CLAUDE_PROJECT_DIR|GEMINI_PROJECT_DIR|PWD)\}?")
_HOME_VARS = re.compile(r"\$\{?HOME\}?")


def _absolute(pattern: str, project: str, home: str | None) -> str | None:
    if pattern.startswith("~/"):
        return home.rstrip("/") + pattern[1:] if home else None
    return pattern if pattern.startswith("/") else os.path.join(project, pattern)


def _matches(patterns: tuple[str, ...], path: str, project: str, home: str | None) -> bool:
    """A project pattern matches at any depth of the project (Claude Code
    finds the skills of nested `.claude` directories too)."""
    for p in patterns:
        if p.startswith("~/"):
            if not home:
                continue
            rx = re.escape(home.rstrip("/") + "/") + glob_regex(p[2:])
        elif p.startswith("/"):
            rx = glob_regex(p)
        else:
            rx = re.escape(project.rstrip("/") + "/") + "(?:.*/)?" + glob_regex(p)
        if re.match(rx + r"\Z", path, re.S):
            return True
    return False


def is_control_file(path: str, project: str, home: str | None) -> bool:
    """Whether the absolute path configures an agent or caper (and is not
    the agent's own notes): by its place, or by being what one of those
    places resolves to (a `.claude` that is a symlink to another folder)."""
    if _matches(NOTES, path, project, home):
        return False
    if _matches(CONTROL_FILES, path, project, home):
        return True
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in _resolved_places(
        project, home))


def _resolved_places(project: str, home: str | None) -> list[str]:
    """The control places (a folder's `/**` or a file) as they resolve."""
    out = []
    for p in CONTROL_FILES:
        full = _absolute(p.removesuffix("/**"), project, home)
        if full:
            out.append(os.path.realpath(full))
    return out


def programs_run(project: str, home: str | None) -> tuple[str, ...]:
    """The files the agents' settings (project, home, system) name as a
    program or an argument of one: a path with a `/`, or a name that is a
    file of the project."""
    out: list[str] = []
    for rel in SETTINGS:
        path = _absolute(rel, project, home)
        if path:
            out += _programs_of(path, project, home, *stamp(path))
    return tuple(dict.fromkeys(out))


@functools.lru_cache(maxsize=64)
def _programs_of(path: str, project: str, home: str | None, mtime_ns: int,
                 size: int) -> tuple[str, ...]:
    """One settings file's programs, read again only when the file changed;
    a file that does not parse names none (the agent refuses it too)."""
    if size < 0:
        return ()
    try:
        raw = read_quiet(path, 4 << 20)
        doc = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (OSError, ValueError):
        return ()
    out: list[str] = []
    for text in _program_strings(doc):
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        for w in words:
            w = _HOME_VARS.sub(home or "~", _PROJECT_VARS.sub(project, w))
            if w.startswith("~/") and home:
                w = home.rstrip("/") + w[1:]
            if not w or w.startswith("-") or "=" in w.split("/")[0]:
                continue
            full = os.path.normpath(os.path.join(project, w))
            if "/" in w or os.path.isfile(full):
                out.append(full)
    return tuple(out)


def _program_strings(doc) -> list[str]:
    """Every string under a program key, at any depth."""
    out: list[str] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k in PROGRAM_KEYS:
                    out += [v] if isinstance(v, str) else \
                        [x for x in v if isinstance(x, str)] if isinstance(v, list) else []
                if isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return out


# --- skills and sub-agents: the hooks their front matter declares --------------------------
# Claude Code registers a skill's or a sub-agent's front-matter `hooks:` when
# it starts, and runs them on the host for the agent's next events (round 6):
# no shell call of theirs reaches caper.

# Folders no skill lives in, pruned from the search for nested `.claude` ones.
_PRUNED = {".git", "node_modules", ".venv", "venv", "__pycache__", "target", "dist", "build",
           ".cache", ".tox"}
SEARCH_LIMIT = 20000   # folders of a project searched for nested `.claude` ones


class TooManyFolders(Exception):
    """The project is too large to search for nested skills."""


def definitions(project: str, home: str | None) -> list[str]:
    """Claude Code's skill, command and sub-agent files: the project's (in
    `.claude` at any depth: it finds those of subfolders too), the user's
    and the user's plugins'. Raises TooManyFolders past SEARCH_LIMIT."""
    roots: list[str] = [os.path.join(home, ".claude")] if home else []
    seen = 0
    for d, dirs, _files in os.walk(project):
        seen += 1
        if seen > SEARCH_LIMIT:
            raise TooManyFolders(project)
        if ".claude" in dirs:
            roots.append(os.path.join(d, ".claude"))
        dirs[:] = [x for x in dirs if x not in _PRUNED and x != ".claude"]
    out: list[str] = []
    for root in roots:
        for kind in ("skills", "commands", "agents"):
            for d, _dirs, files in os.walk(os.path.join(root, kind)):
                out += [os.path.join(d, f) for f in files if f.endswith(".md")]
    plugins = os.path.join(home, ".claude", "plugins") if home else None
    if plugins:
        for d, _dirs, files in os.walk(plugins):
            parts = set(d.split(os.sep))
            if parts & {"skills", "commands", "agents"}:
                out += [os.path.join(d, f) for f in files if f.endswith(".md")]
    return out


def front_matter(path: str) -> str | None:
    """The YAML front matter of a Markdown file, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(256 << 10)
    except OSError:
        return None
    m = re.match(r"\A\ufeff?---[ \t]*\r?\n(.*?)(?:\r?\n)---[ \t]*(?:\r?\n|\Z)", head, re.S)
    return m.group(1) if m else None


def names_of(path: str, matter: str) -> set[str]:
    """The names a definition answers to: its front matter's name, its
    file's stem, a skill's directory, with the `dir:` prefixes of nested
    commands and the plugin prefix left to the caller's last component."""
    names = {os.path.splitext(os.path.basename(path))[0]}
    if os.path.basename(path) == "SKILL.md":
        names.add(os.path.basename(os.path.dirname(path)))
    m = re.search(r"^name\s*:\s*[\"']?([^\"'\n#]+?)[\"']?\s*$", matter, re.M)
    if m:
        names.add(m.group(1).strip())
    return names


def hooked_definitions(name: str, project: str, home: str | None) -> list[str]:
    """The definitions called `name` (its last `:` component too) whose
    front matter declares hooks, in any form YAML allows."""
    wanted = {name, name.rsplit(":", 1)[-1]}
    out = []
    for path in definitions(project, home):
        matter = front_matter(path)
        if matter is not None and re.search(r"""(?:^|[\s{,"'])hooks["']?\s*:""", matter) and \
                names_of(path, matter) & wanted:
            out.append(path)
    return out
