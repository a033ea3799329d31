"""Credential locations, and secret values kept out of the effect report.

Two sources of secrets: the values found in credential files the run read
(a `.env`, `~/.aws/credentials` ...), and common token shapes (cloud keys,
private-key blocks, bearer tokens, URLs with a password). Every string the
report shows passes through `Redactor.text`, which replaces them with their
kind (`<redacted:aws-secret-key>`) and remembers what it found, because
*that a secret was there* is evidence the approver needs.
"""
from __future__ import annotations

import functools
import json
import os
import pwd
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Mapping, Sequence

from caper.fs import mountinfo

# Shorter values are not treated as secrets: redacting every "true" or
# "8080" found in a .env would blank the report without protecting anything.
MIN_SECRET_LEN = 6
MAX_SECRET_FILE = 256 * 1024  # larger credential files are not parsed for values
# A value cut by the held output's head/tail boundary leaves a fragment: a
# prefix (or suffix) of a known value at least this long is redacted too.
MIN_FRAGMENT = 4


@dataclass(frozen=True, slots=True)
class ProtectedPattern:
    path: str   # glob: ~ = home, ** = any directories; no '/' = that name anywhere,
                # relative with a '/' = below the workspace
    kind: str


@functools.cache
def default_patterns() -> tuple[ProtectedPattern, ...]:
    data = tomllib.loads(resources.files("caper").joinpath("data/protected.toml").read_text())
    return tuple(ProtectedPattern(p["path"], p["kind"]) for p in data["protected"])


def glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):    # a quoted character: itself
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


HOMES_RX = r"/root|/home/[^/]+"   # homes by their usual place, in passwd or not (LDAP, NFS)


def account_homes() -> tuple[str, ...]:
    """Every account's home directory passwd lists, read again for each run
    (a gate lives across runs; `useradd` may come between): a command run as
    root, or by a user another account let in, reads their keys as easily as
    its own. Those under HOMES_RX are matched there anyway."""
    try:
        homes = {os.path.normpath(e.pw_dir) for e in pwd.getpwall() if e.pw_dir}
    except OSError:     # no passwd database to enumerate: HOMES_RX and the run's own
        homes = set()
    return tuple(sorted(h for h in homes if h != "/" and not re.fullmatch(HOMES_RX, h)))


def _mount_forms(path: str, entries) -> list[str]:
    """path's real path and the other paths the mount table shows it at (a
    bind mount of /home at /srv/home, a btrfs pool's top level)."""
    real = os.path.realpath(path)
    try:
        return [real] + (mountinfo.aliases(real, entries) if entries and os.path.isdir(real)
                         else [])
    except (OSError, ValueError):   # gone meanwhile, or not in the table: as resolved
        return [real]


def _linked_forms(homes: "Sequence[str]", rel: str) -> list[str]:
    """rel (a pattern below a home) where a directory on its literal way, or
    the file it names, is a symlink: the target's real path with the rest of
    the pattern."""
    parts = rel.split("/")
    return ["/".join([real, *parts[i:]]) for real, i in _linked_forms_at(homes, rel)]


def _linked_forms_at(homes: "Sequence[str]", rel: str) -> list[tuple[str, int]]:
    """_linked_forms' (the link's real path, how many parts of rel it stands for)."""
    parts = rel.split("/")
    out = []
    for home in homes:
        for i in range(1, len(parts) + 1):      # the file itself too (stow's ~/.kube/config)
            if any(c in parts[i - 1] for c in "*?["):
                break
            head = os.path.join(home, *parts[:i])
            if os.path.islink(head):
                real = os.path.realpath(head)
                if real != head:
                    out.append((real, i))
                break
    return out


def glob_quote(literal: str) -> str:
    """A path as the glob of exactly it (the tracer's and glob_regex's)."""
    return re.sub(r"([\\*?])", r"\\\1", literal)


def _place_glob(place_rx: str) -> str:
    """A place pattern of home_forms (an escaped path, then "/[^/]+" for a
    place of homes) as the tracer's glob."""
    wild = place_rx.endswith("/[^/]+")
    literal = re.sub(r"\\(.)", r"\1", place_rx[:-len("/[^/]+")] if wild else place_rx)
    return glob_quote(literal) + ("/*" if wild else "")


def mount_translations(entries) -> tuple[tuple[str, str], ...]:
    """(alias point, path it shows) for every mount that shows a directory
    of a filesystem also mounted whole (or higher) elsewhere: `~/.aws` bound
    at /x shows /home/u/.aws there, a container's `-v /:/host` shows /etc at
    /host/etc. The longest alias first."""
    by_dev: dict[str, list] = {}
    for m in entries or ():
        if m.dev and m.fstype not in mountinfo.PSEUDO_FS:
            by_dev.setdefault(m.dev, []).append(m)
    out = set()
    for mounts in by_dev.values():
        canon = min(mounts, key=lambda m: (len(m.root), len(m.point)))
        for m in mounts:
            if m is canon or not (m.root + "/").startswith(canon.root.rstrip("/") + "/"):
                continue
            shows = os.path.normpath(os.path.join(canon.point, m.root[len(canon.root):].lstrip("/")))
            if shows != m.point:
                out.add((m.point, shows))
    return tuple(sorted(out, key=lambda x: -len(x[0])))


def home_forms(home: str | None, homes: "Sequence[str]", entries=None
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(homes, place patterns): the run's home and every account's, each as
    written, resolved and at each of its mount aliases; HOMES_RX's places
    (/root, /home/*) where they resolve or are mounted elsewhere."""
    forms = {f.rstrip("/") for h in ([home] if home else []) + list(homes)
             for f in (h, *_mount_forms(h, entries))}
    places = {re.escape(f.rstrip("/")) + rx for place, rx in (("/root", ""), ("/home", "/[^/]+"))
              for f in _mount_forms(place, entries) if f != place}
    return tuple(sorted(forms, key=len, reverse=True)), tuple(sorted(places))


class Protected:
    """Which paths are credential locations, and of what kind. A `~/`
    pattern holds in the run's home and in every account's (`homes`, by
    default account_homes(), and HOMES_RX), in each of their forms
    (home_forms; `forms` gives them ready, mount aliases included)."""

    def __init__(self, patterns: "Sequence[ProtectedPattern]", home: str | None,
                 workspace: str | None = None, homes: "Sequence[str] | None" = None,
                 forms: "tuple[tuple[str, ...], tuple[str, ...]] | None" = None,
                 translations: "Sequence[tuple[str, str]]" = ()):
        self._translations = tuple(translations)     # mount_translations
        # Each home as written and as resolved: the tracer names a file by the
        # path the command used and by its real one, and a home may be a
        # symlink or below one (/home -> /data/home).
        if forms is None:
            forms = home_forms(home, account_homes() if homes is None else homes)
        homes, places = forms
        self._homes = homes
        home_rx = "(?:" + "|".join([*map(re.escape, homes), HOMES_RX, *places]) + ")"
        # The same homes as the tracer's globs (caper.h: caper_credentials).
        home_globs = [*map(glob_quote, homes), "/root", "/home/*", *map(_place_glob, places)]
        stop: list[tuple[str, bool]] = []   # (glob, rooted): stop_globs
        below_home: list[str] = []
        rules: list[tuple[str, str]] = []
        rooted: list[tuple[str, str]] = []   # the ~ and absolute ones, for held_below
        # For held_below: each ~ or absolute pattern's path below its root
        # with globs made one name ("x"), and the directories on the way.
        self._tails: list[str] = []
        dirs: set[str] = set()
        for p in patterns:
            glob = p.path
            if glob.startswith("~/") or glob.startswith("/"):
                tail = "/".join("x" if any(c in part for c in "*?[") else part
                                for part in glob[2 if glob[0] == "~" else 1:].split("/"))
                self._tails.append(tail)
                parts = tail.split("/")[:-1]
                dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
            user_glob = glob              # quoted with '\\' as the tracer's globs are
            if glob.startswith("~/") and p.kind:
                below_home.append(user_glob[1:])
                stop += [("/".join([real.replace("\\", "\\\\"), *user_glob[2:].split("/")[i:]]),
                          True) for real, i in _linked_forms_at(homes, glob[2:])]
            elif glob.startswith("/") and p.kind:
                stop.append((user_glob, True))
            elif "/" in glob and p.kind and workspace:
                stop.append((glob_quote(workspace.rstrip("/")) + "/" + user_glob, False))
            elif "/" not in glob and p.kind:
                stop.append(("**/" + user_glob, False))
            if glob.startswith("~/"):
                rules.append((home_rx + glob_regex(glob[1:]), p.kind))
                rooted.append((home_rx + glob_regex(glob[1:]), p.kind))
                # A directory on its way that is a symlink (~/.aws -> /mnt/c/Users/me/.aws,
                # a dotfile manager's link): the pattern holds where it leads too.
                for real in _linked_forms(homes, glob[2:]):
                    rules.append((glob_regex(real), p.kind))
                    rooted.append((glob_regex(real), p.kind))
                continue
            if glob.startswith("/"):
                rooted.append((glob_regex(glob), p.kind))
            if "/" in glob and not glob.startswith("/"):
                if not workspace:
                    continue
                glob = workspace.rstrip("/") + "/" + glob
            rx = glob_regex(glob) if "/" in glob else "(?:.*/)?" + glob_regex(glob)
            rules.append((rx, p.kind))
        sub = "|".join(map(re.escape, sorted(dirs, key=len, reverse=True)))
        self._holders = re.compile(f"(?:{home_rx}|)(?:/(?:{sub}))?" if sub else
                                   f"(?:{home_rx})", re.S)
        self._kinds, self._rx = _alternation(rules)
        self._rooted_kinds, self._rooted_rx = _alternation(rooted)
        self.stop_globs: tuple[tuple[str, bool], ...] = tuple(dict.fromkeys(stop))
        self.stop_homes = tuple(dict.fromkeys(home_globs))       # and below each of them:
        self.stop_below_home = tuple(dict.fromkeys(below_home))  # (caper.h: homes, home_globs)
        self.translations = self._translations

    def reached(self, name: str, below: bool) -> tuple[str, str] | None:
        """(path, kind) of the credential a call reaching name reaches: name
        itself, or with below (a link or rename gives it a new name) one below
        it; None if none. The tracer's stop asks this (caper.h: check)."""
        k = self.kind(name)
        if k:
            return name, k
        return self.held_below(name) if below else None

    def held_below(self, directory: str) -> tuple[str, str] | None:
        """(path, kind) of a credential location below directory, if it holds
        one by the patterns (`~/.aws`, a home, `/etc/ssl`, a directory above
        a home): moving or linking it gives every credential there a new
        name. None for any other directory (a quick reject first: the run
        renames many)."""
        d = directory.rstrip("/") or "/"
        above = [h for h in (*self._homes, "/home/x", "/root")   # x: any name, HOMES_RX
                 if h.startswith(d.rstrip("/") + "/")]
        if not above and not self._holders.fullmatch(d):
            return None
        for root in above or [d]:
            held = self._held(root)
            if held:
                return held
        return None

    def _held(self, d: str) -> tuple[str, str] | None:
        for tail in self._tails:
            parts = tail.split("/")
            for i in range(len(parts)):
                candidate = f"{d.rstrip('/')}/{'/'.join(parts[i:])}"
                k = _first(self._rooted_rx, self._rooted_kinds, candidate)
                if k:
                    return candidate, k
        return None

    def kind(self, path: str) -> str | None:
        """The kind of credential at path; None where none is, or where the
        first matching rule's kind is empty (an exception to a later rule).
        A path below a mount that shows another directory is asked as that
        directory's too."""
        k = _first(self._rx, self._kinds, path)
        if k is None:
            for alias, shows in self._translations:
                if path == alias or path.startswith(alias.rstrip("/") + "/"):
                    k = _first(self._rx, self._kinds, shows + path[len(alias.rstrip("/")):])
                    break
        return k


def _alternation(rules: list[tuple[str, str]]) -> tuple[list[str], "re.Pattern | None"]:
    # One alternation, tried in the rules' order: the first rule that
    # matches names the kind (~2.5x faster than a regex per rule; every
    # file a run opens is asked).
    return [k for _, k in rules], re.compile(
        "(?:" + "|".join(f"(?P<r{i}>{rx})" for i, (rx, _) in enumerate(rules)) + r")\Z",
        re.S) if rules else None


def _first(rx: "re.Pattern | None", kinds: list[str], path: str) -> str | None:
    m = rx.match(path) if rx else None
    return kinds[int(m.lastgroup[1:])] or None if m else None


def protected_for(patterns: tuple[ProtectedPattern, ...], home: str | None,
                  workspace: str | None, entries=None) -> Protected:
    """Protected, compiled once per configuration, set of accounts and mount
    table (an agent runs many commands); entries: the mount table, if the
    caller has read it."""
    if entries is None:
        try:
            entries = mountinfo.read()
        except (OSError, ValueError):
            entries = None
    return _compiled(patterns, home, workspace, home_forms(home, account_homes(), entries),
                     mount_translations(entries))


@functools.lru_cache(maxsize=32)
def _compiled(patterns: tuple[ProtectedPattern, ...], home: str | None, workspace: str | None,
              forms: tuple[tuple[str, ...], tuple[str, ...]],
              translations: tuple[tuple[str, str], ...]) -> Protected:
    return Protected(patterns, home, workspace, forms=forms, translations=translations)


# Token shapes: (kind, pattern, anchors). The whole match is replaced. A
# shape's regex runs only where one of its anchors (lower-cased) occurs: a
# substring test is ~100x cheaper than a regex scan of 128 KiB of output.
SHAPES: list[tuple[str, re.Pattern, tuple[str, ...]]] = [
    (k, re.compile(p), anchors) for k, p, anchors in [
        ("private-key", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
                        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)", ("private key",)),
        ("aws-access-key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",
         ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa")),
        ("aws-secret-key", r"(?i:(?<=aws_secret_access_key))[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}",
         ("aws_secret_access_key",)),
        ("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})",
         ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
        ("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}", ("glpat-",)),
        ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}", ("xox",)),
        ("anthropic-key", r"\bsk-ant-[A-Za-z0-9_-]{20,}", ("sk-ant-",)),
        ("openai-key", r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}", ("sk-",)),
        ("google-api-key", r"\bAIza[0-9A-Za-z_-]{35}", ("aiza",)),
        ("stripe-key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}", ("k_live_", "k_test_")),
        ("npm-token", r"\bnpm_[A-Za-z0-9]{36}", ("npm_",)),
        ("pypi-token", r"\bpypi-[A-Za-z0-9_-]{50,}", ("pypi-",)),
        ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", ("eyj",)),
        ("bearer-token", r"(?i:(?<=bearer ))[A-Za-z0-9._~+/=-]{16,}", ("bearer ",)),
        # (not a masked one, `user:****@host`, nor documentation's
        # `username:password@host`, `[user:passwd@]proxy`, `${PASS}`: adv15b 14)
        ("url-password", r"(?<=://)[^/\s:@]{0,256}:(?![*x]+@|<[^>]*>@|\$\{[^}]*\}@|"
                         r"(?i:pass(?:word|wd)?|pwd|secret|changeme)@)[^/\s@]{1,256}(?=@)",
         ("://",)),
        ("password", r"(?i:(?<=password))[\"']?\s*[:=]\s*[\"']?[^\s\"',;]{6,}", ("password",)),
    ]]

_KEY = re.compile(r"""^\s*(?:export\s+)?["']?[\w.\-]+["']?\s*[:=]""")
# KEY=v, key: v, "key": "v", YAML's `:symbol: v` (gem's credentials); csh's `setenv KEY v`
_ASSIGN = re.compile(r"""^\s*(?:export\s+)?:?["']?([\w.\-]+)["']?\s*[:=]\s*(.*?)\s*,?\s*$"""
                     r"""|^\s*setenv\s+([\w.\-]+)\s+(.*?)\s*$""")
# Keys of credential files whose values are settings, not secrets
# (`region = eu-west-1` in ~/.aws/config): shown, never redacted.
SETTING_KEYS = frozenset({"region", "output", "format", "port", "timeout", "cli_pager",
                          "retry_mode", "max_attempts", "sso_region", "theme", "cli_timestamp_format",
                          "duration_seconds", "parameter_validation"})
# Values that only stand where a secret will go: `change-me`, `<token>`,
# `${TOKEN}`, `xxxx`, or a URL whose password is masked (`user:****@host`).
_PLACEHOLDER = re.compile(r"""(?ix)^(?:change[-_ ]?me|replace[-_ ]?me|your[-_ ].*|<[^>]*>|
    \$\{[^}]*\}|\$[A-Z_]+|x{4,}|\*{3,}|\.{3,}|todo|tbd|placeholder|dummy|example|redacted|
    none|null|true|false)$|^[a-z][a-z0-9+.-]*://[^:/@\s]+:(?:\*+|x+|<[^>]*>)@""")


def placeholder(value: str) -> bool:
    return bool(_PLACEHOLDER.search(value.strip()))


_KEYWORD = re.compile(r"(?i)\b(?:password|passwd|secret|token|login)\s+(\S+)")


def values_in(data: bytes) -> list[str]:
    """The secret values a credential file holds: right-hand sides of
    `KEY=value` / `key: value` / `"key": "value"` lines, netrc-style
    `password X`, private-key blocks, and lines that are a bare token."""
    if len(data) > MAX_SECRET_FILE or b"\0" in data[:8192]:
        return []
    text = data.decode("utf-8", "replace")
    found = [m.group(0) for m in SHAPES[0][1].finditer(text)]   # private-key blocks
    try:
        found += _json_strings(json.loads(text))
    except (ValueError, RecursionError):
        pass
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#;[" or s.startswith("-----"):
            continue
        m = _ASSIGN.match(s)
        if m:
            key, v = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            v = v.strip().strip("\"'")
            if v and v[0] not in "{[" and key.lower() not in SETTING_KEYS:
                found.append(v)
        found += _KEYWORD.findall(s)
        if not m and " " not in s:
            found.append(s)
    return [v for v in dict.fromkeys(found) if len(v) >= MIN_SECRET_LEN and not placeholder(v)]


def holds_no_secret(data: bytes) -> bool:
    """A credential file's content holds no secret: text parsed whole, no
    value (settings and placeholders only), and no token shape in the lines
    values_in passes over (comments, section headers)."""
    if len(data) > MAX_SECRET_FILE or b"\0" in data[:8192] or values_in(data):
        return False
    text = data.decode("utf-8", "replace")
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        # Parsed whole: a line values_in cannot read as a setting may hold one.
        for line in text.splitlines():
            s = line.strip()
            if s and s[0] not in "#;[" and s not in ("---", "...") and not _ASSIGN.match(s) \
                    and not _KEYWORD.search(s):
                return False
    found: set[str] = set()
    Redactor().text("\n".join(ln for ln in data.decode("utf-8", "replace").splitlines()
                              if ln.strip()[:1] in ("#", ";", "[")), found)
    return not found


def key_of(line: str) -> str:
    """The `KEY=` a line starts with (`registry=` says what a change to a
    credential file does), or "": a line that sets no key (a private key's
    body, a bare token) may be all secret."""
    m = _KEY.match(line)
    return m.group(0) if m else ""


def _json_strings(doc) -> list[str]:
    """Every string value in a JSON document (docker's config.json, gcloud's)."""
    out, stack = [], [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            stack += x.values()
        elif isinstance(x, list):
            stack += x
    return out


class Redactor:
    """Replaces secret values and token shapes in report text, and records
    which kinds it replaced."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}   # value -> kind
        self._order: list[str] = []

    def add_values(self, values: list[str], kind: str) -> None:
        for v in values:
            self._values.setdefault(v, kind)
        self._order = sorted(self._values, key=len, reverse=True)

    def text(self, s: str, found: set[str] | None = None) -> str:
        """s with every secret replaced by `<redacted:KIND>`; the kinds replaced
        are added to found."""
        for v in self._order:
            if v in s:
                kind = self._values[v]
                s = s.replace(v, f"<redacted:{kind}>")
                if found is not None:
                    found.add(kind)
        low = s.lower()
        for kind, rx, anchors in SHAPES:
            if not any(a in low for a in anchors):
                continue
            s, n = rx.subn(f"<redacted:{kind}>", s)
            if n:
                low = s.lower()
                if found is not None:
                    found.add(kind)
        return s

    def spans(self, s: str) -> list[tuple[int, int]]:
        """(start, end) of every known value and token shape in s, in order
        and merged: what `text` would replace, located in s itself."""
        found = []
        for v in self._order:
            i = s.find(v)
            while i >= 0:
                found.append((i, i + len(v)))
                i = s.find(v, i + 1)
        low = s.lower()
        for _, rx, anchors in SHAPES:
            if any(a in low for a in anchors):
                found += [m.span() for m in rx.finditer(s)]
        merged: list[tuple[int, int]] = []
        for a, b in sorted(found):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def cut_ends(self, s: str, start: bool, end: bool, found: set[str] | None = None) -> str:
        """Also redact a value cut by a boundary of held output: a prefix of a
        value at the end of s (end=True), a suffix at its start (start=True).
        Only for text cut at a boundary: elsewhere it would blank innocent
        names that happen to end like a secret begins."""
        for v in self._order:
            kind, hit = self._values[v], False
            for n in range(min(len(v) - 1, len(s)), MIN_FRAGMENT - 1, -1) if end else ():
                if s.endswith(v[:n]):
                    s, hit = s[:-n] + f"<redacted:{kind}>", True
                    break
            for n in range(min(len(v) - 1, len(s)), MIN_FRAGMENT - 1, -1) if start else ():
                if s.startswith(v[-n:]):
                    s, hit = f"<redacted:{kind}>" + s[n:], True
                    break
            if hit and found is not None:
                found.add(kind)
        return s


# A variable so named holds a credential (ANTHROPIC_API_KEY, GITHUB_TOKEN,
# AWS_SECRET_ACCESS_KEY, PGPASSWORD, NPM_CONFIG__AUTH): reading the
# environment is no syscall the tracer sees, so such a value would leave a
# blocked run in any encoding (`printenv X | rev`). Not passed unless allowed.
_SECRET_NAME = re.compile(r"(?i)(?:^|_)(?:TOKEN|SECRET|KEY|API_?KEY|CREDENTIALS?|AUTH|PAT)S?$"
                          r"|PASSWORD|PASSWD|SECRET|(?:^|_)(?:ACCESS|PRIVATE|API)_?KEY(?:_|$)"
                          r"|(?:^|_)(?:AUTH|SESSION|ACCESS|REFRESH|BEARER)_TOKEN(?:_|$)"
                          # MYSQL_PWD (never PWD, OLDPWD), DB_PASS, SENTRY_DSN,
                          # SLACK_WEBHOOK_URL, DOCKER_AUTH_CONFIG: round 4
                          r"|_PWD$|(?:^|_)PASS$|PASSPHRASE|(?:^|_)DSN$|WEBHOOK"
                          r"|(?:^|_)AUTH_CONFIG$|(?:^|_)COOKIES?$"
                          r"|(?:^|_)(?:BEARER|ROLE_ID|SECRET_ID|SEED|MNEMONIC|API|PW)$"
                          # round 5: connection strings, CI's base64 keys, git's env config
                          r"|CONNECTION_STRING|(?:^|_)KEY(?:_|$)|^GIT_CONFIG_VALUE_\d+$"
                          r"|^BUNDLE_[A-Z0-9_]+__[A-Z0-9_]+$"
                          # round 7: a CLI's unlocked session, tokens with the word fused
                          # or first, a login that is a token, a credentials file inline
                          r"|(?:^|_)SESSION$|^OP_SESSION_|^TF_TOKEN_|(?:ACCESS|AUTH)TOKEN"
                          r"|(?:^|_)LOGIN$|(?:^|_)CONFIG_JSON$|(?:^|_)CREDS$"
                          # round 8: KEY fused at the end (WRITEKEY, MASTERKEY), SAS tokens
                          r"|KEYS?$|(?:^|_)SAS(?:_|$)|SAS_?TOKEN")
# A value that is an HTTP credential by its scheme (`Basic dXNlcjpwYXNz`, `Bearer x`).
_AUTH_VALUE = re.compile(r"(?i)^\s*(?:basic|bearer|token|digest)\s+[A-Za-z0-9+/=._~-]{8,}"
                         # a connection string's key, a base64 PEM, a TOTP seed (round 5)
                         r"|(?:^|;)\s*(?:accountkey|sharedaccesskey|password|pwd)=[^;]{6,}"
                         r"|^LS0tLS1CRUdJTi|^otpauth://")


# git's configuration in the environment: GIT_CONFIG_COUNT pairs
# GIT_CONFIG_KEY_<n> (a name) and GIT_CONFIG_VALUE_<n>, one list: a count
# naming a pair that is missing is a fatal error of every git command (Gemini
# CLI sets eight, all its shell's gits would fail).
_GIT_ENV_PAIR = re.compile(r"^GIT_CONFIG_(?:KEY|VALUE)_\d+$")
# Keys whose value is a display or editing program or an identity, never a
# credential; any other key's value may be one (http.extraHeader, a
# credential.helper that echoes a token, a url.insteadOf with a password).
_GIT_PLAIN_KEYS = frozenset({"core.pager", "core.editor", "sequence.editor", "color.ui",
                             "user.name", "user.email", "init.defaultbranch"})


def git_env_pair(name: str) -> bool:
    """Is name one of git's environment configuration pairs' variables?"""
    return bool(_GIT_ENV_PAIR.match(name))


def git_env_config(env: Mapping[str, str], allow: "set[str] | frozenset[str]") -> dict[str, str]:
    """env's GIT_CONFIG_COUNT and pairs as the command gets them: the pairs
    that hold no credential (an empty value, which turns a setting off, or a
    plain key's value of no credential shape; or a pair whose value's name
    is in allow), renumbered, and their count. A count that is not a number
    goes as it is, with no pairs (git refuses it, as it would natively)."""
    if "GIT_CONFIG_COUNT" not in env:
        return {}
    try:
        count = int(env["GIT_CONFIG_COUNT"])
    except ValueError:
        return {"GIT_CONFIG_COUNT": env["GIT_CONFIG_COUNT"]}
    kept: list[tuple[str, str]] = []
    for n in range(max(0, min(count, 1000))):
        key, value = env.get(f"GIT_CONFIG_KEY_{n}"), env.get(f"GIT_CONFIG_VALUE_{n}")
        if key is None or value is None:
            continue
        if f"GIT_CONFIG_VALUE_{n}" in allow or value == "" or (
                key.lower() in _GIT_PLAIN_KEYS and not credential_var("GIT_PLAIN_VALUE", value)):
            kept.append((key, value))
    out = {"GIT_CONFIG_COUNT": str(len(kept))}
    for n, (key, value) in enumerate(kept):
        out[f"GIT_CONFIG_KEY_{n}"], out[f"GIT_CONFIG_VALUE_{n}"] = key, value
    return out


@functools.lru_cache(maxsize=4096)
def credential_var(name: str, value: str) -> bool:
    """Does this environment variable, by its name or the shape of its
    value (a token, a URL with a password), hold a credential? (Memoised:
    it depends on nothing else, and the gate sees the same environment at
    every run, ~40 variables at ~25 us each.)"""
    found: set[str] = set()
    Redactor().text(value, found)
    return bool(_SECRET_NAME.search(name) or found or _AUTH_VALUE.search(value))
