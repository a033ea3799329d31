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
