"""Helpers shared by bench/conftest.py, bench/test_overhead.py and bench/report.py."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

HIGHEST_SYSNO = 460
N_DIRS = 51
FILES_PER_DIR = 100         # 5,100 files, + 20 added by later commits
N_C_FILES = 29              # unit*.c, + main.c: 30 .c files


def fill_workspace(ws: str) -> None:
    """The transaction bench's workspace: 10,000 files in 100 directories."""
    for d in range(100):
        os.makedirs(os.path.join(ws, f"d{d:03}"))
        for f in range(100):
            with open(os.path.join(ws, f"d{d:03}", f"f{f:03}"), "w") as fh:
                fh.write(f"{d} {f}\n")


def sandbox_alone(ws: str, state: str) -> None:
    """The btrfs floor's sandbox: the overlays a btrfs run of `true` gets
    (the workspace bound at its own path), the native core and the tracer,
    with no report, approver or commit."""
    from caper.view.overlay import OverlaySnapshot
    from caper.sandbox.trace import trace
    layers = OverlaySnapshot.create(state, userxattr=False, binds=[(ws, ws)],
                                    work_dirs=[os.environ.get("HOME", "/root"), "/var/tmp"])
    trace("true", cwd=ws, mounts=layers.mounts, new_root=layers.stage,
          not_before_ns=layers.not_before_ns).run()
    layers.discard_later()


def machine() -> str:
    """This machine in one line, for figures that are only true of it: CPU
    model and count, RAM, kernel, load average."""
    import platform
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "?")
        with open("/proc/meminfo") as f:
            ram = int(f.readline().split()[1]) // (1 << 20)
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except (OSError, ValueError, IndexError):
        ram, load = "?", "?"
    return (f"{os.cpu_count()} × {model}, {ram} GiB RAM, kernel {platform.release()}, "
            f"Python {platform.python_version()}, load average {load}")


def which(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return os.path.realpath(path)


def caper_syscalls() -> list[str]:
    """Names of every syscall in caper's table (csrc/sysent.c), read through
    caper_syscall_name() so the list follows the table."""
    from caper.sandbox._native import ffi, lib
    names = []
    for nr in range(HIGHEST_SYSNO + 1):
        p = lib.caper_syscall_name(nr)
        if p != ffi.NULL:
            names.append(ffi.string(p).decode())
    return names


def strace_knows(strace: str, name: str) -> bool:
    r = subprocess.run([strace, "-o", "/dev/null", "-e", f"trace={name}", "/bin/true"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return r.returncode == 0 and b"invalid system call" not in r.stderr


def c_build_outputs(root: str) -> list[str]:
    """Every file a full build of the C project leaves behind."""
    src = os.path.join(root, "src")
    objs = [os.path.join(src, n[:-2] + ".o") for n in os.listdir(src) if n.endswith(".c")]
    return objs + [os.path.join(root, "prog")]


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_snapshot() -> tuple[float, float, float, float]:
    """(monotonic s, whole-machine busy CPU s, steal s, this process tree's CPU s).

    The machine's busy time minus our own tells whether something else ran
    during a measurement (on this VM: another pytest next door); steal is
    time the hypervisor gave our vCPUs to someone else."""
    import resource
    import time
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice
    busy = (f[0] + f[1] + f[2] + f[5] + f[6]) / _TICK
    steal = (f[7] if len(f) > 7 else 0) / _TICK
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        own += r.ru_utime + r.ru_stime
    return time.monotonic(), busy, steal, own


def cpu_delta(a, b) -> dict:
    wall, busy, steal, own = (y - x for x, y in zip(a, b))
    return {"wall_s": round(wall, 3), "busy_cpu_s": round(busy, 3), "own_cpu_s": round(own, 3),
            "foreign_cpu_s": round(max(0.0, busy - own), 3), "steal_s": round(steal, 3)}


# ---------------------------------------------------------------------------
# the environment every variant runs with


def make_env() -> dict[str, str]:
    """One environment for native, caper and strace runs alike."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "GIT_", "MAKE", "MFLAGS"))}
    env.update({
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
        "GIT_PAGER": "cat", "PAGER": "cat",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


# ---------------------------------------------------------------------------
# the git repository (5,000+ files, a few commits)


def _text(rng: random.Random, n_lines: int) -> str:
    words = ("alpha", "beta", "gamma", "delta", "caper", "trace", "event", "noise",
             "report", "sandbox", "commit", "rollback", "approve", "block", "path")
    return "".join(" ".join(rng.choice(words) for _ in range(8)) + "\n" for _ in range(n_lines))


def write_file(path: str, text: str, mode: int | None = None) -> None:
    """Write a file of a bench project, making its directories."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if mode is not None:
        os.chmod(path, mode)


def sqlite_db(path: str, script: str) -> None:
    import sqlite3
    con = sqlite3.connect(path)
    con.executescript(script)
    con.commit()
    con.close()


def commit_all(repo: str, message: str, init: bool = False) -> None:
    """git add -A and commit (after git init when asked), as a fixed author."""
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=n"]
    if init:
        subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", message, "--allow-empty"], cwd=repo, check=True)


def _git(repo: str, env: dict, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_git_repo(repo: str, env: dict) -> str:
    """Create the git workload's repository at repo (which must not exist)."""
    os.mkdir(repo)
    rng = random.Random(1234)
    files = []
    for d in range(N_DIRS):
        sub = os.path.join(repo, f"pkg{d:02d}")
        os.mkdir(sub)
        for f in range(FILES_PER_DIR):
            path = os.path.join(sub, f"mod{f:03d}.txt")
            with open(path, "w") as fh:
                fh.write(_text(rng, rng.randint(3, 30)))
            files.append(path)
    _git(repo, env, "init", "-q", "-b", "main")
    _git(repo, env, "add", "-A")
    _git(repo, env, "commit", "-q", "-m", "initial import")
    for c in range(1, 5):      # four more commits, each touching 40 files and adding 5
        for path in rng.sample(files, 40):
            with open(path, "a") as fh:
                fh.write(_text(rng, 2))
        for k in range(5):
            path = os.path.join(repo, f"pkg{c:02d}", f"new{c}_{k}.txt")
            with open(path, "w") as fh:
                fh.write(_text(rng, 5))
            files.append(path)
        _git(repo, env, "add", "-A")
        _git(repo, env, "commit", "-q", "-m", f"change {c}")
    _git(repo, env, "gc", "-q")
    # a working tree with something to report
    for path in files[:3]:
        with open(path, "a") as fh:
            fh.write("local edit\n")
    for k in range(2):
        with open(os.path.join(repo, f"untracked{k}.txt"), "w") as fh:
            fh.write("scratch\n")
    # settle the index (no racily-clean entries left to rehash each round)
    _git(repo, env, "update-index", "-q", "--refresh")
    _git(repo, env, "status", "--porcelain")
    n = sum(len(fs) for d, _, fs in os.walk(repo) if ".git" not in d.split(os.sep))
    assert n >= 5000, n
    return repo


# ---------------------------------------------------------------------------
# the C project (30 .c files + a header + Makefile)


MAKEFILE = """\
CC ?= cc
CFLAGS ?= -O1 -Wall
SRCS := $(wildcard src/*.c)
OBJS := $(SRCS:.c=.o)

prog: $(OBJS)
\t$(CC) -o $@ $(OBJS)

src/%.o: src/%.c src/common.h
\t$(CC) $(CFLAGS) -Isrc -c $< -o $@

clean:
\trm -f prog src/*.o

.PHONY: clean
"""


def _c_file(i: int) -> str:
    body = [f'#include "common.h"\n#include <stdio.h>\n#include <string.h>\n']
    body.append(f"static int table_{i}[64];\n")
    for j in range(4):
        body.append(
            f"static int helper_{i}_{j}(int x) {{\n"
            f"    int acc = {j};\n"
            f"    for (int k = 0; k < 64; k++) {{ table_{i}[k] = (x * k + {i}) % 97; acc += table_{i}[k]; }}\n"
            f"    return acc ^ x;\n}}\n")
    body.append(
        f"int unit_{i}(int x) {{\n"
        f"    char buf[64];\n"
        f"    snprintf(buf, sizeof buf, \"unit {i}: %d\", x);\n"
        f"    return (int)strlen(buf) + " + " + ".join(f"helper_{i}_{j}(x)" for j in range(4)) + ";\n}\n")
    return "".join(body)


def make_c_project(root: str) -> str:
    """Create the C workload's project at root (which must not exist)."""
    os.mkdir(root)
    src = os.path.join(root, "src")
    os.mkdir(src)
    with open(os.path.join(root, "Makefile"), "w") as fh:
        fh.write(MAKEFILE)
    with open(os.path.join(src, "common.h"), "w") as fh:
        fh.write("#pragma once\n" + "".join(f"int unit_{i}(int x);\n" for i in range(N_C_FILES)))
    for i in range(N_C_FILES):
        with open(os.path.join(src, f"unit{i:02d}.c"), "w") as fh:
            fh.write(_c_file(i))
    with open(os.path.join(src, "main.c"), "w") as fh:
        fh.write('#include "common.h"\n#include <stdio.h>\nint main(void) {\n    int s = 0;\n'
                 + "".join(f"    s += unit_{i}(s & 7);\n" for i in range(N_C_FILES))
                 + '    printf("%d\\n", s);\n    return 0;\n}\n')
    return root


if __name__ == "__main__":
    # Build the workloads' trees by hand, to poke at them:
    #   python3 bench/benchlib.py /tmp/somewhere
    import sys as _sys
    base = _sys.argv[1]
    os.makedirs(base, exist_ok=True)
    print(make_git_repo(os.path.join(base, "repo"), make_env()))
    print(make_c_project(os.path.join(base, "cbuild")))
