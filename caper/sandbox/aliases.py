"""caper.sandbox.aliases: the names a path had before the run's links and renames.

A credential linked or moved elsewhere, or a directory holding one (`mv ~/.aws
~/x`), is read by its new name. The report and the network proxy both ask,
of every name a run opens, what it was, so neither can be told apart by a
rename: the proxy decides during the run what may still leave, the report
afterwards what was read.
"""
from __future__ import annotations

import os
from typing import Callable

from caper.fs.syscalls import RENAME_EXCHANGE
from caper.sandbox.events import Event, Kind

MAX_ALIAS_HOPS = 64              # links/renames followed back from a name to a credential


class Aliases:
    """New name -> what the run linked or moved there, fed in event order."""

    def __init__(self) -> None:
        self._was: dict[str, str] = {}

    def take(self, e: Event) -> None:
        """After a successful link or rename e (e.path the source, e.path2 the
        new name). An exchange moves the destination's object to the source's
        name as well: each name is the other's alias."""
        if e.kind not in (Kind.LINK, Kind.RENAME) or not e.ok or not e.path or not e.path2:
            return
        was = self.original(e.real or e.path)
        if e.kind == Kind.RENAME and e.flags & RENAME_EXCHANGE:
            self._was[e.path] = self.original(e.path2)
        self._was[e.path2] = was

    @staticmethod
    def sources(e: Event) -> list[tuple[str | None, str]]:
        """The (real, named) paths whose objects link or rename e gives a new name."""
        exchange = e.kind == Kind.RENAME and e.flags & RENAME_EXCHANGE
        return [(e.real, e.path)] + ([(None, e.path2)] if exchange else [])

    def original(self, path: str) -> str:
        """path as it was named before the run's links and renames put it (or
        a directory above it) there."""
        return self.names(path)[-1]

    def names(self, path: str) -> list[str]:
        """path and each name it had before, back through the run's links and
        renames (an exchange makes two names each other's: a cycle, where
        every name counts)."""
        out = [path]
        for _ in range(MAX_ALIAS_HOPS if self._was else 0):
            up = path
            while up not in self._was and up not in ("", "/"):
                up = os.path.dirname(up)
            if up not in self._was:
                break
            path = self._was[up] + path[len(up):]
            if path in out:
                break
            out.append(path)
        return out

    def credential(self, kind: Callable[[str], str | None],
                   *names: str | None) -> tuple[str, str] | None:
        """(path, kind) of the first of names that is a credential location,
        by what the run's links and renames made it (the oldest name first:
        it says where the credential came from) or by itself; None if none is."""
        seen = set()
        for name in names:
            for p in reversed(self.names(name)) if name else ():
                k = None if p in seen else kind(p)
                if k:
                    return p, k
                seen.add(p)
        return None
