"""How run-derived text is shown to a human: one function escapes what a
terminal, a permission prompt or an MCP client would act on instead of
showing.

A file name, an output excerpt or a reason from a run may hold terminal
control sequences (ESC [2J clears the screen, OSC 52 writes the clipboard,
ESC [8m hides what follows), newlines that start a line of their own in a
prompt, bidi overrides that reorder what is read, or characters that show
nothing: Unicode tag characters spell hidden ASCII that language models read
("ASCII smuggling"), soft hyphens, variation selectors and fillers make two
names look alike. `escape` keeps only what is visible: a character passes
if Python calls it printable (letters, marks, numbers, punctuation, symbols
and the ASCII space: no control, format, surrogate, private-use, unassigned
or separator character) and it is not one of the printable ones that draw
nothing (`_BLANK`); every other becomes `\\xNN` / `\\uNNNN` / `\\UNNNNNNNN`
text (undecodable bytes, as surrogateescape decodes them, `\\xNN`). `quote`
also escapes backslash and the double quote, so a quoted string cannot end
early.

Standard library only, no unicodedata: the hooks import it.
"""
from __future__ import annotations

import re

_UNSAFE_ASCII = re.compile("[\x00-\x1f\x7f]")
# Printable by Python's rules, yet drawn as nothing (or as a blank): the
# combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian
# variation selectors, the braille blank, variation selectors.
_BLANK = frozenset([0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0,
                    *range(0x180B, 0x1810), *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)])


def _code(c: str) -> str:
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:              # a byte that did not decode (surrogateescape)
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _visible(s: str) -> str:
    if s.isascii():                        # the common case, without a loop in Python
        return _UNSAFE_ASCII.sub(lambda m: _code(m.group()), s)
    return "".join(c if c.isprintable() and ord(c) not in _BLANK else _code(c) for c in s)


def escape(s: str, keep_lines: bool = False) -> str:
    """s with every control and invisible character made visible.
    keep_lines: multi-line text (a card, a command's output) keeps its line
    breaks and tabs; every other control is still escaped."""
    if keep_lines:
        return "\n".join("\t".join(_visible(part) for part in line.split("\t"))
                         for line in s.split("\n"))
    return _visible(s)


def quote(s: str, limit: int | None = None) -> str:
    """s as one double-quoted, escaped string (cut to limit characters first)."""
    if limit is not None and len(s) > limit:
        s = s[:limit] + "..."
    return '"' + escape(s.replace("\\", "\\\\").replace('"', '\\"')) + '"'
