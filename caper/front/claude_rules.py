"""Claude Code's own Bash permission rules, evaluated against the command the
model wrote.

caper's hook rewrites a call into `caper run ... -c <command>`, and Claude
Code then checks its rules against that rewritten text, which starts with
caper: a `permissions.deny: ["Bash(rm:*)"]` no longer matched and the `rm`
ran (through caper). So the hook reads the rules itself, from every settings
scope Claude Code reads (managed, user, project, local;
https://docs.anthropic.com/en/docs/claude-code/settings), and matches them
against the original command and each simple command inside it. A match
errs toward matching: deny and ask rules may only get stricter here.

Rule forms (https://docs.anthropic.com/en/docs/claude-code/iam): `Bash` or
`Bash(*)` every command; `Bash(npm run test:*)` a prefix, on a word boundary;
`Bash(git * main)` `*` as a wildcard; anything else the exact command.
Rules given on Claude Code's command line (--disallowedTools) are not seen
by a hook; those stay Claude Code's to apply.

Standard library only: this runs once per command.
"""
from __future__ import annotations

import json
import os
import re
import shlex

MANAGED_SETTINGS = "/etc/claude-code/managed-settings.json"
OPERATORS = set("&|;()<>\n")
# Words that run the rest of their arguments as the command: a rule about
# `rm` also holds for `sudo rm`, `env X=1 rm`, `nohup rm`.
WRAPPERS = {"sudo", "env", "command", "builtin", "exec", "nohup", "nice", "time", "timeout",
            "xargs"}
MAX_SETTINGS = 1 << 20


def settings_files(project_dir: str, env=None) -> list[tuple[str, str]]:
    """(scope, path) of every settings file Claude Code reads for project_dir."""
    env = os.environ if env is None else env
    user_dir = env.get("CLAUDE_CONFIG_DIR") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".claude")
    return [("managed", MANAGED_SETTINGS),
            ("user", os.path.join(user_dir, "settings.json")),
            ("project", os.path.join(project_dir, ".claude", "settings.json")),
            ("local", os.path.join(project_dir, ".claude", "settings.local.json"))]


def bash_rules(project_dir: str, env=None) -> list[tuple[str, str, str]]:
    """(kind deny|ask, the rule's pattern, where it came from) of every Bash rule.
    A settings file that exists but cannot be read raises ValueError: the
    hook then denies, as Claude Code's own rules are unknown."""
    out = []
    for scope, path in settings_files(project_dir, env):
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_SETTINGS + 1)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise ValueError(f"cannot read Claude Code's {scope} settings {path}: {e}") from e
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"Claude Code's {scope} settings {path} are not JSON ({e})") from e
        perms = doc.get("permissions") if isinstance(doc, dict) else None
        if not isinstance(perms, dict):
            continue
        for kind in ("deny", "ask"):
            for rule in perms.get(kind) or []:
                if not isinstance(rule, str):
                    continue
                m = re.fullmatch(r"\s*Bash\s*(?:\((.*)\))?\s*", rule, re.S)
                if m:
                    out.append((kind, (m.group(1) or "*").strip(), f"{rule!r} in {path}"))
    return out


def simple_commands(command: str) -> list[str]:
    """The command, and each simple command in it (split at shell operators,
    inside $(...) and backquotes too), with leading assignments and wrapper
    words taken off, as space-joined words."""
    pieces = [command] + [a or b for a, b in re.findall(r"\$\(([^()]*)\)|`([^`]*)`", command)]
    out = []
    for piece in pieces:
        lex = shlex.shlex(piece.replace("\n", " ; "), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        try:
            tokens = list(lex)
        except ValueError:             # unbalanced quotes: the raw text only
            tokens = piece.split()
        words: list[str] = []
        for tok in tokens + [";"]:
            if tok and set(tok) <= OPERATORS:
                out += _unwrap(words)
                words = []
            else:
                words.append(tok)
    return list(dict.fromkeys([command.strip()] + [c for c in out if c]))


def _unwrap(words: list[str]) -> list[str]:
    """The words as a command, and again without each leading assignment or
    wrapper (with the options and numbers that follow a wrapper)."""
    forms = [" ".join(words)]
    wrapped = False
    while words:
        w = words[0]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w, re.S) or \
                os.path.basename(w) in WRAPPERS:
            wrapped = True
        elif not (wrapped and (w.startswith("-") or re.fullmatch(r"[0-9.]+[smhd]?", w))):
            break
        words = words[1:]
        forms.append(" ".join(words))
    return forms


def matches(pattern: str, command: str) -> bool:
    if pattern in ("", "*"):
        return True
    if pattern.endswith(":*"):
        prefix = pattern[:-2].rstrip()
        return command == prefix or command.startswith(prefix + " ")
    if "*" in pattern:
        return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), command,
                            re.S) is not None
    return command == pattern


def verdict(command: str, project_dir: str, env=None) -> tuple[str, str] | None:
    """("deny" | "ask", why) for the strictest rule that matches, else None."""
    rules = bash_rules(project_dir, env)
    if not rules:
        return None
    forms = simple_commands(command)
    for kind in ("deny", "ask"):
        for k, pattern, where in rules:
            if k == kind:
                hit = next((f for f in forms if matches(pattern, f)), None)
                if hit is not None:
                    return kind, f"your Claude Code permission rule {where} matches {hit!r}"
    return None
