"""Runs held for a human.

When the approver is unsure and the host can ask a human (on_unsure = ask),
the run is neither committed nor thrown away: its snapshot is kept with a
record of what it did, and `caper commit ID` applies it later, exactly as a
commit right after the run would have (the same conflict check against host
changes since the snapshot, the same journal), printing the held output.
`caper discard ID` drops it; held runs older than a day are dropped at the
next run. The hooks let an agent ask for `caper commit ID` only through the
host's own permission prompt, with the effect card in front of the human.

A held run is committed exactly as it was judged: the record carries an
HMAC (the state directory's record key) over its fields and a digest of
every entry of its upper layers (name, type, mode, owner, size, mtime,
content, link target, xattrs). The agent's file tools can write the state
directory while the run waits; what they add to the upper or change in the
record (its card, its layers) makes `caper commit` refuse it.

Only overlay runs are held (a btrfs workspace snapshot is committed or
dropped with its run).
"""
from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import os
import re
import stat
import time
from dataclasses import asdict, dataclass, fields

from caper.changes import Layer
from caper.commit.engine import commit
from caper.commit.journal import write_atomic
from caper.commit.recover import recover
from caper.errors import CommitIncomplete, ConfigError
from caper.state import inside, record_key, workspace_lock
from caper.view.overlay import remove_tree

PENDING_DIR = "pending"
MAX_AGE_S = 24 * 3600
_ID = re.compile(r"[0-9a-f]{16}\Z")


@dataclass
class Held:
    id: str
    workspace: str
    scratch: str                 # the run's scratch dir (its upper layers)
    layers: list[list]           # [mount_point, upper, userxattr, work]
    since_ns: int
    exclude: list[str]
    command: str
    exit_code: int | None
    stdout: str                  # base64 of the held output
    stderr: str
    card: str
    reason: str
    created: float
    mac: str = ""                # over the fields above and the upper layers' tree


def _path(state_dir: str, run_id: str) -> str:
    if not _ID.match(run_id or ""):
        raise ConfigError(f"not a held run id: {run_id!r}")
    return os.path.join(state_dir, PENDING_DIR, run_id + ".json")


def hold(state_dir: str, snap, exclude, workspace: str, command: str, result, report,
         reason: str) -> str:
    run_id = os.path.basename(snap.scratch)
    h = Held(id=run_id, workspace=workspace, scratch=snap.scratch,
             layers=[[la.mount_point, la.upper, la.userxattr, la.work] for la in snap.layers],
             since_ns=snap.since_ns, exclude=list(exclude), command=command,
             exit_code=result.exit_code,
             stdout=binascii.b2a_base64(result.stdout.text(), newline=False).decode(),
             stderr=binascii.b2a_base64(result.stderr.text(), newline=False).decode(),
             card=report.card_for_human(), reason=reason, created=time.time())
    h.mac = _mac(state_dir, h)
    os.makedirs(os.path.join(state_dir, PENDING_DIR), mode=0o700, exist_ok=True)
    write_atomic(_path(state_dir, run_id), json.dumps(asdict(h)).encode())
    return run_id


def load(state_dir: str, run_id: str) -> Held:
    """The held run's record, checked: what `caper commit` applies and
    `caper discard` deletes must be this run's own scratch in the state
    directory, whoever wrote the file."""
    try:
        with open(_path(state_dir, run_id)) as f:
            h = Held(**json.load(f))
    except FileNotFoundError:
        raise ConfigError(f"no held run {run_id} (applied, discarded or expired)") from None
    except (ValueError, TypeError) as e:
        raise ConfigError(f"held run {run_id}: unreadable record ({e})") from e
    _check(state_dir, run_id, h)
    return h


def _check(state_dir: str, run_id: str, h: Held) -> None:
    bad = f"held run {run_id}: the record is not caper's"
    runs = os.path.join(os.path.realpath(state_dir), "runs")
    if h.id != run_id or inside(runs, h.scratch) != os.path.join(runs, run_id):
        raise ConfigError(f"{bad}: its scratch {h.scratch!r} is not runs/{run_id} in {state_dir}")
    for layer in h.layers if isinstance(h.layers, list) else [None]:
        if not (isinstance(layer, list) and len(layer) in (3, 4) and isinstance(layer[0], str)
                and os.path.isabs(layer[0]) and isinstance(layer[2], bool)):
            raise ConfigError(f"{bad}: a malformed layer {layer!r}")
        for scratch_path in layer[1::2]:            # upper, work
            inside(h.scratch, scratch_path)
    if not (isinstance(h.workspace, str) and os.path.isabs(h.workspace)
            and isinstance(h.since_ns, int) and isinstance(h.exclude, list)
            and all(isinstance(x, str) for x in h.exclude)
            and isinstance(h.card, str) and isinstance(h.reason, str)
            and isinstance(h.created, (int, float))):
        raise ConfigError(f"{bad}: malformed fields")


_READ_CHUNK = 1 << 20


def _tree_digest(layers: list[list]) -> str:
    """A digest of every entry of the upper layers, and of the overlay's index
    in each work dir (the copy-ups of hard-linked files), as the commit
    reads them."""
    d = hashlib.sha256()
    for layer in layers:
        index = os.path.join(layer[3], "index") if len(layer) > 3 and layer[3] else None
        for root in [layer[1]] + ([index] if index and os.path.isdir(index) else []):
            d.update(b"layer\0" + os.fsencode(root) + b"\0")
            for top, dirs, files in os.walk(root, onerror=_raise):
                dirs.sort()
                for name in [top] + sorted(os.path.join(top, f) for f in files):
                    d.update(_entry(root, name))
    return d.hexdigest()


def _raise(e: OSError) -> None:
    raise e


def _entry(upper: str, path: str) -> bytes:
    st = os.lstat(path)
    fields_ = [os.path.relpath(path, upper), st.st_mode, st.st_uid, st.st_gid, st.st_size,
               st.st_mtime_ns, st.st_rdev]
    if stat.S_ISLNK(st.st_mode):
        fields_.append(os.readlink(path))
    elif stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except PermissionError:   # rootless: a file the run closed (mode 000); its stat stands
            fields_.append("unreadable")
        else:
            try:
                while chunk := os.read(fd, _READ_CHUNK):
                    h.update(chunk)
            finally:
                os.close(fd)
            fields_.append(h.hexdigest())
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        names = []
    for n in names:
        try:
            fields_.append([n, os.getxattr(path, n, follow_symlinks=False).hex()])
        except OSError:
            fields_.append([n, None])
    return json.dumps(fields_).encode() + b"\n"


def _mac(state_dir: str, h: Held) -> str:
    body = json.dumps(["held", [getattr(h, f.name) for f in fields(Held) if f.name != "mac"],
                       _tree_digest(h.layers)])
    return hmac.new(record_key(state_dir), body.encode(), hashlib.sha256).hexdigest()


def _sealed(state_dir: str, run_id: str, h: Held) -> None:
    """Refuse a held run whose record or upper layers changed since it was held."""
    try:
        ok = isinstance(h.mac, str) and hmac.compare_digest(h.mac, _mac(state_dir, h))
    except OSError as e:
        raise ConfigError(f"held run {run_id}: its layers cannot be read back "
                          f"({e.strerror}: {e.filename}); nothing was committed") from e
    if not ok:
        raise ConfigError(f"held run {run_id}: its record or its upper layer changed since it "
                          "was held (not what was judged and shown); nothing was committed: "
                          f"`caper discard {run_id}` drops it")


def discard(state_dir: str, run_id: str) -> None:
    h = load(state_dir, run_id)
    remove_tree(h.scratch)
    try:
        os.unlink(h.scratch + ".kept")
    except FileNotFoundError:
        pass
    os.unlink(_path(state_dir, run_id))


def apply(state_dir: str, run_id: str) -> tuple[int | None, bytes, bytes]:
    """Commit a held run (under the workspace lock); return the command's exit
    status and held output. A conflict leaves it held."""
    h = load(state_dir, run_id)
    recover(state_dir)
    with workspace_lock(state_dir, h.workspace):
        _sealed(state_dir, run_id, h)
        try:
            commit([Layer(*layer) for layer in h.layers], state_dir=state_dir,
                   since_ns=h.since_ns, exclude=h.exclude)
        except CommitIncomplete as e:
            if not e.applied:
                raise
        discard(state_dir, run_id)
    return h.exit_code, binascii.a2b_base64(h.stdout), binascii.a2b_base64(h.stderr)


def expire(state_dir: str, max_age_s: float = MAX_AGE_S) -> list[str]:
    """Drop held runs nobody applied within max_age_s."""
    out = []
    d = os.path.join(state_dir, PENDING_DIR)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return out
    now = time.time()
    for n in names:
        run_id = n.removesuffix(".json")
        if not n.endswith(".json") or not _ID.match(run_id):
            continue
        try:
            if now - load(state_dir, run_id).created > max_age_s:
                discard(state_dir, run_id)
                out.append(run_id)
        except (ConfigError, OSError):
            continue
    return out
