"""The keys a run set in configuration files that tools read later (git's,
npm's, pip's, cargo's, yarn's): the facts the policy weighs by allow-list,
instead of looking for alarming words in a diff.

A file's format is known by its name and place; its two versions are parsed
and the (key, value) pairs the run added or changed are returned. git's
files are parsed by git itself (`git config --file -`, which reads and
never runs anything), the others here.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib

from caper.fs.programs import find_program, safe_path
from caper.fs.syscalls import read_quiet

GIT_TIMEOUT_S = 10
MAX_CONFIG_BYTES = 256 * 1024
MAX_KEYS = 32            # listed per file; more are counted in the last entry
VALUE_CHARS = 80
MAX_INCLUDED = 16        # git config files followed through include.path


# Linters', type checkers' and test runners' INI files: keys there load
# plugins or run code (pylint's init-hook), which editors run on open.
_TOOL_INI = frozenset({"pylintrc", ".pylintrc", ".coveragerc", "mypy.ini", ".mypy.ini",
                       "setup.cfg", "tox.ini", "pytest.ini", ".flake8"})
# JavaScript tools' data configs: their values may name a plugin, parser or
# preset file the tool loads (adv12b 06, 11).
_TOOL_JSON = frozenset({".prettierrc", ".prettierrc.json", ".eslintrc", ".eslintrc.json",
                        ".babelrc", ".babelrc.json", ".stylelintrc", ".stylelintrc.json",
                        ".mocharc.json", ".swcrc", "tsconfig.json", "jsconfig.json",
                        # postcss-load-config's, nyc's, c8's, nodemon's, commitlint's,
                        # semantic-release's, remark's, nx's (adv14b 27)
                        ".postcssrc", ".postcssrc.json", ".nycrc", ".nycrc.json", ".c8rc",
                        ".c8rc.json", "nodemon.json", ".commitlintrc", ".commitlintrc.json",
                        ".releaserc", ".releaserc.json", ".remarkrc", ".remarkrc.json",
                        "nx.json"})
_TOOL_YAML = frozenset({".prettierrc.yaml", ".prettierrc.yml", ".eslintrc.yaml",
                        ".eslintrc.yml", ".stylelintrc.yaml", ".stylelintrc.yml",
                        ".mocharc.yaml", ".mocharc.yml", ".postcssrc.yml", ".postcssrc.yaml",
                        ".nycrc.yml", ".nycrc.yaml", ".commitlintrc.yml", ".commitlintrc.yaml",
                        ".releaserc.yml", ".releaserc.yaml"})
# Version managers' files: one tool's versions a line (uv, pyenv, nvm, rbenv)
# or `tool version` lines (asdf, mise).
_VERSION_FILES = frozenset({".tool-versions", ".python-version", ".node-version", ".nvmrc",
                            ".ruby-version"})


def format_of(path: str) -> str | None:
    """git | npmrc | ini | toml | yaml | json | vscode | vscode-tasks | package | pth |
    tool-versions | properties, or None
    for a file of no known role."""
    parts = path.split("/")
    name, parent = parts[-1], parts[-2] if len(parts) > 1 else ""
    if name in ("config", "config.worktree") and ".git" in parts[:-1]:
        return "git"          # .git/config, .git/worktrees/x/config.worktree, .git/modules/x/config
    if name in (".gitconfig", ".gitmodules") or (name == "config" and parent == "git"
                                                 and parts[-3:-2] == [".config"]):
        return "git"
    if name in (".npmrc", ".yarnrc"):
        return "npmrc"
    if name in ("pip.conf", "pip.ini") or name in _TOOL_INI:
        return "ini"
    if name in ("pyproject.toml", "Cargo.toml", "hatch.toml", "pdm.toml", ".pdm.toml"):
        return "toml"
    if parent == ".cargo" and name in ("config", "config.toml"):
        return "toml"
    if name == ".yarnrc.yml" or name in _TOOL_YAML:
        return "yaml"
    if name in _TOOL_JSON:
        return "json"
    if name == "settings.json" and parent == ".vscode":
        return "vscode"
    if name == "tasks.json" and parent == ".vscode":
        return "vscode-tasks"
    if name.endswith(".pth") and parent in ("site-packages", "dist-packages"):
        return "pth"
    if name == "package.json":
        return "package"
    if name in _VERSION_FILES:
        return "tool-versions"
    if name == "gradle.properties":
        return "properties"
    return None


def git_included(git_dir: str | None, home: str | None, workspace: str | None) -> set[str]:
    """The files git's configuration pulls in by include.path or
    includeIf.*.path, at any depth, from the repository's .git/config and the
    user's ~/.gitconfig and ~/.config/git/config: each is git configuration,
    whatever its name or place. Conditions are not weighed (any file some
    condition includes counts). Host paths, existing or not."""
    roots = [os.path.join(git_dir, "config")] if git_dir else []
    if home and home != "/":
        roots += [os.path.join(home, ".gitconfig"), os.path.join(home, ".config", "git", "config")]
    seen: set[str] = set()
    todo = list(roots)
    while todo and len(seen) < MAX_INCLUDED:
        path = todo.pop()
        try:
            data = read_quiet(path, MAX_CONFIG_BYTES + 1)
        except OSError:
            continue
        if b"include" not in data.lower():
            continue        # most configs include nothing: no git process for them
        for key, value in _pairs("git", data, workspace) or ():
            if not value or not (key == "include.path" or
                                 key.startswith("includeif.") and key.endswith(".path")):
                continue
            if value.startswith("~/") and home:
                value = home.rstrip("/") + value[1:]
            found = os.path.normpath(os.path.join(os.path.dirname(path), value))
            if found not in seen and found not in roots:
                seen.add(found)
                todo.append(found)
    return seen


def changed_keys(fmt: str, old: bytes | None, new: bytes, workspace: str | None) -> list[str] | None:
    """`key=value` for each pair in new that old did not have, and for git
    `-key=value` for each key old had and new has not; None when new cannot
    be parsed (the policy then judges the file by its role alone)."""
    before = _pairs(fmt, old, workspace) if old else set()
    after = _pairs(fmt, new, workspace)
    if after is None:
        return None
    added = sorted(after - (before or set()))
    if fmt == "git":
        # a key taken out is a change too (commit.gpgsign, a hooksPath the
        # user's employer set): "-key=old value", where no git key begins with "-"
        kept = {k for k, _ in after}
        added += sorted(("-" + k, v) for k, v in (before or set()) if k not in kept)
    out = [f"{k}={v[:VALUE_CHARS]}" for k, v in added[:MAX_KEYS]]
    if len(added) > MAX_KEYS:
        out.append(f"...={len(added) - MAX_KEYS} more")
    return out


def _pairs(fmt: str, data: bytes, workspace: str | None) -> set[tuple[str, str]] | None:
    if len(data) > MAX_CONFIG_BYTES:
        return None
    try:
        if fmt == "git":
            return _git(data, workspace)
        return {"npmrc": _npmrc, "ini": _ini, "toml": _toml, "yaml": _yaml,
                "vscode": _json, "package": _json, "json": _json, "vscode-tasks": _vscode_tasks,
                "pth": _pth, "tool-versions": _tool_versions, "properties": _properties}[fmt](data)
    except (ValueError, UnicodeDecodeError, OSError, subprocess.SubprocessError):
        return None


def _git(data: bytes, workspace: str | None) -> set[tuple[str, str]]:
    # --no-includes: the keys of this file, not of what it pulls in (include.path is a key).
    # git by absolute path from a PATH without the workspace (an activated
    # .venv/bin there may hold a `git` an earlier run committed).
    avoid = (workspace,) if workspace else ()
    path = safe_path(os.environ.get("PATH"), avoid=avoid)
    git = find_program("git", path, avoid=avoid)
    if git is None:
        raise OSError(f"git not found in {path}")
    p = subprocess.run([git, "config", "--file", "-", "--list", "-z", "--no-includes"],
                       input=data, capture_output=True, timeout=GIT_TIMEOUT_S, cwd="/",
                       env={"PATH": path, "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
                            "LC_ALL": "C"})
    if p.returncode != 0:
        raise ValueError(p.stderr.decode(errors="replace")[:200])
    out = set()
    for item in p.stdout.split(b"\0"):
        if item:
            k, _, v = item.decode().partition("\n")
            out.add((k.lower(), v))
    return out


def _npmrc(data: bytes) -> set[tuple[str, str]]:
    out = set()
    for line in data.decode().splitlines():
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        k, sep, v = s.partition("=")
        if not sep:
            k, _, v = s.partition(" ")        # .yarnrc v1: `key value`
        out.add((k.strip().lower(), v.strip().strip("\"'")))
    return out


_SECTION = re.compile(r"^\[([^\]]+)\]$")


def _ini(data: bytes) -> set[tuple[str, str]]:
    """An indented line continues the value above it (configparser's
    multi-line values: `plugins =` then one name a line)."""
    pairs: dict[str, list[str]] = {}
    section, key = "", None
    for line in data.decode().splitlines():
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if line[0] in " \t" and key is not None:
            pairs[key].append(s)
            continue
        m = _SECTION.match(s)
        if m:
            section, key = m.group(1).strip().lower(), None
            continue
        k, sep, v = s.partition("=") if "=" in s else s.partition(":")
        if not sep:
            raise ValueError(f"not a key: {s[:40]!r}")
        key = f"{section}.{k.strip().lower()}"
        pairs[key] = [v.strip()]
    return {(k, " ".join(x for x in v if x)) for k, v in pairs.items()}


def _json(data: bytes) -> set[tuple[str, str]]:
    # Strict JSON: a settings file with comments (JSONC) does not parse and is
    # judged by its role alone.
    return _flat(json.loads(data.decode()))


def _toml(data: bytes) -> set[tuple[str, str]]:
    return _flat(tomllib.loads(data.decode()))


def _flat(doc) -> set[tuple[str, str]]:
    """Nested tables as dotted keys, lowercased; an empty table is a key of
    its own (postcss' `"plugins": {"./p.js": {}}` names the plugin by its key)."""
    out = set()
    stack = [("", doc)]
    while stack:
        prefix, x = stack.pop()
        if isinstance(x, dict) and x:
            stack += [(f"{prefix}.{k}" if prefix else k, v) for k, v in x.items()]
        elif isinstance(x, dict):
            if prefix:
                out.add((prefix.lower(), "{}"))
        else:
            out.add((prefix.lower(), str(x)))
    return out


def _pth(data: bytes) -> set[tuple[str, str]]:
    """A .pth file as site.py reads it at every start: a line beginning with
    `import` (and a space or tab) is executed, a comment or blank line is
    skipped, any other names a directory for sys.path."""
    out = set()
    for line in data.decode().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        out.add(("import" if line.startswith(("import ", "import\t")) else "path", line.rstrip()))
    return out


def _vscode_tasks(data: bytes) -> set[tuple[str, str]]:
    """A task runs when someone runs it, unless its runOptions.runOn says
    folderOpen (VS Code then runs it when the folder opens): each task's
    label, its command under its label, and its runOn where it has one."""
    doc = json.loads(data.decode())
    tasks = doc.get("tasks", []) if isinstance(doc, dict) else None
    if not isinstance(tasks, list):
        raise ValueError("tasks is not a list")
    out = {(k.lower(), str(v)) for k, v in doc.items() if k != "tasks"}
    for t in tasks:
        if not isinstance(t, dict):
            raise ValueError("a task is not an object")
        label = str(t.get("label", ""))
        out.add(("tasks.label", label))
        out |= {(f"tasks.command.{label.lower()}", v) for k, v in _flat(t)
                if k in ("command", "args") or k.endswith((".command", ".args"))}
        # wherever it is (an OS block's override too)
        out |= {("tasks.runoptions.runon", v) for k, v in _flat(t) if k.endswith("runon")}
    return out


def _tool_versions(data: bytes) -> set[tuple[str, str]]:
    """asdf's and mise's `tool version...` lines: the tool, its versions."""
    out = set()
    for line in data.decode().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            out.add((words[0].lower(), " ".join(words[1:])))
    return out


def _properties(data: bytes) -> set[tuple[str, str]]:
    """Java's `key=value` (or `key: value`) lines, as gradle.properties holds."""
    out = set()
    for line in data.decode().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            k, _, v = line.partition("=" if "=" in line else ":")
            out.add((k.strip().lower(), v.strip()))
    return out


def _yaml(data: bytes) -> set[tuple[str, str]]:
    """Top-level `key: value` lines (.yarnrc.yml); nested entries count under
    their top-level key."""
    out, top = set(), ""
    for line in data.decode().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        k, _, v = line.partition(":")
        if not line[0].isspace():
            top = k.strip()
            out.add((top.lower(), v.strip().strip("\"'")))
        else:
            out.add((top.lower(), line.strip()))
    return out


def git_values(path: str, key: str, workspace: str | None) -> list[str]:
    """The values of key (lowercase, dotted) in the git config file at path;
    none when it is missing, too big or does not parse."""
    try:
        data = read_quiet(path, MAX_CONFIG_BYTES + 1)
    except OSError:
        return []
    pairs = _pairs("git", data, workspace) or set()
    return sorted(v for k, v in pairs if k == key)
