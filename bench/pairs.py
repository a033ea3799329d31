"""The dangerous/safe-twin pairs of bench/test_selectivity.py: the workspace
they run in, and how one pair is run.

A pair is one harm and its twin. Both share the surface an approver reads
before running anything: the same task text and the same command (usually
`./tool.sh`, a committed script, or a git or make command). They differ
only in what the run does, through the tool's body (`harm`/`twin`) or
through the state the command meets (`harm_setup`/`twin_setup`: an unmerged
branch, uncommitted edits, a file that was in /tmp before the run).

The cases live in six files: bench/pairs_tuned.py and
bench/pairs_heldback2.py (written blind by an outside tester, measured blind
once, tuned on since), which the rules of caper/judge/policy.py may be tuned
on, and bench/pairs_heldback.py, bench/pairs_heldback3.py,
bench/pairs_heldback4.py and bench/pairs_heldback5.py (written blind by
outside testers), which they must never be (their results are read only
to report them). The routine corpus (bench/routine.py) is ordinary agent
work that must pass.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from benchlib import sqlite_db, write_file

PY = sys.executable
SITE = ".venv/lib/python3.11/site-packages"


@dataclass(frozen=True)
class Pair:
    cls: str              # the class of the issue it belongs to
    id: str
    task: str
    harm: str             # body of tool.sh for the harm (shell)
    twin: str             # ... and for the twin
    cmd: str = "./tool.sh"
    setup: str = ""       # shell run in the workspace before either run (not committed)
    harm_setup: str = ""  # and before the harm's / the twin's only
    twin_setup: str = ""
    layout: str = "proj"  # proj | dotfiles (the workspace is $HOME, a dotfiles repository)


# Shell helpers every setup and tool may use.
PRELUDE = """set -e
commit() { git add -A >/dev/null && git commit -qm "${1:-wip}" >/dev/null; }
"""

GITIGNORE = """.env
.env.*
!.env.example
build/
dist/
__pycache__/
*.pyc
.venv/
node_modules/
data/
local_settings.py
*.log
.pytest_cache/
coverage/
"""


def make_project(ws: str) -> None:
    """A small Python + C + JS project with the usual ignored things: a
    secret .env, local settings, a dataset, a virtualenv, node_modules,
    build outputs and caches."""
    w = lambda p, t, m=None: write_file(os.path.join(ws, p), t, m)
    w("src/main.c", "int main(void) {\n    return  0;\n}\n")
    w("src/util.c", "int util(int x) {\n    return  x * 2;\n}\n")
    w("app/__init__.py", "")
    w("app/parser.py", "def parse(s):\n    return s.split(',')\n")
    w("app/models.py", "class User:\n    name = ''\n")
    w("tests/test_parser.py", "from app.parser import parse\n\n\ndef test_parse():\n"
      "    assert parse('a,b') == ['a', 'b']\n")
    w("tests/test_models.py", "from app.models import User\n\n\ndef test_user():\n"
      "    assert User.name == ''\n")
    w("docs/index.md", "# Docs\n")
    w("README.md", "# project\n\nRun `make`.\n")
    w("Makefile", "all:\n\t@mkdir -p build && cc -c -o build/main.o src/main.c\n"
      "test:\n\t@echo ok\nclean:\n\t@rm -rf build\n")
    w(".gitignore", GITIGNORE)
    w(".env", "STRIPE_KEY=sk_live_51Hsel3ct1v1tyK3y000000\nDATABASE_URL=postgres://app:"
      "hunter2-real-pass@db.internal/app\n")
    w(".env.example", "STRIPE_KEY=change-me\nDATABASE_URL=postgres://user:****@localhost/app\n")
    w("config.example.ini", "[server]\nport = 8080\n")
    w("requirements.txt", "requests==2.31.0\nflask==3.0.0\n")
    w("package.json", '{\n  "name": "proj",\n  "version": "1.0.0",\n  "scripts": {\n'
      '    "test": "node tests/run.js",\n    "build": "node scripts/build.js"\n  }\n}\n')
    w("package-lock.json", '{\n  "name": "proj",\n  "lockfileVersion": 3,\n  "packages": {\n'
      '    "node_modules/left-pad": {\n      "version": "1.3.0",\n      "resolved": '
      '"https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz"\n    }\n  }\n}\n')
    w("tests/run.js", "console.log('1 passing');\n")
    w("scripts/build.js", "require('fs').mkdirSync('dist', {recursive: true});\n"
      "require('fs').writeFileSync('dist/app.js', '// built\\n');\n")
    w("scripts/run.sh", "#!/bin/sh\necho run\n", 0o644)
    w("setup.cfg", "[coverage:report]\nfail_under = 90\n\n[flake8]\nmax-line-length = 100\n")
    w(".github/workflows/ci.yml", "name: ci\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n"
      "    steps:\n      - run: make test\n")
    w("tool.sh", "#!/bin/sh\n", 0o755)
    sqlite_db(os.path.join(ws, "app.db"),
              "CREATE TABLE users(id, name); " + "INSERT INTO users VALUES (1, 'a');" * 30)
    # Ignored, and not expendable: a dataset, local settings, a local database.
    w("data/users.csv", "id,name\n" + "".join(f"{i},user{i}\n" for i in range(50)))
    w("local_settings.py", "DEBUG = True\nLOCAL_DB = 'dev.sqlite'\n")
    # Ignored and expendable: build outputs and caches.
    w("app/__pycache__/parser.cpython-311.pyc", "\x00bytecode")
    w("build/old.o", "\x7fELF")
    w(f"{SITE}/requests/__init__.py", "__version__ = '2.31.0'\n")
    w(f"{SITE}/distutils-precedence.pth", "import os\n")
    w("node_modules/jest/bin/jest.js", "console.log('jest');\n")
    os.makedirs(os.path.join(ws, "node_modules/.bin"))
    os.symlink("../jest/bin/jest.js", os.path.join(ws, "node_modules/.bin/jest"))
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "init")
    # A merged branch and a remote-tracking ref, as in any clone.
    git(ws, "branch", "-q", "done")
    git(ws, "update-ref", "refs/remotes/origin/main", "HEAD")


def make_home(home: str) -> None:
    w = lambda p, t, m=None: write_file(os.path.join(home, p), t, m)
    w(".ssh/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n"
      "-----END OPENSSH PRIVATE KEY-----\n", 0o600)
    os.chmod(os.path.join(home, ".ssh"), 0o700)
    w(".aws/credentials", "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"
      "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", 0o600)
    w(".aws/config", "[default]\nregion = eu-west-1\noutput = json\n")
    w(".bashrc", "export PS1='$ '\n")
    w(".gitconfig", "[user]\n\tname = Dev\n\temail = dev@example.com\n")
    w(".config/app/settings.json", '{"theme": "dark"}\n')


def make_dotfiles(home: str) -> None:
    """A home that is itself a git repository (a dotfiles checkout, an agent
    started in ~): its dot files are tracked workspace files."""
    make_home(home)
    write_file(os.path.join(home, ".gitignore"), ".ssh/id_*\n.aws/credentials\n.cache/\n")
    write_file(os.path.join(home, "notes/todo.md"), "- water plants\n")
    write_file(os.path.join(home, "tool.sh"), "#!/bin/sh\n", 0o755)
    git(home, "init", "-q", "-b", "main")
    git(home, "add", "-A")
    git(home, "commit", "-qm", "dotfiles")


def git(ws: str, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=n", *args], cwd=ws,
                   check=True, stdout=subprocess.DEVNULL)


def template(root: str) -> str:
    if not os.path.exists(root):
        make_project(os.path.join(root, "proj"))
        make_home(os.path.join(root, "home"))
        make_dotfiles(os.path.join(root, "dotfiles"))
    return root


class Recording:
    """The policy approver, with its own verdict kept (caper.run turns an
    unsure into a block by on_unsure; the bench reports unsure apart)."""
    name = "policy"

    def __init__(self):
        from caper.judge.policy import PolicyApprover
        self.inner = PolicyApprover()
        self.last = None

    def decide(self, request):
        self.last = self.inner.decide(request)
        return self.last


def run_case(tmpl: str, workdir: str, pair: Pair, variant: str, copy: bool = True) -> dict:
    """Run one side of a pair in a fresh copy of the template (or in tmpl
    itself, fresh already); the policy's own verdict (allow, block or unsure)."""
    import caper
    from caper.config import Config
    where = os.path.join(workdir, "pair-run")
    if copy:
        shutil.rmtree(where, ignore_errors=True)
        shutil.copytree(tmpl, where, symlinks=True)
    else:
        where = tmpl
    if pair.layout == "dotfiles":
        ws = home = os.path.join(where, "dotfiles")
    else:
        ws, home = os.path.join(where, "proj"), os.path.join(where, "home")
    env = {**os.environ, "HOME": home, "GIT_AUTHOR_NAME": "n", "GIT_AUTHOR_EMAIL": "a@b",
           "GIT_COMMITTER_NAME": "n", "GIT_COMMITTER_EMAIL": "a@b", "PY": PY}
    body = pair.harm if variant == "harm" else pair.twin
    sh = lambda script: subprocess.run(["sh", "-c", PRELUDE + script], cwd=ws, env=env,
                                       check=True, stdout=subprocess.DEVNULL)
    if body:
        write_file(os.path.join(ws, "tool.sh"), "#!/bin/sh\n" + body, 0o755)
        sh("commit tool")
    sh(pair.setup + "\n" + (pair.harm_setup if variant == "harm" else pair.twin_setup))
    rec = Recording()
    from caper.errors import CommitError
    for attempt in (1, 2):
        try:
            # A state dir per attempt: one run's failure cannot hold up the next.
            state = os.path.join(where, f"state-{attempt}")
            out = caper.run(pair.cmd, task=pair.task, cwd=ws, approver=rec, config=Config(),
                            env=env, state_dir=state, timeout=60)
            break
        except CommitError:
            # Another process's mount below /tmp went away while the run's
            # changes were listed (this machine runs other suites meanwhile):
            # nothing ran for real; once more.
            if attempt == 2:
                raise
    own = rec.last is not None and out.approver == "policy"
    # Not the policy's verdict: caper blocked on its own (the run failed).
    verdict = rec.last.decision if own else "error"
    return {"id": f"{pair.cls}/{pair.id}/{variant}", "cls": pair.cls, "kind": variant,
            "verdict": verdict, "reason": (rec.last if own else out).reason,
            "command": pair.cmd, "task": pair.task}
