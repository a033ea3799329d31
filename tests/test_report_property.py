"""Property tests of the report budget: any event stream and snapshot
difference (thousands of files, huge names, binary junk, non-UTF-8) gives a
report that validates, serializes to at most 8 KiB, keeps every count
consistent, and never contains a value from a protected file.

The events are built as the decoder would hand them over (the decoder has
its own tests); the files whose contents the report reads are real files."""
from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st

from caper.changes import Change
from caper.report.content import RunTree
from caper.sandbox.events import End, Event, Family, Info, Kind, Output, Refusal, RunResult
from caper.report.build import CAP_BYTES, Report, RunFacts, build
from caper.report.secrets import MIN_SECRET_LEN, Protected, default_patterns

EXAMPLES = int(os.environ.get("CAPER_HYPOTHESIS_EXAMPLES", 25))

# Secret values: never words the report itself uses (a '#' and digits in each).
secret = st.from_regex(r"\A[A-Za-z0-9]{4,24}#[0-9]{2}[A-Za-z0-9/+=_-]{0,16}\Z")
name_bytes = st.binary(min_size=1, max_size=255).map(
    lambda b: b.replace(b"/", b"_").replace(b"\0", b"_")).filter(lambda b: b not in (b".", b".."))
junk = st.binary(max_size=600)


@st.composite
def scenarios(draw):
    secrets = draw(st.lists(secret, min_size=1, max_size=4, unique=True))
    names = [os.fsdecode(n) for n in draw(st.lists(name_bytes, max_size=12))]
    n_bulk = draw(st.sampled_from([0, 0, 50, 3000]))
    pieces = st.one_of(junk, st.sampled_from([s.encode() for s in secrets]),
                       st.sampled_from([b"AKIAIOSFODNN7EXAMPLE", b"\xff\xfe", b"\n" * 3]))
    def blob():
        return b"".join(draw(st.lists(pieces, max_size=6)))
    return {
        "secrets": secrets,
        "names": names,
        "n_bulk": n_bulk,
        "contents": [(blob(), blob()) for _ in names],
        "ops": draw(st.lists(st.sampled_from(["created", "modified", "deleted", "replaced", "meta"]),
                             min_size=len(names), max_size=len(names))),
        "out": blob() * draw(st.sampled_from([1, 1, 200])),
        "err": blob(),
        "head_tail": draw(st.tuples(st.integers(0, 4096), st.integers(0, 4096))),
        "argvs": draw(st.lists(st.lists(st.one_of(st.text(max_size=300), st.sampled_from(secrets)),
                                        min_size=1, max_size=40), max_size=30)),
        "n_net": draw(st.sampled_from([0, 1, 40, 2000])),
        "n_refused": draw(st.sampled_from([0, 3, 500])),
        "addr": draw(st.one_of(st.text(max_size=200), st.sampled_from(secrets))),
        "end": draw(st.sampled_from([End.EXITED, End.SIGNALED, End.TIMEOUT, End.PIDS_LIMIT])),
    }


def facts_of(sc: dict, root: str) -> RunFacts:
    ws, after = os.path.join(root, "ws"), os.path.join(root, "after")
    os.makedirs(ws)
    os.makedirs(after)
    with open(os.path.join(ws, ".env"), "w") as f:
        f.write("".join(f"KEY_{i}={v}\n" for i, v in enumerate(sc["secrets"])))
    changes = []
    for name, (old, new), op in zip(sc["names"], sc["contents"], sc["ops"]):
        p = os.path.join(ws, name)
        if op != "created":
            with open(p, "wb") as f:
                f.write(old)
        if op != "deleted":
            with open(os.path.join(after, name), "wb") as f:
                f.write(new)
        changes.append(Change(p, op, "file", "dir" if op == "replaced" else None,
                              detail=sc["secrets"][0] if op == "meta" else ""))
    changes += [Change(os.path.join(ws, "build", f"d{i % 7}", f"o{i}.o" + "x" * (i % 200)),
                       "created", "file") for i in range(sc["n_bulk"])]

    ev: list[Event] = []
    seq = iter(range(1, 10**9))

    def add(kind, pid, **kw):
        ev.append(Event(kind=kind, seq=next(seq), pid=pid, ppid=kw.pop("ppid", 1), time_ns=0,
                        result=kw.pop("result", 0), syscall=kw.pop("syscall", None), **kw))

    for i, argv in enumerate(sc["argvs"]):
        add(Kind.PROC_START, 100 + i, ppid=100 + i - 1 if i else 0)
        add(Kind.EXEC, 100 + i, path="/usr/bin/" + argv[0][:50], argv=argv)
    add(Kind.OPEN, 100, path=os.path.join(ws, ".env"), flags=os.O_RDONLY, result=3)
    for i, c in enumerate(changes[:5000]):
        add(Kind.OPEN, 100 + i % 7, path=c.path, flags=os.O_WRONLY | os.O_CREAT, result=3)
    for i in range(sc["n_net"]):
        add(Kind.CONNECT, 100 + i % 5, path=f"{sc['addr']}{i}", flags=int(Family.INET),
            arg0=443, mode=1 | 6 << 8, result=-101)
    for i in range(sc["n_refused"]):
        add(Kind.REFUSED, 100, flags=int(Refusal.NAMESPACE), arg1=165, syscall="mount",
            result=-1, info=int(Info.REFUSED))
    add(Kind.LOST, 100, arg0=3)
    out = sc["out"]
    h, t = sc["head_tail"]
    result = RunResult(end=sc["end"], exit_code=0 if sc["end"] == End.EXITED else None,
                       signal=9 if sc["end"] == End.SIGNALED else None,
                       stdout=Output(out[:h], out[-t:] if t else b"", len(out)),
                       stderr=Output(sc["err"], sc["err"], len(sc["err"])))
    return RunFacts(command="sh -c '" + " ".join(sc["secrets"]) + "'", events=ev, result=result,
                    changes=changes, workspace=ws, tree=RunTree.of([(ws, after)]),
                    protected=Protected(default_patterns(), os.path.join(root, "home"), ws),
                    home=os.path.join(root, "home"))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(scenarios())
def test_any_run_gives_a_valid_bounded_consistent_report_without_secrets(sc):
    with tempfile.TemporaryDirectory() as root:
        report = build(facts_of(sc, root))
    text = report.to_json()
    assert len(text.encode()) <= CAP_BYTES
    again = Report.model_validate_json(text)          # validates, counts included
    for name, c in again.counts.items():
        assert c.observed == c.included + c.omitted, name
    none = {"observed": 0, "included": 0, "omitted": 0}   # an absent section observed nothing
    counts = {k: again.counts[k].model_dump() if k in again.counts else none
              for k in ("changes", "network", "refused")}
    assert counts["changes"]["observed"] == len(sc["names"]) + sc["n_bulk"]
    assert len(again.changes) == counts["changes"]["included"]
    assert counts["network"]["observed"] == sc["n_net"]
    assert counts["refused"]["observed"] == (1 if sc["n_refused"] else 0) * sc["n_refused"]
    assert again.end.how == sc["end"].name.lower()
    card = report.card()
    for v in sc["secrets"]:
        assert len(v) >= MIN_SECRET_LEN
        for form in (v, json.dumps(v)[1:-1]):
            assert form not in text and form not in card, v
