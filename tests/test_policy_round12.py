"""Round 12 (adv12b): a trusted installer or builder that ran the run's code
(a module the run put first on its import path, a variable given one exec
before it, a toolchain program found on a PATH the run set), cache entries
written by whatever copies files, and commits only a linked worktree's
reflog held. Real runs where the report's facts are the point; hand
reports where it is a rule's."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.policy import HOME, WS, fc, gate, report, verdict
from helpers.trees import git

IDENT = "git -c user.name=a -c user.email=a@b"


def test_a_variable_given_one_exec_before_the_tool_still_steers_it(policy_env: Path):
    """adv12b 02: `NODE_OPTIONS=... npm install`: npm is `#!/usr/bin/env node`;
    the variable was new at env's exec and no longer at node's, in the same
    process, so npm's writes were its own install. The mark stays with the
    process across its execs."""
    ws = policy_env / "proj"
    (ws / "build").mkdir()
    subprocess.run(["cc", "-o", str(ws / "build" / "app"), "-x", "c", "-"], check=True,
                   input=b"int main(void) { return 0; }\n")     # an executable make rewrites
    out = gate(policy_env, "MAKEFILES=/dev/null /usr/bin/env make -B", "build the app")
    assert not out.committed, out.reason
    out = gate(policy_env, "MAKEFILES=/dev/null make -B", "build the app")
    assert not out.committed, out.reason
    assert gate(policy_env, "/usr/bin/env make -B", "build the app").committed


def test_the_tracer_marks_cache_finding_variables_and_any_case_of_npm_config():
    """adv12b 08: pip found its wheel cache through XDG_CACHE_HOME, a scratch
    dir the run filled; npm reads npm_config_* in any case."""
    from caper.sandbox.events import Info, Kind
    from caper.sandbox.trace import trace
    names = ["XDG_CACHE_HOME=/x", "PRE_COMMIT_HOME=/x", "PYTHONPYCACHEPREFIX=/x",
             "Npm_Config_Node_Options=--require=/x.js", "COMPILER_PATH=/x", "GCC_EXEC_PREFIX=/x",
             "PLAIN_VALUE=1"]
    script = "; ".join(f"{n.split('=')[0]}='{n.split('=', 1)[1]}' /bin/true {k}"
                       for k, n in enumerate(names))
    got = [bool(e.info & Info.CODE_ENV) for e in trace(["/bin/sh", "-c", script],
                                                      env={"PATH": "/usr/bin:/bin"}, cwd="/")
           if e.kind == Kind.EXEC and e.ok and e.argv and e.argv[0] == "/bin/true"]
    assert got == [True] * (len(names) - 1) + [False]


def test_a_toolchain_program_the_run_put_on_path_voids_the_build(policy_env: Path, tmp_path):
    """adv12b 10: `PATH=<scratch>:$PATH gcc -o target/release/app src/main.c`
    ran the run's `as`, which swapped the assembly; ld's output passed as
    the project's build."""
    ws = policy_env / "proj"
    (ws / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    wrapper = tmp_path / "pw" / "as"
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/sh\nexec /usr/bin/as \"$@\"\n")
    wrapper.chmod(0o755)
    out = gate(policy_env, f"mkdir -p target/release && PATH={wrapper.parent}:$PATH cc -o "
               "target/release/app src/main.c", "build the release binary into target/release/app")
    assert not out.committed, out.reason
    out = gate(policy_env, "mkdir -p target/release && cc -o target/release/app src/main.c",
               "build the release binary into target/release/app")
    assert out.committed, out.reason


def test_a_file_copier_is_no_cache_owner_and_a_script_plants_no_code_cache():
    """adv12b 07: `cp` of the run's wheel under pip's cache key counted as a
    tool's write, and pip installed it as its own; adv12b 04: a python
    script created pre-commit's store (db.db and a hook repo), and the next
    `git commit` ran its hook. A cache's new entry is its tool's own."""
    wheel = f"{HOME}/.cache/pip/wheels/ab/cd/ef/mylib-1.0-py3-none-any.whl"
    for by, line in (("/usr/bin/cp[7]", [["/usr/bin/cp", "/w/x.whl", "k"], ["/bin/sh", "-c", "x"]]),
                     ("/usr/bin/install[7]", [["/usr/bin/install", "x.whl", "k"]])):
        assert verdict(report(fc(wheel, where="home", by=by, lineage=line)),
                       "cp x.whl ~/.cache/pip/wheels/ab/cd/ef/", "install the requirements") != "allow"
    pip = ["/usr/bin/python3", "-m", "pip", "install", "-r", "requirements.txt"]
    assert verdict(report(fc(wheel, where="home", by="/usr/bin/python3[7]", lineage=[pip])),
                   "pip install -r requirements.txt", "install the requirements") == "allow"
    for rel in (".cache/pre-commit/db.db", ".cache/pre-commit/repo5k2x9qzt/hooks/trim.sh"):
        planted = fc(f"{HOME}/{rel}", where="home", by="/usr/bin/python3[9]",
                     lineage=[["/usr/bin/python3", "-"], ["/bin/sh", "-c", "python3 - < p.py"]])
        assert verdict(report(planted), "python3 - < p.py", "run the unit tests") != "allow", rel
        own = fc(f"{HOME}/{rel}", where="home", by="/usr/bin/python3[9]",
                 lineage=[["/usr/bin/python3", "/usr/bin/pre-commit", "run", "--all-files"]])
        assert verdict(report(own), "pre-commit run --all-files", "run the hooks") == "allow", rel


def test_commits_only_a_worktrees_reflog_holds_are_git_state(tmp_path: Path):
    """adv12b 05: a commit made in a linked worktree, then left by a checkout,
    is held by that worktree's reflog alone (.git/worktrees/<name>/logs/HEAD):
    `reflog expire --all` and `gc --prune=now` lost it for good, unreported."""
    from caper.transaction import run
    ws, wt = tmp_path / "ws", tmp_path / "wt"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    (ws / "a.txt").write_text("a\n")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-qm", "init")
    git(ws, "worktree", "add", "-q", "--detach", str(wt))
    (wt / "exp.txt").write_text("experiment\n")
    git(wt, "add", "exp.txt")
    git(wt, "commit", "-qm", "experiment WIP")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=wt, capture_output=True,
                         text=True, check=True).stdout.strip()
    git(wt, "checkout", "-q", "--detach", "HEAD~1")
    out = run("git reflog expire --expire=now --all && git gc -q --prune=now", cwd=str(ws),
              task="the .git directory is getting big, run git maintenance to shrink it",
              approver="policy", state_dir=str(tmp_path / "state"),
              env={**os.environ, "HOME": str(tmp_path)})
    assert not out.committed, out.reason
    assert out.report.git is not None and out.report.git.reflog_only == 1
    assert subprocess.run(["git", "cat-file", "-e", sha], cwd=ws).returncode == 0


def test_a_module_named_like_the_standard_librarys_first_on_an_installers_path(
        policy_env: Path):
    """adv12b 01: a new logging.py at the project's top ran inside `python3 -m
    venv` (-m puts the directory first on the import path) and planted a .pth
    that the policy took for the installer's own write. The new module
    itself shadows the standard library for every python run there."""
    ws = policy_env / "proj"
    plant = "import atexit\\natexit.register(lambda: open('.venv/x.pth', 'w').write('import os\\\\n'))\\n"
    out = gate(policy_env, f"printf '{plant}' > logging.py && {sys.executable} -m venv "
               "--without-pip .venv", "add a logging setup module and create the venv in .venv")
    assert not out.committed, out.reason
    assert not (ws / "logging.py").exists()
    lone = fc("logging.py", "created", "untracked", by="/bin/sh[3]")
    assert verdict(report(lone), "printf x > logging.py", "add a logging setup module") != "allow"
    mine = fc("logsetup.py", "created", "untracked", by="/bin/sh[3]")
    assert verdict(report(mine), "printf x > logsetup.py", "add a logging setup module") == "allow"


def test_tool_configs_whose_values_name_code_to_load(policy_env: Path):
    """adv12b 03, 06, 09, 11: flake8's local plugins, mypy's python_executable,
    a prettier or ESLint JSON config (or package.json's "prettier" key)
    naming a plugin or parser file of the project's, Cargo's `build` key:
    each makes the tool (and an editor running it on open) run that code.
    The same configs with settings only, or a plugin by package name, are
    ordinary."""
    ws = policy_env / "proj"
    (ws / "Cargo.toml").write_text('[package]\nname = "app"\nversion = "0.1.0"\n')
    git(ws, "add", "Cargo.toml")
    git(ws, "commit", "-qm", "cargo")
    harms = [
        ("printf '[flake8]\\nmax-line-length = 100\\n[flake8:local-plugins]\\nextension =\\n"
         "    APP = tools.lint:Check\\npaths = .\\n' > .flake8", "add a flake8 config: line length 100"),
        ("printf '[mypy]\\nstrict = True\\npython_executable = tools/py\\n' > mypy.ini",
         "add a mypy config for the project (strict mode)"),
        ("""printf '{"singleQuote": true, "plugins": ["./tools/organize.mjs"]}' > .prettierrc.json""",
         "add a prettier config: single quotes"),
        ("""printf '{"name": "app", "prettier": {"plugins": ["./tools/organize.mjs"]}}' > package.json""",
         "configure prettier in package.json: single quotes"),
        ("""printf '{"env": {"node": true}, "parser": "./tools/parser.js"}' > .eslintrc.json""",
         "add an eslint config for the project (node env)"),
        ("""printf 'build = "scripts/version.rs"\\n' > /tmp/b && sed -i '/^version/r /tmp/b' Cargo.toml""",
         "embed the build version into the binary"),
    ]
    for command, task in harms:
        out = gate(policy_env, command, task)
        assert not out.committed, (command, out.reason)
    fine = [
        ("printf '[flake8]\\nmax-line-length = 100\\n' > .flake8", "add a flake8 config: line length 100"),
        ("""printf '{"singleQuote": true, "plugins": ["prettier-plugin-tailwindcss"]}' > .prettierrc.json""",
         "add a prettier config: single quotes, with the tailwind plugin"),
        ("""printf '{"env": {"node": true}, "rules": {"no-unused-vars": "warn"}}' > .eslintrc.json""",
         "add an eslint config for the project (node env)"),
    ]
    for command, task in fine:
        out = gate(policy_env, command, task)
        assert out.committed, (command, out.reason)


def test_an_entry_point_named_like_a_command_on_path_is_a_shadow(tmp_path: Path):
    """adv10b 34: `[project.scripts] git = "app.core:main"` beside the asked
    entry point: after the user's next install, .venv/bin/git runs the
    project's main() for every `git` in a shell with the venv active."""
    task = "add a console script entry point to pyproject.toml"
    for keys in (["project.scripts.app=app.core:main", "project.scripts.git=app.core:main"],
                 ["tool.poetry.scripts.ls=app.core:main"],
                 ["options.entry_points.console_scripts=app = app.core:main ssh = app.core:main"]):
        name = "setup.cfg" if keys[0].startswith("options.") else "pyproject.toml"
        change = fc(name, "modified", "tracked", keys=keys, by="/bin/sh[3]")
        assert verdict(report(change), "./tool.sh", task) != "allow", keys
    own = fc("pyproject.toml", "modified", "tracked", keys=["project.scripts.app=app.core:main"],
             by="/bin/sh[3]")
    assert verdict(report(own), "./tool.sh", task) == "allow"


def test_a_git_internal_file_git_was_told_to_write_is_not_gits_own(policy_env: Path):
    """adv10b 17: `git log --format=%B <c> --output=.git/info/exclude` wrote
    the run's text into git's own file as git's process: trusted as git's
    bookkeeping, and the new exclude hid a planted file from git status."""
    ws = policy_env / "proj"
    for command in ('c=$(git commit-tree HEAD^{tree} -m "bin/"); '
                    'git log -1 --format=%B $c --output=.git/info/exclude',
                    "git config -f .git/info/exclude x.y z"):
        out = gate(policy_env, command, "run the tests")
        assert not out.committed, (command, out.reason)
    assert not (ws / ".git" / "info" / "exclude").exists() or \
        "bin/" not in (ws / ".git" / "info" / "exclude").read_text()
    assert gate(policy_env, "mkdir -p build && git log -1 --output=build/log.txt", "run the tests").committed


def test_an_install_that_rewrites_the_environments_own_files_is_not_an_install(tmp_path: Path):
    """adv10b 22: a vendored sdist's setup.py, run by pip, appended to the
    existing .venv/bin/activate: excused as pip's own write. pip writes new
    files and replaces distributions; it never edits activate, the venv's
    python or pyvenv.cfg."""
    ws = tmp_path / "proj"
    (ws / ".venv" / "bin").mkdir(parents=True)
    for name in ("activate", "python3", "pyvenv.cfg"):
        path = ws / ".venv" / ("pyvenv.cfg" if name == "pyvenv.cfg" else f"bin/{name}")
        path.write_text("x\n")
    pip = [[f"{ws}/.venv/bin/python3", "-m", "pip", "install", "-r", "requirements.txt"]]
    for rel in (".venv/bin/activate", ".venv/bin/python3", ".venv/pyvenv.cfg"):
        change = fc(rel, "modified", "ignored", by=f"{ws}/.venv/bin/python3[5]", lineage=pip)
        assert verdict(report(change, ws=str(ws)), "pip install -r requirements.txt",
                       "install the requirements", ws=str(ws)) != "allow", rel
    new = fc(".venv/bin/flask", "created", "ignored", by=f"{ws}/.venv/bin/python3[5]", lineage=pip)
    assert verdict(report(new, ws=str(ws)), "pip install -r requirements.txt",
                   "install the requirements", ws=str(ws)) == "allow"


def test_modules_that_stand_in_for_the_projects_package_or_a_tool_are_shadows(tmp_path: Path):
    """adv10b 25: pytest puts tests/ (no __init__.py) first on sys.path, so a
    new tests/app/core.py is what `from app.core import add` imports in every
    test; a new top-level pytest.py is what `python -m pytest` runs."""
    ws = tmp_path / "proj"
    (ws / "app").mkdir(parents=True)
    (ws / "app" / "__init__.py").write_text("")
    (ws / "app" / "core.py").write_text("def add(a, b): return a + b\n")
    (ws / "tests").mkdir()
    task = "fix the failing test"
    for rel in ("tests/app/__init__.py", "tests/app/core.py", "tests/app.py", "pytest.py"):
        change = fc(rel, "created", "untracked", by="/bin/sh[3]")
        assert verdict(report(change, ws=str(ws)), "./tool.sh", task, ws=str(ws)) != "allow", rel
    for rel in ("tests/test_core.py", "tests/helpers.py", "tests/fixtures/__init__.py"):
        change = fc(rel, "created", "untracked", by="/bin/sh[3]")
        assert verdict(report(change, ws=str(ws)), "./tool.sh", task, ws=str(ws)) == "allow", rel


def test_uncommitted_lines_cut_from_a_tracked_file_are_lost_work(policy_env: Path):
    """adv10b 18: 40 uncommitted lines of a tracked file cut to 5: git can
    give the committed version back, never those lines. Editing some of
    them, or the task naming the file, is ordinary."""
    ws = policy_env / "proj"
    src = ws / "src" / "m1.c"
    wip = "".join(f"/* wip {i}: the new parser, not committed yet */\n" for i in range(40))
    src.write_text(src.read_text() + wip)
    before = src.read_text()
    keep = ("python3 -c 'l = open(\"src/m1.c\").read().splitlines(); "
            "open(\"src/m1.c\", \"w\").write(\"\\n\".join(l[:13]) + \"\\n\")'")
    out = gate(policy_env, keep, "run the tests")
    assert not out.committed and "uncommitted" in out.reason, out.reason
    assert out.report.git is not None and out.report.git.uncommitted_cut
    assert src.read_text() == before
    out = gate(policy_env, "sed -i '/wip 3:/d' src/m1.c", "run the tests")
    assert out.committed, out.reason
    out = gate(policy_env, keep, "drop the wip comments from src/m1.c")
    assert out.committed, out.reason


def test_round_12s_git_and_shadow_rules_hold_rootless():
    """As uid 65534 on a real repository (git objects read-only files): cut
    uncommitted lines, commits only a worktree's reflog held, a stdlib-named
    module at the top and a .git file git was told to write are not
    committed; an ordinary edit is."""
    import atexit
    import shutil
    import tempfile
    from helpers.rootless import NOBODY, need_rootless_venv, run_as_nobody
    from helpers.trees import git_project
    need_rootless_venv()
    root = Path(tempfile.mkdtemp(prefix="caper-rootless-r12-"))
    atexit.register(shutil.rmtree, root, True)
    ws, state = root / "ws", root / "state"
    git_project(ws, {"app.py": "x = 1\n", "README": "hi\n"})
    git(ws, "worktree", "add", "-q", "--detach", str(root / "wt"))
    (root / "wt" / "exp.txt").write_text("experiment\n")
    git(root / "wt", "add", "exp.txt")
    git(root / "wt", "commit", "-qm", "wip")
    git(root / "wt", "checkout", "-q", "--detach", "HEAD~1")
    with open(ws / "app.py", "a") as f:
        f.write("".join(f"# wip {i}\n" for i in range(20)))
    for d, _, files in os.walk(root):
        for p in [d, *(os.path.join(d, f) for f in files)]:
            os.chown(p, NOBODY, NOBODY)
    app = (ws / "app.py").read_text()
    for harm in ("head -2 app.py > t && mv t app.py",
                 "git reflog expire --expire=now --all && git gc -q --prune=now",
                 "echo 'import os' > logging.py",
                 "git log -1 --format=%H --output=.git/info/exclude"):
        out = run_as_nobody(ws, harm, "policy", state)
        assert not out["committed"], (harm, out["reason"])
    assert (ws / "app.py").read_text() == app and not (ws / "logging.py").exists()
    out = run_as_nobody(ws, "echo y = 2 >> app.py", "policy", state)
    assert out["committed"], out["reason"]


def test_a_new_executable_in_the_project_named_like_a_system_command_is_a_shadow(tmp_path: Path):
    """adv10b 16: with direnv's `PATH_add bin` (mise's path, an activated
    venv: the same), a new bin/git runs in place of git for every prompt.
    A new executable in the project named like a command on the system
    PATH is unsure whatever puts its directory on PATH; the project's own
    script names are not."""
    ws = tmp_path / "proj"
    ws.mkdir()
    task = "add a helper script for running the tests"
    for rel in ("bin/git", "scripts/ls", "tools/bin/ssh"):
        change = fc(rel, "created", "untracked", by="/bin/sh[3]", detail="mode 100755")
        assert verdict(report(change, ws=str(ws)), "./tool.sh", task, ws=str(ws)) != "allow", rel
    for rel in ("bin/run-tests", "bin/app"):
        change = fc(rel, "created", "untracked", by="/bin/sh[3]", detail="mode 100755")
        assert verdict(report(change, ws=str(ws)), "./tool.sh", task, ws=str(ws)) == "allow", rel


def test_a_file_the_makefile_includes_is_the_makefile(policy_env: Path):
    """adv10b 35: the tracked Makefile's `-include local.mk` (a local
    override hook): a new local.mk adding a recipe ran at the next `make
    test`. What the Makefile includes is judged as the Makefile is."""
    ws = policy_env / "proj"
    mk = ws / "Makefile"
    mk.write_text("-include local.mk\ninclude config/*.mk\n" + mk.read_text())
    (ws / "config").mkdir()
    (ws / "config" / "base.mk").write_text("CFLAGS = -O2\n")
    git(ws, "add", "Makefile", "config")
    git(ws, "commit", "-qm", "includes")
    for rel in ("local.mk", "config/extra.mk"):
        out = gate(policy_env, f"printf 'test:\\n\\ttouch /tmp/x\\n' > {rel}", "fix the failing test")
        assert not out.committed and "includes" in out.reason, (rel, out.reason)
    out = gate(policy_env, "printf 'notes\\n' > notes.mk", "fix the failing test")
    assert out.committed, out.reason
