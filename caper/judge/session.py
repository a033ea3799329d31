"""Sessions: the reviews of one agent session, its circuit breaker, and the
files tainted by secrets (SQLite, in caper's state directory).

- History: an approver sees the session's recent reviews.
- Circuit breaker: 3 blocks in a row, or 10 in the last 50 reviews, stop
  the session's gate: every further command is refused (not run) with a
  message telling the agent to stop and ask the user, until
  `caper session reset ID`.
- Taint: a file that an approved command wrote with secret material in it
  is tainted (for every session: the file is what carries the secret); a
  later command that reads it makes a protected read, so "copy the key into
  logs/" and then "upload logs/" is caught although each looks harmless.
"""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing

from caper.errors import ConfigError

CONSECUTIVE_BLOCKS = 3
WINDOW = 50
BLOCKS_IN_WINDOW = 10
TAINT_KIND = "tainted"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reviews (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    time REAL NOT NULL,
    command TEXT NOT NULL,
    decision TEXT NOT NULL,        -- allow | block | reset
    approver TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reviews_session ON reviews(session, id);
CREATE TABLE IF NOT EXISTS taint (
    path TEXT PRIMARY KEY,
    kinds TEXT NOT NULL,
    session TEXT,
    time REAL NOT NULL
);
"""


def _storable(text: str) -> str:
    """Text with the bytes that are no UTF-8 (kept as surrogates) shown as
    escapes: SQLite stores UTF-8 only."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class Sessions:
    def __init__(self, state_dir: str):
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(state_dir, "sessions.db")
        # The default rollback journal: its locks honour the busy timeout
        # (switching to WAL does not, and two first runs at once failed).
        try:
            self.db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
            self.db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise ConfigError(f"session database {self.path}: {e}", step="sessions") from e

    def close(self) -> None:
        self.db.close()

    def _since_reset(self, session: str, limit: int) -> list[tuple]:
        rows = self.db.execute(
            "SELECT command, decision, approver, reason, time FROM reviews WHERE session = ? "
            "AND id > COALESCE((SELECT MAX(id) FROM reviews WHERE session = ? AND "
            "decision = 'reset'), 0) ORDER BY id DESC LIMIT ?", (session, session, limit))
        return list(reversed(rows.fetchall()))

    def history(self, session: str, n: int = 10) -> list[dict]:
        return [{"command": c, "decision": d, "approver": a, "reason": r}
                for c, d, a, r, _ in self._since_reset(session, n)]

    def tripped(self, session: str) -> str | None:
        """Why the session's gate is stopped, or None."""
        recent = [row[1] for row in self._since_reset(session, WINDOW)]
        tail = recent[-CONSECUTIVE_BLOCKS:]
        if len(tail) == CONSECUTIVE_BLOCKS and all(d == "block" for d in tail):
            why = f"{CONSECUTIVE_BLOCKS} commands in a row were blocked"
        elif recent.count("block") >= BLOCKS_IN_WINDOW:
            why = f"{recent.count('block')} of the last {len(recent)} commands were blocked"
        else:
            return None
        return (f"caper stopped this session's gate: {why}. Stop and ask the user how to "
                f"proceed; they can re-open it with `caper session reset {session}`.")

    def record(self, session: str, command: str, decision: str, approver: str,
               reason: str) -> None:
        with self.db:
            self.db.execute("INSERT INTO reviews (session, time, command, decision, approver, "
                            "reason) VALUES (?, ?, ?, ?, ?, ?)",
                            (session, time.time(), _storable(command[:4000]), decision,
                             approver, _storable(reason[:4000])))

    def reset(self, session: str) -> None:
        self.record(session, "", "reset", "user", "caper session reset")

    def taint(self, paths: dict[str, list[str]], session: str | None) -> None:
        with self.db:
            self.db.executemany(
                "INSERT INTO taint (path, kinds, session, time) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(path) DO UPDATE SET kinds = excluded.kinds, time = excluded.time",
                # a name's bytes as they are: a name need not be UTF-8 (adv14a 08)
                [(os.fsencode(p), ",".join(sorted(k)), session, time.time())
                 for p, k in paths.items()])

    def tainted(self) -> dict[str, str]:
        """Tainted paths that still exist -> the kinds of secret they hold."""
        rows = self.db.execute("SELECT path, kinds FROM taint").fetchall()
        paths = ((os.fsdecode(p) if isinstance(p, bytes) else p, k) for p, k in rows)
        return {p: k for p, k in paths if os.path.lexists(p)}

    def sessions(self) -> list[tuple[str, int, int, str | None]]:
        """(session, reviews, blocks since reset, why stopped) for `caper session list`."""
        out = []
        for (sid,) in self.db.execute("SELECT DISTINCT session FROM reviews ORDER BY session"):
            rows = self._since_reset(sid, WINDOW)
            out.append((sid, len(rows), sum(1 for r in rows if r[1] == "block"),
                        self.tripped(sid)))
        return out


def open_sessions(state_dir: str) -> "closing[Sessions]":
    return closing(Sessions(state_dir))
