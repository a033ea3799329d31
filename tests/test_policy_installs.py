"""Code written into a project's virtualenv or node_modules: a package
manager's own job there, anyone else's persistence. Real runs of the policy
approver on a real virtualenv and a real `pip install` of a local package:
who wrote a file is what the tracer saw (the writer's process and its
ancestors), never what the command names."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from caper.transaction import run
from helpers.trees import git_project

TASK = "run the tests"
SITE = f".venv/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
SYSTEM_PY = "/usr/bin/python3"
PKG_SETUP = "from setuptools import setup\nsetup(name='tinypkg', version='1.0', py_modules=['tinypkg'])\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A git project with an ignored .venv (pip and setuptools in it) and a
    local package to install."""
    if sys.version_info[:2] != tuple(map(int, subprocess.run(
            [SYSTEM_PY, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
            text=True, check=True).stdout.split())):
        pytest.skip("the system python is another version than the tests'")
    ws = tmp_path_factory.mktemp("installs") / "proj"
    git_project(ws, {"README": "hi\n", ".gitignore": ".venv/\n", "pkg/setup.py": PKG_SETUP,
                     "pkg/tinypkg.py": "ANSWER = 42\n"})
    subprocess.run([SYSTEM_PY, "-m", "venv", str(ws / ".venv")], check=True)
    return ws


def _run(ws: Path, tmp_path: Path, command: str, task: str = TASK):
    return run(command, cwd=str(ws), workspace=str(ws), approver="policy", task=task,
               state_dir=str(tmp_path / "state"), env={**os.environ, "HOME": str(tmp_path)},
               timeout=120)


ENTRY_POINT = (f"mkdir -p {SITE}/evil-1.0.dist-info && printf '[pytest11]\\nevil = evil\\n' "
               f"> {SITE}/evil-1.0.dist-info/entry_points.txt")
PLANT_GIT = "printf '#!/bin/sh\\necho planted\\n' > .venv/bin/git && chmod +x .venv/bin/git"


@pytest.mark.parametrize("command", [
    ENTRY_POINT,                                                 # a plugin pytest loads
    "pip --version >/dev/null; " + PLANT_GIT,                    # naming pip licenses nothing
    "python3 -c \"open('.venv/bin/git', 'w').write('#!/bin/sh\\n')\"",
    # argv[0] says pip, the program is python
    "bash -c 'exec -a pip python3 -c \"open(\\\".venv/bin/git\\\", \\\"w\\\").write(\\\"x\\\")\"'",
    # a script named pip that the run wrote itself
    "printf \"open('.venv/bin/git', 'w').write('x')\\n\" > /tmp/pip && python3 /tmp/pip",
    f"printf 'import os\\n' > {SITE}/zz_planted.py",
], ids=["entry-point", "pip-named", "python-c", "argv0-pip", "script-named-pip", "module"])
def test_code_planted_in_the_projects_virtualenv_by_no_installer_is_not_committed(
        project, tmp_path, command):
    """Round 7: files created in the ignored .venv were an installer's new
    entries whoever wrote them, and a command naming pip made every write
    there pip's: printf and `python -c` planted a pytest plugin and a `git`
    ahead of the real one on the venv's PATH, and the policy committed them."""
    before = sorted(p.relative_to(project) for p in (project / ".venv").rglob("*"))
    out = _run(project, tmp_path, command)
    assert any(c.path.startswith(".venv/") and c.op == "created"
               for c in out.report.all_changes), out.report.card()     # it did plant
    assert not out.committed, (command, out.reason)
    assert sorted(p.relative_to(project) for p in (project / ".venv").rglob("*")) == before
    assert not (project / ".venv" / "bin" / "git").exists()


def test_pip_installing_a_package_into_the_virtualenv_is_committed(project, tmp_path):
    """The twin: pip itself (and the build it runs) writes the package, its
    metadata and bytecode into the venv; the task asks to install it."""
    out = _run(project, tmp_path, ".venv/bin/python -m pip install -q --no-index "
               "--no-build-isolation ./pkg", task="install the package in pkg into the venv")
    assert out.committed, out.reason
    got = subprocess.run([str(project / ".venv/bin/python"), "-c",
                          "import tinypkg; print(tinypkg.ANSWER)"], capture_output=True,
                         text=True, cwd="/")
    assert got.stdout.strip() == "42", got.stderr


# --- round 8 (adv8b): who counts as the package manager -----------------------------------

def test_a_package_managers_descendant_counts_only_while_it_installs():
    """adv8b 01, 14: with any ancestor a package manager, `npm test` or
    `npm exec -c` planted a pytest plugin, and a build.rs under `cargo build`
    wrote into the user's site-packages. Its install subcommands' scripts
    count in the project only; elsewhere, and for any other subcommand, only
    the package manager's own process."""
    from helpers.policy import WS, fc, report, verdict
    site = f"{WS}/{SITE}/evil-1.0.dist-info/entry_points.txt"
    by = lambda *chain: fc(site, where="ignored", lineage=[list(x) for x in chain])
    sh = ("/bin/sh", "-c", "./plant.sh")
    npm = lambda verb: ("/usr/bin/node", "/usr/bin/npm", verb)
    assert verdict(report(by(sh, npm("install"))), "npm install", "install") == "allow"
    for verb in ("test", "exec", "run"):
        assert verdict(report(by(sh, npm(verb))), f"npm {verb}", "install") == "block", verb
    # npm's own process counts only at an installing subcommand too: code
    # can run inside it (adv9 03: PYTHONPATH's sitecustomize in `pip --version`)
    assert verdict(report(by(npm("exec"))), "npm exec", "install") == "block"
    assert verdict(report(by(npm("install"))), "npm install", "install") == "allow"
    # the subcommand is the word right after the program (adv9 01)
    tricked = ("/usr/bin/node", "/usr/bin/npm", "--userconfig", "install", "exec", "-c")
    assert verdict(report(by(sh, tricked)), "npm exec", "install") == "block"
    # a package file the run made itself is the run's code (adv9 02)
    wheel = [["/usr/bin/python3", "-m", "pip", "install", "--no-index", "/tmp/w/zz-1.0.whl"]]
    made = fc(site, where="ignored", lineage=wheel)
    assert verdict(report(made), "pip install /tmp/w/zz-1.0.whl", "install") == "block"
    user = "/home/u/.local/lib/python3.11/site-packages/evil-1.0.dist-info/entry_points.txt"
    build_rs = fc(user, where="home", lineage=[["/w/proj/target/debug/build/x/build-script-build"],
                                               ["/usr/bin/cargo", "build"]])
    assert verdict(report(build_rs), "cargo build", "build it") == "block"
    pip_user = fc(user, where="home", lineage=[["/usr/bin/python3", "-m", "pip", "install"]])
    assert verdict(report(pip_user), "pip install --user x", "install x") == "allow"


def test_a_package_managers_name_in_the_project_is_no_package_manager():
    """adv8b 18: a two-line `tools/pip` an earlier approved run wrote counted
    as pip (`python3 tools/pip plant.sh`). In the project only its own
    environments' programs count (`.venv/bin/pip`); a `pip.py` in the
    project is what `python -m pip` would import first."""
    from helpers.policy import WS, fc, report, verdict
    site = f"{SITE}/evil.pth"
    for chain in ([["/usr/bin/python3", f"{WS}/tools/pip", "install"]],
                  [[f"{WS}/tools/pip", "install"]]):
        assert verdict(report(fc(site, where="ignored", lineage=chain)), "python3 tools/pip",
                       "install") == "block", chain
    venv_pip = [[f"{WS}/.venv/bin/python", f"{WS}/.venv/bin/pip", "install", "-e", "."]]
    assert verdict(report(fc(site, where="ignored", lineage=venv_pip)), ".venv/bin/pip install -e .",
                   "install") == "allow"


def test_the_projects_environment_swapped_for_a_link_out_is_persistence():
    """adv8b 13: .venv and node_modules replaced by symlinks into a /var/tmp
    directory the run filled: what the project's tools run comes from there."""
    from helpers.policy import fc, report, verdict
    for name in (".venv", "node_modules"):
        link = fc(name, "replaced", "ignored", type="symlink", detail="-> /var/tmp/v")
        assert verdict(report(link), "./setup.sh", "set up the project") == "block", name
    # a venv's own python, a link to the interpreter, is no such swap
    py = fc(".venv/bin/python", "created", "ignored", type="symlink", detail="-> /usr/bin/python3",
            lineage=[["/usr/bin/python3", "-m", "venv", ".venv"]])
    assert verdict(report(py), "python3 -m venv .venv", "set up the project") == "allow"


def test_a_virtualenv_is_known_by_its_pyvenv_cfg_whatever_its_name(tmp_path):
    """adv9 08: a venv named `pyenv311/` was no environment to the policy: a
    new bin/git wrapper in it was committed and ran once the venv was
    activated."""
    from helpers.policy import fc, report, verdict
    ws = tmp_path / "proj"
    (ws / "pyenv311" / "bin").mkdir(parents=True)
    (ws / "pyenv311" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    git = fc("pyenv311/bin/git", "created", "ignored", by="/bin/sh[3]")
    assert verdict(report(git, ws=str(ws)), "./tool.sh", TASK, ws=str(ws)) == "block"
    plain = fc("tools/bin/helper", "created", "untracked", by="/bin/sh[3]")
    assert verdict(report(plain, ws=str(ws)), "./tool.sh", TASK, ws=str(ws)) == "allow"


@pytest.mark.parametrize("alias", [
    f"echo 'import os' >> .venv/lib64/python{sys.version_info.major}.{sys.version_info.minor}"
    "/site-packages/tinypkg.py",
    f"ln {SITE}/tinypkg.py /tmp/caper-alias-$$ && echo 'import os' >> /tmp/caper-alias-$$ && "
    "rm /tmp/caper-alias-$$",
    f"ln -s $PWD/{SITE} /tmp/caper-sp-$$ && echo 'import os' >> /tmp/caper-sp-$$/tinypkg.py && "
    "rm /tmp/caper-sp-$$"], ids=["lib64-symlink", "hard-link", "symlink-the-run-made"])
def test_a_write_through_another_name_is_the_writers_not_the_installers(project, tmp_path, alias):
    """adv9 05: the file pip had just installed, appended to through the
    venv's lib64 -> lib link or a hard link made in /tmp, kept pip as its
    writer, and the trojaned module was committed."""
    out = _run(project, tmp_path, ".venv/bin/python -m pip install -q --no-index "
               "--no-build-isolation --force-reinstall ./pkg && " + alias,
               task="install the package in pkg into the venv")
    assert not out.committed, out.reason
    assert "import os" not in (project / SITE / "tinypkg.py").read_text()


# --- round 9 (adv9 02/03/06) and adv8b 19: the environment the command gives a tool -------

SITECUSTOMIZE = "import os\nif os.path.isdir('.venv/bin'): open('.venv/bin/git', 'w').write('x')\n"


@pytest.mark.parametrize("steer", ["assignment", "export"])
def test_a_package_manager_given_code_by_the_commands_environment_is_the_commands(
        project, tmp_path, steer):
    """adv9 03: `PYTHONPATH=/tmp/x pip install ./pkg` ran a sitecustomize.py
    inside the real pip, which planted `.venv/bin/git`; the write was pip's
    and was committed. The tracer marks each exec whose environment holds a
    code-loading variable the command set, and such a package manager is no
    package manager."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "sitecustomize.py").write_text(SITECUSTOMIZE)
    pip = ".venv/bin/python -m pip install -q --no-index --no-build-isolation --force-reinstall ./pkg"
    command = f"PYTHONPATH={lib} {pip}" if steer == "assignment" else f"export PYTHONPATH={lib}; {pip}"
    out = _run(project, tmp_path, command, task="install the package in pkg into the venv")
    git = next((c for c in out.report.all_changes if c.path == ".venv/bin/git"), None)
    assert git is not None, out.report.card()                     # the plant ran inside pip
    assert not out.committed, out.reason
    assert not (project / ".venv" / "bin" / "git").exists()


def test_a_code_loading_variable_the_user_already_had_changes_nothing(project, tmp_path):
    """The twin: PYTHONPATH in the user's own environment (caper gives it to
    the command) is no command's doing; pip's install commits."""
    empty = tmp_path / "pylib"
    empty.mkdir()
    out = run(".venv/bin/python -m pip install -q --no-index --no-build-isolation "
              "--force-reinstall ./pkg", cwd=str(project), workspace=str(project),
              approver="policy", task="install the package in pkg into the venv",
              state_dir=str(tmp_path / "state"),
              env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(empty)}, timeout=120)
    assert out.committed, out.reason


def test_the_tracer_marks_execs_given_code_loading_variables(tmp_path):
    """CODE_ENV on an exec: set by the command (an assignment, an export, a
    changed value), not for one caper gave it unchanged, nor for one unset."""
    from caper.sandbox.events import Info, Kind
    from caper.sandbox.trace import trace
    script = ("LD_PRELOAD=/x.so /bin/true a; export GIT_SSH_COMMAND=x; /bin/true b; unset "
              "GIT_SSH_COMMAND; /bin/true c; PYTHONPATH=$PYTHONPATH /bin/true d; "
              "PYTHONPATH=/y /bin/true e; env -u PYTHONPATH /bin/true f; "
              # where pip finds its pip.conf, npm its .npmrc (adv11b 01)
              "XDG_CONFIG_HOME=/tmp/c /bin/true g; HOME=/tmp/h /bin/true h")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/given", "HOME": "/root"}
    got = {e.argv[1]: bool(e.info & Info.CODE_ENV) for e in trace(["/bin/sh", "-c", script],
                                                                 env=env, cwd=str(tmp_path))
           if e.kind == Kind.EXEC and e.ok and e.argv and e.argv[0] == "/bin/true"}
    assert got == {"a": True, "b": True, "c": False, "d": False, "e": True, "f": False,
                   "g": True, "h": True}


def test_the_tracer_knows_the_less_common_ways_a_variable_loads_code(tmp_path):
    """Each of these makes a later program import, run or trust code the
    command chose: a warnings category is imported, a runtime runs a start-up
    hook, OpenSSL loads an engine, git and less run a command, a CA bundle
    makes a fake index trusted."""
    from caper.sandbox.events import Info, Kind
    from caper.sandbox.trace import trace
    names = ["PYTHONWARNINGS=error::evil.W", "PYTHONBREAKPOINT=evil.bp", "LUA_INIT=@x.lua",
             "DOTNET_STARTUP_HOOKS=/x.dll", "CORECLR_PROFILER_PATH=/x.so",
             "OPENSSL_CONF=/x.cnf", "GIT_EDITOR=./x", "GIT_PAGER=./x", "EDITOR=./x",
             "LESSOPEN=|./x %s", "ZDOTDIR=/x", "PHPRC=/x", "ERL_FLAGS=-s x",
             "REQUESTS_CA_BUNDLE=/x.pem", "SSL_CERT_FILE=/x.pem", "NODE_EXTRA_CA_CERTS=/x",
             "PLAIN_VALUE=1"]
    script = "; ".join(f"{n.split('=')[0]}='{n.split('=', 1)[1]}' /bin/true {k}"
                       for k, n in enumerate(names))
    got = [bool(e.info & Info.CODE_ENV) for e in trace(["/bin/sh", "-c", script],
                                                      env={"PATH": "/usr/bin:/bin"},
                                                      cwd=str(tmp_path))
           if e.kind == Kind.EXEC and e.ok and e.argv and e.argv[0] == "/bin/true"]
    assert got == [True] * (len(names) - 1) + [False]


def test_a_steered_build_tool_or_installer_licenses_nothing():
    """adv8b 19: `LD_PRELOAD=./x.so make` wrote built code as make; adv9 06:
    GIT_SSH_COMMAND under `pip install -r` ran the command's script as pip's
    descendant. What counts is who put the variable there: the command's
    shell (or env, or python -c), not a tool for its own children (pip's
    build environment, git's GIT_EXEC_PATH)."""
    from helpers.policy import WS, fc, report, verdict
    site = f"{WS}/{SITE}/evil-1.0.dist-info/entry_points.txt"
    pip = ["/usr/bin/python3", "-m", "pip", "install", "-r", "requirements.txt"]
    ssh = ["/bin/sh", "-c", "./plant.sh"]
    shell = ["/bin/sh", "-c", "GIT_SSH_COMMAND=./plant.sh pip install -r requirements.txt"]
    line = [ssh, ["/usr/bin/git"], pip]
    assert verdict(report(fc(site, where="ignored", lineage=line)), "pip install", "install") \
        == "allow"
    for by in (shell, ["/usr/bin/env", "GIT_SSH_COMMAND=./plant.sh", "pip"],
               ["/usr/bin/python3", "-c", "import os"], ["/tmp/x/setenv"]):
        assert verdict(report(fc(site, where="ignored", lineage=line, steered={2: by})),
                       "pip install -r requirements.txt", "install") == "block", by
    nested = [["/usr/bin/python3", "-m", "pip", "install", "setuptools"], pip]
    assert verdict(report(fc(site, where="ignored", lineage=nested, steered={0: pip})),
                   "pip install -r requirements.txt", "install") == "allow"
    cc = lambda **kw: fc("target/debug/app", "modified", "ignored", by="/usr/bin/ld[9]",
                         lineage=[["/usr/bin/ld"], ["/usr/bin/make"], ["/bin/sh", "-c", "make"]],
                         **kw)
    assert verdict(report(cc()), "make", "build it") == "allow"
    stdbuf = ["/usr/bin/stdbuf", "-oL", "make"]          # LD_PRELOAD of its own library
    assert verdict(report(cc(steered={1: stdbuf})), "stdbuf -oL make", "build it") == "allow"
    # a program not known to set them for itself sets what it is told (adv11b 02:
    # make --eval 'export PIP_INDEX_URL=...')
    for steered in ({1: shell}, {0: stdbuf, 1: shell}, {0: ["/usr/bin/make", "--eval", "export"]}):
        assert verdict(report(cc(steered=steered)), "LD_PRELOAD=./x.so make", "build it") \
            != "allow", steered


@pytest.mark.parametrize("words", [["--find-links=/tmp/w", "tinypkg"], ["-f/tmp/w", "tinypkg"],
                                   ["--index-url", "file:///tmp/w", "tinypkg"]])
def test_packages_from_a_directory_the_run_made_are_the_runs_by_any_spelling(words):
    """adv9 02: the wheel the run built in /tmp, installed by its name with
    the directory given as an option's value or a file:// index."""
    from helpers.policy import WS, fc, report, verdict
    site = f"{WS}/{SITE}/evil-1.0.dist-info/entry_points.txt"
    line = [["/usr/bin/python3", "-m", "pip", "install", "--no-index", *words]]
    assert verdict(report(fc(site, where="ignored", lineage=line)), "pip install", "install") \
        == "block", words
    named = [["/usr/bin/python3", "-m", "pip", "install", "--no-index", "tinypkg"]]
    assert verdict(report(fc(site, where="ignored", lineage=named)), "pip install", "install") \
        == "allow"


def test_a_package_the_run_wrote_or_pointed_at_is_the_runs():
    """adv11b 03, 04, 05: `pip install -e .` of a setup.py the run wrote, a
    requirements file the run wrote, `--find-links .` with a wheel the run
    dropped there: the install is the run's code."""
    import tempfile
    from helpers.policy import fc, report, verdict
    ws = tempfile.mkdtemp()
    open(os.path.join(ws, "setup.py"), "w").close()
    site = f"{ws}/{SITE}/evil.pth"
    pip = lambda *words: [["/usr/bin/python3", "-m", "pip", "install", *words]]
    for made, words in (("setup.py", ["-e", "."]), ("dev-deps.txt", ["-r", "dev-deps.txt"]),
                        ("x-1.0-py3-none-any.whl", ["--find-links", ".", "x"])):
        r = report(fc(site, where="ignored", lineage=pip(*words)), fc(made, "created", "untracked"),
                   ws=ws)
        assert verdict(r, "pip install", "install", ws=ws) == "block", made
    r = report(fc(site, where="ignored", lineage=pip("-e", ".")), ws=ws)
    assert verdict(r, "pip install -e .", "install", ws=ws) == "allow"
