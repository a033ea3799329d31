"""What a changed file holds, before and after the run, for the effect report:
a bounded unified diff of small text files, sizes of binaries, the tables
and row counts of SQLite databases, and the secrets found in new content.

The run's version of a file lives in caper's scratch space (an overlay upper
layer, a btrfs snapshot), which the command wrote: it is opened one
component at a time without following symlinks. The host's version is the
user's own file. Either is opened only once an O_PATH look shows a regular
file: where the run left a file, the host may hold a FIFO or a device node.
"""
from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import sqlite3
import stat
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from caper.fs.mountinfo import below
from caper.report.secrets import MAX_SECRET_FILE, Redactor, holds_no_secret, key_of, values_in
from caper.report.stores import BY_CONTENT, secret_values
from caper.fs.syscalls import open_regular

MAX_DIFF_BYTES = 256 * 1024   # per side; larger text files get sizes and line counts only
MAX_COMPARED_BYTES = 1 << 30  # a rewrite of a larger file counts as one no diff shows
MAX_DIFF_LINES = 400          # kept from a diff before the report's budget trims it
MAX_SCAN_BYTES = 1 << 20      # read of a new file's content, for secrets
MAX_TABLES = 32
SQLITE_DEADLINE_S = 0.2       # per database, for counting rows
SQLITE_ROWS_DEADLINE_S = 0.3  # per database, for comparing rows by content
MAX_ROWS_COMPARED = 100_000   # per table
MAX_SQLITE_CELL = 1 << 20     # bytes of one value read (SQLITE_LIMIT_LENGTH)
SQLITE_MAGIC = b"SQLite format 3\0"
SQLITE_LOGS = ("-wal", "-journal")
MAX_SQLITE_COPY = 256 << 20   # a database with its log, copied to be read as its next opener will;
# a larger one's tables are not compared (the policy is unsure of its change)
# A database whose tables the report could not all compare (more than
# MAX_TABLES, a log too large to copy, a table the deadline cut short).
UNCOMPARED = "\0uncompared"
# The database's triggers and views, one row each (type, name, SQL), compared
# as a table is: code SQLite runs at later reads and writes (a trigger that
# empties a table at the next insert), shown under this name.
SCHEMA_CODE = "(triggers and views)"
_SCHEMA_KEY = "\0schema"      # its key among the tables (any text can name a table)
TABLES_NOT_COMPARED = "database-tables-not-compared"   # uncertainty flag
OVERWRITE_SHARE = 0.9         # of a file's old lines (or bytes, from OVERWRITE_MIN_BYTES)
OVERWRITE_MIN_BYTES = 1024    # gone: overwritten, not edited
OVERWRITE_MIN_LINES = 5
CUT_SHARE = 0.5               # of its old lines removed: cut (adv10b 09: 899 of 1000 passed)
# difflib is quadratic on lines that repeat often without being "popular"
# (crafted: 87,000 lines of 100 values, ~20 s a file). A diff is skipped
# when its first match search alone would compare more line pairs than
# this (~0.2 s), and given up at DIFF_DEADLINE_S; it then gets line counts.
MAX_DIFF_PAIRS = 2_000_000
DIFF_DEADLINE_S = 2.0
DIFF_TOO_COSTLY = "diff-too-costly-line-counts-only"   # uncertainty flag


@dataclass(frozen=True, slots=True)
class RunTree:
    """Where the run's version of a host path can be read: (host prefix, root
    holding the run's files for that prefix), the longest prefix first."""
    roots: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, pairs: list[tuple[str, str]]) -> "RunTree":
        return cls(tuple(sorted(pairs, key=lambda p: len(p[0]), reverse=True)))

    def locate(self, path: str) -> tuple[str, str] | None:
        """(root, path relative to it) of path's run version, or None."""
        for prefix, root in self.roots:
            if below(path, prefix):
                return root, os.path.relpath(path, prefix) if path != prefix else "."
        return None

    def credential_values(self, path: str, kind: str) -> list[str]:
        """Secret values of the credential file at path: those of its run
        version and of the host's (a run that overwrote or deleted it without
        reading it still makes caper read the host's to report the change),
        each opened without following any symlink (path comes from the
        command: what it names must not be looked up in caper's own view of
        the filesystem). A store known by its content (caper.report.stores)
        gives only its secrets, not every value of its settings."""
        where = self.locate(path)
        found: list[str] = []
        for root, rel in ([where] if where else []) + [("/", path.lstrip("/"))]:
            blob = read_blob(root, rel, MAX_SECRET_FILE + 1)
            if blob is not None:
                found += secret_values(kind, blob.data) if kind in BY_CONTENT \
                    else values_in(blob.data)
        return list(dict.fromkeys(found))

    def kind(self, path: str) -> str | None:
        """"file", "dir" or "other" for what the run's view holds at path
        (its layer first, then the host's), None for nothing or a whiteout;
        no symlink followed."""
        where = self.locate(path)
        for root, rel in ([where] if where else []) + [("/", path.lstrip("/"))]:
            try:
                st = os.lstat(os.path.join(root, rel))
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                return None                      # the overlay's whiteout: deleted
            return "dir" if stat.S_ISDIR(st.st_mode) else \
                "file" if stat.S_ISREG(st.st_mode) else "other"
        return None

    def settings_only(self, path: str) -> bool:
        """Every version of the credential file at path (the run's, the
        host's) is a text file caper read whole and found no secret value
        in: settings and placeholders only (`region = eu-west-1`,
        `change-me`). A version it could not read or parse is not."""
        where = self.locate(path)
        seen = False
        for root, rel in ([where] if where else []) + [("/", path.lstrip("/"))]:
            blob = read_blob(root, rel, MAX_SECRET_FILE + 1)
            if blob is None:
                if root == "/" and os.path.lexists(path):
                    return False         # there, but not a regular file caper can read
                continue
            if not blob.complete or not holds_no_secret(blob.data):
                return False
            seen = True
        return seen


@dataclass(slots=True)
class Blob:
    size: int
    data: bytes          # at most the limit asked for
    complete: bool
    allocated: int = 0   # bytes on disk (st_blocks): less than size for a sparse file


def _open_beneath(root: str, rel: str) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise OSError(f"'..' in {rel!r}")
        for part in parts[:-1]:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nfd
        if not parts:
            return os.dup(fd)
        return open_regular(parts[-1], fd)
    finally:
        os.close(fd)


def read_blob(root: str, rel: str, limit: int) -> Blob | None:
    """The first `limit` bytes of a regular file below root, never following
    a symlink on the way; None if it is not a readable regular file."""
    try:
        fd = _open_beneath(root, rel)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        chunks, got = [], 0
        while got < limit:
            b = os.read(fd, min(limit - got, 1 << 20))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        data = b"".join(chunks)
        return Blob(st.st_size, data, len(data) >= st.st_size, st.st_blocks * 512)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass(slots=True)
class TableRows:
    name: str
    before: int | None   # None: the table did not exist (or could not be counted)
    after: int | None
    lost: int | None = None      # rows of before deleted, or with values emptied or collapsed
    changed: int | None = None   # rows of before rewritten in place, no value lost
    compared: bool = True        # False: too large or too slow to read to the end


@dataclass(slots=True)
class _Rows:
    """A table's rows by content: each row's cells as digests, and per
    column how many cells hold a value (not NULL or empty) and how many
    distinct values there are."""
    columns: tuple[str, ...]
    rows: list[tuple[bytes, ...]] | None   # None: too many to keep; the counts are SQLite's
    filled: list[int]
    distinct: list[int]


@dataclass(slots=True)
class FileDetail:
    size_before: int | None = None
    size_after: int | None = None
    allocated_after: int | None = None   # bytes on disk of the run's version
    added: int | None = None       # lines, for text files
    removed: int | None = None
    diff: list[str] = field(default_factory=list)
    overwritten: bool = False      # emptied, or most of the old lines gone
    cut: bool = False              # half of the old lines or more gone
    uncompared: bool = False       # rewritten where no diff shows how: binary, or too large
    tables: list[TableRows] | None = None
    secrets: set[str] = field(default_factory=set)
    uncertain: list[str] = field(default_factory=list)   # what could not be inspected


def _same_bytes(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two regular files (root, path below it) hold the same bytes,
    compared whole, up to MAX_COMPARED_BYTES (past it: not known the same);
    never following a symlink."""
    try:
        fa, fb = _open_beneath(*a), None
        try:
            fb = _open_beneath(*b)
            seen = 0
            while seen <= MAX_COMPARED_BYTES:
                x, y = os.read(fa, 1 << 20), os.read(fb, 1 << 20)
                if x != y:
                    return False
                if not x:
                    return True
                seen += len(x)
            return False
        finally:
            os.close(fa)
            if fb is not None:
                os.close(fb)
    except OSError:
        return False


def _as_text(b: Blob | None) -> str | None:
    if b is None:
        return ""
    if b"\0" in b.data[:8192]:
        return None
    try:
        return b.data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _sqlite_tables(pieces: "list[tuple[str, str] | None]"
                   ) -> dict[str, tuple[int | None, _Rows | None]] | None:
    """Tables of a database file as the next program to open it will see
    them, each with its row count and its rows' digests (or, past
    MAX_ROWS_COMPARED, per column statistics; None where the deadline
    passed), or None if it is not one. The database is copied, with its
    write-ahead log or rollback journal, to a private directory and opened
    there: SQLite applies the log or rolls the journal back as the next
    opener's would (rows hidden in the log, or a planted journal that undoes
    them, count), nothing is made beside the original, and the original is
    read only through caper's own fds (open_quiet: its access time stays).
    pieces: (root, relative path) of the database and of each SQLITE_LOGS
    file, as the side compared has them (None: it has none)."""
    if pieces[0] is None:
        return None
    head = read_blob(*pieces[0], len(SQLITE_MAGIC))
    if head is None or head.data != SQLITE_MAGIC:
        return None
    try:
        fd = _open_beneath(*pieces[0])
    except OSError:
        return None
    with contextlib.ExitStack() as done:
        done.callback(os.close, fd)
        logs = {}
        for suffix, piece in zip(SQLITE_LOGS, pieces[1:]):
            try:
                logs[suffix] = _open_beneath(*piece) if piece else None
            except OSError:
                logs[suffix] = None
            if logs[suffix] is not None:
                done.callback(os.close, logs[suffix])
        logs = {k: v for k, v in logs.items() if v is not None and os.fstat(v).st_size}
        if "-journal" in logs and _names_a_super_journal(logs["-journal"]):
            # Played back, SQLite would open the file it names, by its absolute
            # name in caper's view, and unlink it: a run must not make caper
            # delete a host file. What the next opener sees is then unknown.
            return {UNCOMPARED: (None, None)}
        sizes = os.fstat(fd).st_size + sum(os.fstat(v).st_size for v in logs.values())
        if sizes > MAX_SQLITE_COPY:
            return {UNCOMPARED: (None, None)}
        private = done.enter_context(tempfile.TemporaryDirectory(prefix="caper-db-"))
        for suffix, src in (("", fd), *logs.items()):
            with open(os.path.join(private, "db" + suffix), "wb") as out:
                os.lseek(src, 0, os.SEEK_SET)
                while chunk := os.read(src, 1 << 20):
                    out.write(chunk)
        uri = "file:" + os.path.join(private, "db")
        try:
            con = sqlite3.connect(uri, uri=True, timeout=0)
        except sqlite3.Error:
            return None
        done.callback(con.close)
        # a cell is read whole: a generated column of zeroblob(1e9) in an
        # 8 KB file made caper allocate gigabytes (adv10a 09); past the
        # limit the read fails and the table is compared as unknown
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_SQLITE_CELL)
        deadline = time.monotonic() + SQLITE_DEADLINE_S
        con.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            names = [r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name LIMIT ?",
                (MAX_TABLES + 1,))]
        except sqlite3.Error:
            return None if not logs else {UNCOMPARED: (None, None)}
        counts: dict[str, int | None] = {}
        for n in names:
            try:
                q = 'SELECT count(*) FROM "' + n.replace('"', '""') + '"'
                counts[n] = con.execute(q).fetchone()[0]
            except sqlite3.Error:
                counts[n] = None
        deadline = time.monotonic() + SQLITE_ROWS_DEADLINE_S
        out = {n: (k, None if k is None else _row_digests(con, n) if k <= MAX_ROWS_COMPARED
                   else _column_stats(con, n))
               for n, k in counts.items()}
        try:
            code = [tuple(hashlib.blake2b(repr(v).encode(), digest_size=8).digest() for v in r)
                    for r in con.execute("SELECT type, name, sql FROM sqlite_master WHERE type "
                                         "IN ('trigger', 'view') ORDER BY name")]
            out[_SCHEMA_KEY] = (len(code), _Rows(("type", "name", "sql"), code,
                                                 [len(code)] * 3, [len(set(code))] * 3))
        except sqlite3.Error:
            out[UNCOMPARED] = (None, None)
        if len(names) > MAX_TABLES:
            out[UNCOMPARED] = (None, None)
        return out


# A rollback journal that belongs to a multi-database transaction ends with
# the super-journal's name, its length and checksum, and this magic (pager.c,
# readSuperJournal).
_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")


def _names_a_super_journal(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size >= 16 and os.pread(fd, 8, size - 8) == _JOURNAL_MAGIC


def _column_stats(con: sqlite3.Connection, table: str) -> _Rows | None:
    """Per column, how many cells hold a value and how many distinct values
    there are, counted by SQLite: a table too large to compare row by row
    (`UPDATE big SET email = NULL` keeps its count, not its values)."""
    q = '"' + table.replace('"', '""') + '"'
    try:
        columns = tuple(d[0] for d in con.execute(f"SELECT * FROM {q} LIMIT 0").description)
        if not columns:
            return None
        cols = ['"' + c.replace('"', '""') + '"' for c in columns]
        parts = [f"count(CASE WHEN {c} IS NULL OR {c} = '' OR {c} = x'' THEN NULL ELSE 1 END), "
                 f"count(DISTINCT {c})" for c in cols]
        row = con.execute(f"SELECT {', '.join(parts)} FROM {q}").fetchone()
    except sqlite3.Error:
        return None
    return _Rows(columns, None, list(row[0::2]), list(row[1::2]))


def _table_rows(name: str, before: tuple | None, after: tuple | None) -> TableRows:
    """Rows of before that after no longer holds, compared on the columns
    both have (a column added loses nothing). They are lost when a column
    went, or one holds fewer values or fewer distinct values than before
    (deleted rows, `SET x = NULL`, `SET x = 'same'`); else they were
    rewritten in place one to one (`SET name = upper(name)`): changed.
    Tables too large to keep their rows are compared by those counts alone:
    a loss is seen, a rewrite in place is not."""
    (b, b_rows), (a, a_rows) = before or (None, None), after or (None, None)
    if b_rows is None or a_rows is None:
        # One side not read to the end: unknown, unless the table is new or gone.
        known = (before is None or b is not None and b_rows is not None or b == 0) and \
                (after is None or a is not None and a_rows is not None or a == 0)
        return TableRows(name, b, a, compared=known)
    common = [i for i, col in enumerate(b_rows.columns) if col in a_rows.columns]
    at = [a_rows.columns.index(b_rows.columns[i]) for i in common]
    if b_rows.rows is not None and a_rows.rows is not None:
        gone = sum((Counter(tuple(r[i] for i in common) for r in b_rows.rows)
                    - Counter(tuple(r[j] for j in at) for r in a_rows.rows)).values())
    else:       # by the counts: the values a column lost, or the rows deleted
        gone = max([(b or 0) - (a or 0)] + [b_rows.filled[i] - a_rows.filled[j]
                                            for i, j in zip(common, at)])
    # A column dropped loses every value it held.
    gone = max([gone] + [n for i, n in enumerate(b_rows.filled) if i not in common])
    destroyed = len(common) < len(b_rows.columns) or (b or 0) > (a or 0) or any(
        a_rows.filled[j] < b_rows.filled[i] or a_rows.distinct[j] < b_rows.distinct[i]
        for i, j in zip(common, at))
    return TableRows(name, b, a, gone if destroyed else 0, 0 if destroyed else gone)


def _row_digests(con: sqlite3.Connection, table: str) -> _Rows | None:
    """The table's rows by content: a row updated in place is one lost and
    one new, as a deleted and an inserted row are, until _table_rows tells
    what became of its values."""
    try:
        cur = con.execute('SELECT * FROM "' + table.replace('"', '""') + '"')
        columns = tuple(d[0] for d in cur.description)
        rows = [tuple(hashlib.blake2b(repr(v).encode(), digest_size=8).digest() for v in r)
                for r in cur]
    except sqlite3.Error:
        return None
    empty = {hashlib.blake2b(repr(v).encode(), digest_size=8).digest() for v in (None, "", b"")}
    cells = [[r[i] for r in rows if r[i] not in empty] for i in range(len(columns))]
    return _Rows(columns, rows, [len(c) for c in cells], [len(set(c)) for c in cells])


class _Timeout(Exception):
    pass


class _Matcher(difflib.SequenceMatcher):
    """A SequenceMatcher that gives up past a deadline (checked at each match
    search, each of which MAX_DIFF_PAIRS bounds)."""

    def __init__(self, a: list[str], b: list[str], deadline: float):
        self.deadline = deadline
        super().__init__(None, a, b)

    def find_longest_match(self, alo=0, ahi=None, blo=0, bhi=None):
        if time.monotonic() > self.deadline:
            raise _Timeout
        return super().find_longest_match(alo, ahi, blo, bhi)

    def pairs(self) -> int:
        """Line pairs the first match search compares (difflib's junk excluded)."""
        na = Counter(self.a)
        return sum(n * len(self.b2j.get(x, ())) for x, n in na.items())


def _unified(m: _Matcher) -> list[str]:
    """difflib.unified_diff's hunks (one line of context), without its header."""
    def span(lo: int, hi: int) -> str:
        n = hi - lo
        return f"{lo + 1}" if n == 1 else f"{lo if not n else lo + 1},{n}"
    out = []
    for group in m.get_grouped_opcodes(1):
        out.append(f"@@ -{span(group[0][1], group[-1][2])} +{span(group[0][3], group[-1][4])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + x for x in m.a[i1:i2]]
                continue
            out += ["-" + x for x in m.a[i1:i2]] if tag in ("replace", "delete") else []
            out += ["+" + x for x in m.b[j1:j2]] if tag in ("replace", "insert") else []
    return out


def _withhold_secret_lines(lines: list[str], redactor: Redactor, salt: bytes) -> list[str]:
    """lines with each one that holds (part of) a secret replaced by the key
    it sets and a keyed digest of it: a private key's body lines match no
    shape one by one, and a diff line must not show them. Equal lines still
    compare equal, so the diff keeps its shape; the per-report key makes the
    digest no hint."""
    text = "\n".join(lines)
    spans = redactor.spans(text)
    if not spans:
        return lines
    out, pos, i = [], 0, 0
    for line in lines:
        end = pos + len(line)
        while i < len(spans) and spans[i][1] <= pos:
            i += 1
        if i < len(spans) and spans[i][0] < max(end, pos + 1) and spans[i][1] > pos:
            tag = hashlib.blake2b(line.encode(), key=salt, digest_size=4).hexdigest()
            key = key_of(line)
            if spans[i][0] < pos + len(key):   # the "key" is part of the secret (a base64 tail)
                key = ""
            line = f"{key}<secret withheld {tag}>"
        out.append(line)
        pos = end + 1
    return out


def _database_sides(path: str, old_path: str, op: str, tree: RunTree,
                    ops: "Mapping[str, str]"):
    """The pieces (_sqlite_tables) of the database at path before and after
    the run; for a log (app.db-wal, app.db-journal), those of its database:
    a log the run wrote, or removed, changes what the database holds. (None
    for a log whose database is a change of its own: that change's tables
    already read the log.) ops: every change's op, by path."""
    base = next((path[:-len(s)] for s in SQLITE_LOGS if path.endswith(s)), None)
    if base is not None:
        if base in ops:
            return [None], [None]
        path = old_path = base
    names = [path] + [path + s for s in SQLITE_LOGS]
    before = [("/", old_path.lstrip("/"))] + [("/", (old_path + s).lstrip("/")) for s in SQLITE_LOGS]
    if op == "created" and base is None:
        before = [None] * len(names)
    after = []
    for n in names:
        where = tree.locate(n)
        if ops.get(n) == "deleted" or (n == path and op == "deleted"):
            after.append(None)
        elif where and os.path.lexists(os.path.join(where[0], where[1])):
            after.append(where)
        else:
            after.append(("/", n.lstrip("/")))
    return before, after


def inspect(path: str, op: str, tree: RunTree, redactor: Redactor,
            old_path: str | None = None, deadline: float | None = None,
            credential: bool = False, ops: "Mapping[str, str] | None" = None) -> FileDetail:
    """Compare the host's version of path (of old_path, for a rename) with
    the run's. A created file has no host version, a deleted one no run version.
    deadline (time.monotonic()): the diff's, at most DIFF_DEADLINE_S from now.
    A credential location's diff shows only the keys its lines set, and no
    diff line of any file shows a secret of either version."""
    d = FileDetail()
    where = tree.locate(path)
    old_path = old_path or path
    before = read_blob("/", old_path.lstrip("/"), MAX_DIFF_BYTES + 1) if op != "created" else None
    after = (read_blob(where[0], where[1], max(MAX_DIFF_BYTES + 1, MAX_SCAN_BYTES))
             if where and op != "deleted" else None)
    d.size_before = before.size if before else None
    d.size_after = after.size if after else None
    d.allocated_after = after.allocated if after else None
    if after is not None:
        redactor.text(after.data[:MAX_SCAN_BYTES].decode("utf-8", "replace"), d.secrets)
        if after.size > MAX_SCAN_BYTES:
            d.uncertain.append("secret-scan-partial")

    b_side, a_side = _database_sides(path, old_path, op, tree, ops or {})
    b_db, a_db = _sqlite_tables(b_side), _sqlite_tables(a_side)
    if b_db is not None or a_db is not None:
        b_db, a_db = b_db or {}, a_db or {}
        rows = [_table_rows(SCHEMA_CODE if n == _SCHEMA_KEY else n, b_db.get(n), a_db.get(n))
                for n in sorted((set(b_db) | set(a_db)) - {UNCOMPARED})
                # the triggers and views, shown where either side has some
                if n != _SCHEMA_KEY or b_db.get(n, (0,))[0] or a_db.get(n, (0,))[0]]
        if UNCOMPARED in b_db or UNCOMPARED in a_db:
            rows.append(TableRows("(tables not read)", None, None, compared=False))
        rows.sort(key=lambda r: (r.compared, r.before == r.after))   # unknown, then changed first
        d.tables = rows[:MAX_TABLES]
        if not all(r.compared for r in rows):
            d.uncertain.append(TABLES_NOT_COMPARED)
        return d

    if before is not None and before.size and after is not None and (
            not after.size or before.size >= OVERWRITE_MIN_BYTES and
            after.size <= (1 - OVERWRITE_SHARE) * before.size):
        d.overwritten = True       # emptied or cut to a stub, whatever it held (adv10b 09:
                                   # a 2 MB one-line JSON made `{}`, too large to diff)
    too_large = any(b is not None and b.size > MAX_DIFF_BYTES for b in (before, after))
    old, new = _as_text(before), _as_text(after)
    # a rewrite no line diff shows: what it destroyed cannot be told (adv13b 05:
    # a dataset zeroed in place, a large CSV's every value wiped, same sizes)
    d.uncompared = before is not None and after is not None and not d.overwritten and (
        old is None or new is None or too_large) and (
        before.size != after.size or not _same_bytes(("/", old_path.lstrip("/")), where))
    if old is None or new is None:
        return d          # binary: sizes only
    if too_large:
        d.uncertain.append("too-large-to-diff")
        return d
    salt = os.urandom(16)
    a = _withhold_secret_lines(old.splitlines(), redactor, salt)
    b = _withhold_secret_lines(new.splitlines(), redactor, salt)
    end = time.monotonic() + DIFF_DEADLINE_S
    m = _Matcher(a, b, end if deadline is None else min(end, deadline))
    try:
        if m.pairs() > MAX_DIFF_PAIRS:
            raise _Timeout
        lines = _unified(m)
    except _Timeout:   # counts of the lines each side has more of: sizes and line counts
        d.uncertain.append(DIFF_TOO_COSTLY)
        ca, cb = Counter(a), Counter(b)
        lines = []
        d.added, d.removed = sum((cb - ca).values()), sum((ca - cb).values())
    else:
        d.added = sum(1 for s in lines if s.startswith("+"))
        d.removed = sum(1 for s in lines if s.startswith("-"))
    d.overwritten = d.overwritten or bool(a) and (not b or (
        len(a) >= OVERWRITE_MIN_LINES and d.removed >= OVERWRITE_SHARE * len(a)))
    d.cut = len(a) >= OVERWRITE_MIN_LINES and d.removed >= CUT_SHARE * len(a)
    if credential:   # the keys it changes, never their values
        lines = [s if s.startswith("@@") else s[:1] + key_of(s[1:]) + "<withheld>" for s in lines]
    d.diff = lines[:MAX_DIFF_LINES]
    return d
