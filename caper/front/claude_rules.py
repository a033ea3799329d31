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
# `rm` also holds for `sudo rm`, `env X=1 rm`, `nohup rm`. Their options may
# take arguments (`timeout -s KILL 5 rm`, `exec -a name rm`): every word
# after a wrapper is taken as where the command may start.
WRAPPERS = {"sudo", "doas", "env", "command", "builtin", "exec", "nohup", "nice", "time",
            "timeout", "xargs", "setsid", "stdbuf", "ionice", "chrt", "taskset", "flock",
            "unbuffer", "watch", "strace", "ltrace", "chroot", "runuser", "sg", "busybox"}
# Reserved words a simple command may follow (`{ rm x; }`, `then rm x`, `! rm x`).
# (`time` is a wrapper: `time -p rm x`.)
RESERVED = {"{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until",
            "for", "case", "esac", "in", "select", "coproc", "[[", "]]"}
# Shells whose `-c STRING` is a command line of its own; `eval` joins its words into one.
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "su", "fish"}
# find's words that run the words after them, up to `;` or `+`.
EXEC_OPTIONS = {"-exec", "-execdir", "-ok", "-okdir"}
MAX_DEPTH = 8   # nested `sh -c` and eval; deeper is uncertain, and then every word may start one
# Where a command may start after a wrapper, or after options: the first
# this many words (each start costs a join of the rest; no real command has
# more options than this before its command word).
MAX_STARTS = 64
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


def simple_commands(command: str, depth: int = 0) -> list[str]:
    """The command, and each simple command in it (split at shell operators,
    inside $(...) and backquotes too, inside `sh -c STRING` and `eval`), with
    reserved words, leading assignments and wrappers taken off, the command
    word also by its basename, as space-joined words. Where the text cannot
    be parsed as the shell would, more forms rather than fewer: a rule
    errs toward matching."""
    pieces = [command] + [a or b for a, b in re.findall(r"\$\(([^()]*)\)|`([^`]*)`", command)]
    out = []
    for piece in pieces:
        lex = shlex.shlex(piece.replace("\n", " ; "), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        try:
            tokens = list(lex)
        except ValueError:             # unbalanced quotes: every word may start a command
            words = piece.split()
            out += [" ".join(words[i:]) for i in range(min(len(words), MAX_STARTS))]
            continue
        words: list[str] = []
        for tok in tokens + [";"]:
            if tok and set(tok) <= OPERATORS:
                out += _forms(words, depth)
                words = []
            else:
                words.append(tok)
    return list(dict.fromkeys([command.strip()] + [c for c in out if c]))


def _forms(words: list[str], depth: int) -> list[str]:
    """Every form a simple command's words may be run as."""
    forms = [" ".join(words)]
    while words and words[0] in RESERVED | {"function"}:
        words = words[2:] if words[0] == "function" else words[1:]   # function NAME
    for i, w in enumerate(words):
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w, re.S):
            continue                                    # an assignment before the command
        forms += _command_forms(words[i:], depth)
        if os.path.basename(w) in WRAPPERS:             # any later word may be the command
            for j in range(i + 1, min(len(words), i + 1 + MAX_STARTS)):
                forms += _command_forms(words[j:], depth)
        break
    return forms


def _command_forms(words: list[str], depth: int) -> list[str]:
    """The command as written and with its command word's basename
    (`/bin/rm`), also without the leading options (and each option's possible
    argument) between the command word and the rest (`git -C . push`), and
    what it runs: `sh -c STRING`, `eval WORDS`, find's `-exec ...`."""
    if not words:
        return []
    name = os.path.basename(words[0])
    rest = words[1:]
    forms = [" ".join(words), " ".join([name] + rest)]
    i = 0
    while i < min(len(rest), MAX_STARTS) and rest[i].startswith("-"):
        i += 1
        forms.append(" ".join([name] + rest[i:]))       # the option took no argument
        if i < len(rest) and not rest[i].startswith("-"):
            i += 1
            forms.append(" ".join([name] + rest[i:]))   # it took the next word
    nested: list[str] = []
    if name == "eval":
        nested.append(" ".join(rest))
    if name in SHELLS:
        nested += [rest[k + 1] for k, w in enumerate(rest[:-1])
                   if re.fullmatch(r"-[A-Za-z]*c[A-Za-z]*", w)][:1]
    # The first -exec's words (a later one's are among them: the recursion finds it).
    k = next((k for k, w in enumerate(rest) if w in EXEC_OPTIONS), None)
    if k is not None:
        nested.append(" ".join(rest[k + 1:]))
    for text in nested:
        if depth >= MAX_DEPTH:          # uncertain: every word may start a command
            ws = text.split()
            forms += [" ".join(ws[j:]) for j in range(min(len(ws), MAX_STARTS))]
        else:
            forms += simple_commands(text, depth + 1)
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
