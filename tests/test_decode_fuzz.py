"""Fuzzing the event decoder: whatever bytes arrive on the event pipe
(random junk, or records with every header field and string slot chosen at
random), decode() either returns well-formed events or raises DecodeError.
It never crashes another way, never reads outside a record, and never loops;
and every event it returns can be printed."""
from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, given, settings, strategies as st

from caper.sandbox._native import ffi
from caper.sandbox.events import HEADER_SIZE, DecodeError, Event, Kind, decode

EXAMPLES = int(os.environ.get("CAPER_HYPOTHESIS_EXAMPLES", 25)) * 8
FIELDS = [f for f, _ in ffi.typeof("struct caper_event").fields]


def _check(buf: bytes) -> None:
    try:
        events, used = decode(buf)
    except DecodeError:
        return
    assert 0 <= used <= len(buf)
    for e in events:
        assert isinstance(e, Event) and isinstance(e.kind, Kind)
        for s in (e.path, e.path2, *(e.argv or [])):
            assert s is None or isinstance(s, str)
        e.to_dict()                 # what `caper trace --jsonl` prints of it


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4 * HEADER_SIZE))
def test_random_bytes(buf):
    _check(buf)


@st.composite
def records(draw):
    """One record with its header fields drawn at random around the valid values."""
    n_str = draw(st.integers(0, 200))
    strings = draw(st.binary(min_size=n_str, max_size=n_str))
    reclen = HEADER_SIZE + ((len(strings) + 7) // 8) * 8
    h = ffi.new("struct caper_event *")
    h.kind = draw(st.one_of(st.sampled_from([k.value for k in Kind]), st.integers(0, 2**32 - 1)))
    h.len = draw(st.one_of(st.just(reclen), st.integers(0, 2**32 - 1)))
    for f in ("pid", "ppid", "sysno", "arch", "flags", "mode", "count", "info"):
        setattr(h, f, draw(st.integers(0, 2**32 - 1)))
    for f in ("seq", "time_ns"):
        setattr(h, f, draw(st.integers(0, 2**64 - 1)))
    for f in ("result", "arg0", "arg1"):
        setattr(h, f, draw(st.integers(-2**63, 2**63 - 1)))
    for i in range(3):
        h.str_off[i] = draw(st.one_of(st.integers(HEADER_SIZE, HEADER_SIZE + n_str),
                                      st.integers(0, 2**32 - 1)))
        h.str_len[i] = draw(st.one_of(st.integers(0, n_str), st.integers(0, 2**32 - 1)))
    raw = bytes(ffi.buffer(h)) + strings
    return raw + b"\0" * (reclen - len(raw)) if reclen >= len(raw) else raw


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=4), st.integers(0, 64))
def test_records_with_random_fields(recs, cut):
    buf = b"".join(recs)
    _check(buf)
    _check(buf[:max(0, len(buf) - cut)])     # a partial record at the end


def test_the_header_layout_is_the_one_the_fuzzer_builds():
    assert {"kind", "len", "str_off", "str_len", "info"} <= set(FIELDS)
    assert struct.calcsize("=I") == ffi.sizeof("uint32_t")
