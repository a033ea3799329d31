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
Rules given on Claude Code's command line (`--disallowedTools`,
`--settings`) never reach a hook in its input, so the hook reads them from
the command line of the Claude Code process it runs under (its nearest
ancestor that is Claude Code, through /proc).

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


def bash_rules(project_dir: str, env=None, launch: "Launch | None" = None
               ) -> list[tuple[str, str, str]]:
    """(kind deny|ask, the rule's pattern, where it came from) of every Bash rule:
    the settings files', then those Claude Code was started with (launch).
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
        out += _settings_rules(raw, f"Claude Code's {scope} settings {path}", f"in {path}")
    if launch is not None:
        out += [("deny", pattern, f"{rule!r} in {launch.where}'s --disallowedTools")
                for rule, pattern in ((r, _bash_pattern(r)) for r in launch.disallowed)
                if pattern is not None]
        for text, where in launch.settings:
            out += _settings_rules(text.encode(), f"{launch.where}'s --settings {where}",
                                   f"in --settings {where}")
    return out


def _bash_pattern(rule: str) -> str | None:
    """The pattern of a Bash rule (`Bash` alone: every command), None for another tool's."""
    m = re.fullmatch(r"\s*Bash\s*(?:\((.*)\))?\s*", rule, re.S)
    return (m.group(1) or "*").strip() if m else None


def _settings_rules(raw: bytes, what: str, where: str) -> list[tuple[str, str, str]]:
    """The deny/ask Bash rules of one settings document."""
    if not raw.strip():
        return []
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{what} are not JSON ({e})") from e
    perms = doc.get("permissions") if isinstance(doc, dict) else None
    if not isinstance(perms, dict):
        return []
    out = []
    for kind in ("deny", "ask"):
        for rule in perms.get(kind) or []:
            pattern = _bash_pattern(rule) if isinstance(rule, str) else None
            if pattern is not None:
                out.append((kind, pattern, f"{rule!r} {where}"))
    return out


class Launch:
    """What Claude Code was started with that its hooks are not told: the
    `--disallowedTools` rules and the `--settings` documents (file or JSON
    text) of the Claude Code process a hook runs under."""

    def __init__(self, where: str, disallowed: list[str], settings: list[tuple[str, str]],
                 prints_text: bool = False):
        self.where, self.disallowed, self.settings = where, disallowed, settings
        # `claude -p` with text output prints only the model's answer: a hook's
        # systemMessage reaches the user nowhere (with JSON output, it is there).
        self.prints_text = prints_text
        self.pid: int | None = None

    @classmethod
    def of_ancestor(cls, pid: int | None = None) -> "Launch | None":
        """The nearest of pid and its ancestors (default: this process's
        ancestors) that is Claude Code, None when there is none (the hook was
        not started by Claude Code).
        Its command line or a --settings file that cannot be read raises
        ValueError: its rules are then unknown."""
        pid = os.getppid() if pid is None else pid
        for depth in range(MAX_ANCESTORS):
            if pid <= 1:
                return None
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
                with open(f"/proc/{pid}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError) as e:
                if depth == 0:      # the hook's own parent is its agent's, and readable
                    raise ValueError(f"cannot read process {pid}'s command line: {e}") from e
                return None         # past another user's process (hidepid): no Claude Code
            if _is_claude_code(argv):
                launch = cls.parse(argv, f"/proc/{pid}/cwd", f"Claude Code (pid {pid})")
                launch.pid = pid
                return launch
            pid = ppid
        return None

    @classmethod
    def parse(cls, argv: list[str], cwd: str, where: str) -> "Launch":
        """Read Claude Code's argv as its option parser does: `--opt V...` takes
        every word up to the next option, `--opt=V` one; a tool list splits at
        commas and spaces outside parentheses (`Bash(git *)` is one rule)."""
        disallowed: list[str] = []
        settings: list[tuple[str, str]] = []
        prints = "-p" in argv or "--print" in argv
        output_format = "text"
        i = 0
        while i < len(argv):
            name, eq, value = argv[i].partition("=")
            i += 1
            if name == "--output-format":
                output_format = value if eq else (argv[i] if i < len(argv) else "")
            if name not in DISALLOWED_OPTIONS and name != "--settings":
                continue
            values = [value] if eq else []
            while not eq and i < len(argv) and not argv[i].startswith("-"):
                values.append(argv[i])
                i += 1
                if name == "--settings":
                    break
            if name == "--settings":
                settings += [_settings_text(v, cwd) for v in values]
            else:
                for v in values:
                    disallowed += [t for t in re.findall(r"(?:[^,\s(]|\([^)]*\))+", v)]
        return cls(where, disallowed, settings, prints and output_format == "text")


DISALLOWED_OPTIONS = {"--disallowedTools", "--disallowed-tools"}
MAX_ANCESTORS = 16


def _is_claude_code(argv: list[str]) -> bool:
    """Claude Code's native binary (`claude`, npm's `claude.exe`) or its
    JavaScript entry run by node (`node .../@anthropic-ai/claude-code/cli.js`)."""
    return bool(argv) and any(os.path.basename(a) in CLAUDE_PROGRAMS or
                              "/@anthropic-ai/claude-code/" in a for a in argv[:2])


CLAUDE_PROGRAMS = {"claude", "claude.exe"}


def _settings_text(value: str, cwd: str) -> tuple[str, str]:
    """(the JSON text, where it came from) of one --settings value: the JSON
    itself when it is an object, else a file (relative to Claude Code's cwd)."""
    if value.lstrip().startswith("{"):
        return value, "(inline JSON)"
    path = value if os.path.isabs(value) else os.path.join(cwd, value)
    try:
        with open(path, "rb") as f:
            return f.read(MAX_SETTINGS + 1).decode(errors="replace"), value
    except OSError as e:
        raise ValueError(f"cannot read Claude Code's --settings {value}: {e}") from e


def simple_commands(command: str, depth: int = 0) -> list[str]:
    """The command, and each simple command in it (split at shell operators,
    inside $(...) and backquotes too, inside `sh -c STRING` and `eval`), with
    reserved words, leading assignments and wrappers taken off, the command
    word also by its basename, as space-joined words. Where the text cannot
    be parsed as the shell would, more forms rather than fewer: a rule
    errs toward matching."""
    out = []
    for words in _word_lists(command):
        if words is None:
            continue
        if isinstance(words, str):     # unbalanced quotes: every word may start a command
            split = words.split()
            out += [" ".join(split[i:]) for i in range(min(len(split), MAX_STARTS))]
        else:
            out += _forms(words, depth)
    return list(dict.fromkeys([command.strip()] + [c for c in out if c]))


def _word_lists(command: str) -> list:
    """The words of each simple command in command (split at shell operators,
    and inside $(...) and backquotes); a piece that does not parse (unbalanced
    quotes) as its text."""
    pieces = [command] + [a or b for a, b in re.findall(r"\$\(([^()]*)\)|`([^`]*)`", command)]
    out: list = []
    for piece in pieces:
        lex = shlex.shlex(piece.replace("\n", " ; "), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        try:
            tokens = list(lex)
        except ValueError:
            out.append(piece)
            continue
        words: list[str] = []
        for tok in tokens + [";"]:
            if tok and set(tok) <= OPERATORS:
                if words:
                    out.append(words)
                words = []
            else:
                words.append(tok)
    return out


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


# A command word the shell expands (`$x`, `$'\x72m'`, `` `echo rm` ``, `\rm`,
# `{rm,-rf,x}`): which program runs, the text does not say.
NOT_LITERAL = re.compile(r"[$`\\]|\{[^{}]*(?:,|\.\.)[^{}]*\}")


def hidden_program(command: str) -> str | None:
    """A simple command whose program its text does not name: a command word
    the shell expands (after a wrapper, any later word may be one), an alias
    definition (a later word may then be anything), a shell reading its
    commands from stdin (`echo rm -rf x | bash`), text that does not parse."""
    for words in _word_lists(command):
        if isinstance(words, str):
            return words
        i = 0
        while i < len(words) and (words[i] in RESERVED or
                                  re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i], re.S)):
            i += 1
        if i == len(words):
            continue
        name = os.path.basename(words[i])
        heads = words[i:] if name in WRAPPERS else [words[i]]
        if any(NOT_LITERAL.search(w) for w in heads) or name == "alias":
            return " ".join(words)
        if name in SHELLS and not any(not w.startswith("-") or re.fullmatch(r"-[A-Za-z]*c[A-Za-z]*", w)
                                      for w in words[i + 1:]):
            return " ".join(words)
    return None


def verdict(command: str, project_dir: str, env=None, launch: Launch | None = None
            ) -> tuple[str, str] | None:
    """("deny" | "ask", why) for the strictest rule that matches, else None.
    Where the text hides which program runs, every rule may match: the
    strictest one applies."""
    rules = bash_rules(project_dir, env, launch)
    if not rules:
        return None
    forms = simple_commands(command)
    for kind in ("deny", "ask"):
        for k, pattern, where in rules:
            if k == kind:
                hit = next((f for f in forms if matches(pattern, f)), None)
                if hit is not None:
                    return kind, f"your Claude Code permission rule {where} matches {hit!r}"
    hidden = hidden_program(command)
    if hidden is not None:
        kind, _, where = min(rules, key=lambda r: r[0] != "deny")
        return kind, (f"caper cannot tell which program {hidden!r} runs, so your Claude Code "
                      f"permission rule {where} may match it")
    return None
