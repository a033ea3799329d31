"""Building the report is bounded in time: difflib is quadratic on crafted
files (lines of 100 values, each under its "popular" threshold: ~20 s a file
of 87,000 lines), and the command's timeout covers only the command."""
from __future__ import annotations

import random
import subprocess

import caper.report.content
import caper.report.build
from caper import run
from caper.report.content import DIFF_TOO_COSTLY
from caper.report.build import REPORT_LATE


def _crafted(seed: int, lines: int) -> str:
    r = random.Random(seed)
    return "".join(f"{r.randrange(100):02d}\n" for _ in range(lines))


def _repo(tmp_path, lines: int, n: int = 2):
    w = tmp_path / "ws"
    w.mkdir()
    for i in range(n):
        (w / f"fixture{i}.txt").write_text(_crafted(i, lines))
    g = ["git", "-C", str(w), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run(g + ["init", "-q"], check=True)
    subprocess.run(g + ["add", "."], check=True)
    subprocess.run(g + ["commit", "-qm", "fixtures"], check=True)
    script = tmp_path / "rewrite.py"
    script.write_text(f"import random\nfor i in range({n}):\n    r = random.Random(1000 + i)\n"
                      f"    lines = [f'{{r.randrange(100):02d}}\\n' for _ in range({lines})]\n"
                      f"    open(f'fixture{{i}}.txt', 'w').write(''.join(lines))\n")
    return w, f"python3 {script}"


def go(w, cmd, tmp_path, approver="allow"):
    return run(cmd, cwd=str(w), approver=approver, state_dir=str(tmp_path / "state"),
               env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")})


def test_a_crafted_diff_gets_line_counts_and_the_card_says_so(tmp_path):
    """The adversary's files (87,000 lines each): too many line pairs to
    diff, so sizes and line counts, at once."""
    w, cmd = _repo(tmp_path, 87000)
    out = go(w, cmd, tmp_path, approver="block")
    r = out.report
    assert f"{DIFF_TOO_COSTLY}: 2" in r.uncertain, r.card()
    for c in r.changes:
        assert c.op == "modified" and not c.diff and c.size == (261000, 261000)
        assert c.lines and c.lines[0] == c.lines[1] > 0
    assert DIFF_TOO_COSTLY in r.card() and REPORT_LATE not in r.uncertain
    assert out.approver == "block"   # not late: the approver decided


def test_a_diff_past_its_deadline_gets_line_counts(tmp_path, monkeypatch):
    """Under the line-pair bound but many searches: the diff's own deadline."""
    w, cmd = _repo(tmp_path, 15000, n=1)
    monkeypatch.setattr(caper.report.content, "DIFF_DEADLINE_S", 0.2)
    out = go(w, cmd, tmp_path)
    assert out.committed and DIFF_TOO_COSTLY in out.report.card(), out.report.card()
    [c] = out.report.changes
    assert not c.diff and c.lines[0] > 0


def test_a_report_past_its_deadline_blocks_and_says_why(tmp_path, monkeypatch):
    w, cmd = _repo(tmp_path, 15000, n=3)
    monkeypatch.setattr(caper.report.build, "REPORT_DEADLINE_S", 0.3)
    before = (w / "fixture0.txt").read_text()
    out = go(w, cmd, tmp_path)        # an approver that allows everything
    assert not out.committed and out.approver == "caper"
    assert "took longer than 0.3 s" in out.reason and REPORT_LATE in out.reason, out.reason
    assert REPORT_LATE in out.report.uncertain and "files-not-inspected" in out.report.card()
    assert (w / "fixture0.txt").read_text() == before
