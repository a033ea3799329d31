"""How run-derived text is shown to a human: one function escapes what a
terminal, a permission prompt or an MCP client would act on instead of
showing.

A file name, an output excerpt or a reason from a run may hold terminal
control sequences (ESC [2J clears the screen, OSC 52 writes the clipboard,
ESC [8m hides what follows), newlines that start a line of their own in a
prompt, or bidi overrides that reorder what is read. `escape` turns every C0
and C1 control, DEL, the bidi and zero-width format characters, the line and
paragraph separators and lone surrogates (undecodable bytes) into visible
`\\xNN` / `\\uNNNN` text; everything else (non-ASCII letters included) is
kept. `quote` also escapes backslash and the double quote, so a quoted
string cannot end early.

Standard library only, no unicodedata: the hooks import it.
"""
from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]")


def _code(m: re.Match) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:              # a byte that did not decode (surrogateescape)
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape(s: str, keep_lines: bool = False) -> str:
    """s with every control and invisible format character made visible.
    keep_lines: multi-line text (a card, a command's output) keeps its line
    breaks and tabs; every other control is still escaped."""
    if keep_lines:
        return "\n".join("\t".join(_UNSAFE.sub(_code, part) for part in line.split("\t"))
                         for line in s.split("\n"))
    return _UNSAFE.sub(_code, s)


def quote(s: str, limit: int | None = None) -> str:
    """s as one double-quoted, escaped string (cut to limit characters first)."""
    if limit is not None and len(s) > limit:
        s = s[:limit] + "..."
    return '"' + escape(s.replace("\\", "\\\\").replace('"', '\\"')) + '"'
