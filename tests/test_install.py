"""`pip install .` as a Python user does it: a wheel built from a copy of this
checkout (with build isolation, as pip does by default), installed in a
clean virtualenv, and caper run from there, away from the checkout.

pip reuses its cache of the dependencies' wheels; the first run on a
machine downloads them. ~15 s once cached."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Nothing of the checkout's may leak into the clean venv's view.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _pip(*args: str, cwd: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                       cwd=cwd, env=CLEAN_ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtualenv holding only the wheel and its dependencies."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    # Not the agents' npm tree (.cache, ~0.8 GB) nor anything built here.
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "build", "*.egg-info", "__pycache__", "*.so", "*.o",
        "_caper.c", "caper-client*", ".hypothesis", ".benchmarks", ".pytest_cache"))
    _pip("wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(src), cwd=base)
    [wheel] = (base / "dist").glob("caper-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")],
                   env=CLEAN_ENV, check=True, timeout=120)
    _pip("--python", str(base / "venv" / "bin" / "python"), "install", "-q", str(wheel),
         cwd=base)
    return base / "venv"


def _caper(venv: Path, *args: str, stdin: str = "", path: str | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess:
    env = {"PATH": path if path is not None else f"{venv / 'bin'}:/usr/bin:/bin",
           "HOME": str(venv.parent), "CAPER_NO_GATE": "1"}
    return subprocess.run([str(venv / "bin" / "caper"), *args], input=stdin, env=env,
                          cwd=venv.parent, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_wheel_holds_every_package_and_the_native_core(venv):
    py = subprocess.run([str(venv / "bin" / "python"), "-c",
                         "import caper, caper.front.hooks, caper_native._caper, "
                         "importlib.resources as r; print(caper.__file__); "
                         "print(r.files('caper').joinpath('data/policy.toml').is_file())"],
                        cwd=venv.parent, env=CLEAN_ENV, capture_output=True, text=True,
                        timeout=60)
    assert py.returncode == 0, py.stderr
    where, data = py.stdout.split()
    assert where.startswith(str(venv)) and data == "True"     # not the checkout's copy
    p = _caper(venv, "--version")
    assert p.returncode == 0 and p.stdout.startswith("caper 0.")


PLANTS = {"caper/__init__.py": "open('PLANTED', 'w').write('caper')\n",
          "sitecustomize.py": "open('PLANTED', 'w').write('sitecustomize')\n",
          "startup.py": "open('PLANTED', 'w').write('startup')\n"}


@pytest.mark.slow
def test_the_caper_command_imports_nothing_from_the_workspace(venv, tmp_path):
    """A caper/ package or sitecustomize.py a run left in the workspace is not
    imported by the installed `caper` command, whatever the user's shell sets
    (PYTHONPATH=., PYTHONSTARTUP, PYTHONSAFEPATH unset); through a symlink to
    it (pipx, ~/bin) too. Until round 3 pip's generated console script started
    Python without -E: `PYTHONPATH=. caper commit ID` in the workspace ran the
    planted package on the host."""
    ws = tmp_path / "ws"
    for name, text in PLANTS.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    link = tmp_path / "bin" / "caper"
    link.parent.mkdir()
    link.symlink_to(venv / "bin" / "caper")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CAPER_NO_GATE": "1",
           "PYTHONPATH": ".", "PYTHONSTARTUP": str(ws / "startup.py"), "PYTHONINSPECT": ""}
    for command in (venv / "bin" / "caper", link):
        p = subprocess.run([str(command), "--version"], env=env, cwd=ws, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.startswith("caper 0."), p.stderr
        assert not (ws / "PLANTED").exists(), (ws / "PLANTED").read_text()


@pytest.mark.slow
def test_a_hook_given_bad_input_denies_cleanly(venv):
    p = _caper(venv, "hook", "claude-code", stdin="{not json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    out = json.loads(p.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny" and "not run" in out["permissionDecisionReason"]


@pytest.mark.slow
def test_mcp_without_its_extra_is_one_line_and_with_it_starts(venv):
    p = _caper(venv, "mcp", stdin="")
    assert p.returncode == 1 and p.stdout == "", p.stdout
    assert len(p.stderr.splitlines()) == 1 and "pip install 'caper[mcp]'" in p.stderr, p.stderr
    _pip("--python", str(venv / "bin" / "python"), "install", "-q", "mcp>=2,<3", cwd=venv.parent)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "test", "version": "0"}}}
    p = _caper(venv, "mcp", stdin=json.dumps(hello) + "\n")   # end of input: the server stops
    assert p.returncode == 0, p.stderr
    answer = json.loads(p.stdout.splitlines()[0])
    assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "caper"


@pytest.mark.slow
def test_demo_runs_from_the_wheel_and_says_what_it_lacks(venv):
    p = _caper(venv, "demo", timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "B: build/app rebuilt, prints: 2 + 3 = 5" in p.stdout
    p = _caper(venv, "demo", path=str(venv / "bin"))          # no git, make or cc
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [p.stderr.strip()] and "git, make, cc" in p.stderr


def test_ci_runs_the_readmes_test_command_exactly():
    readme = (ROOT / "README.md").read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    setup, tests = readme.splitlines()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == tests and setup.startswith("./bootstrap && ")


def test_install_keeps_a_private_settings_files_mode(tmp_path, monkeypatch):
    """~/.claude/settings.json kept 0600 for the tokens in its env block
    stays 0600 through install and uninstall (before: 0644, readable by
    every local user)."""
    from caper.front import hooks
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"env": {"GITHUB_TOKEN": "ghp_x"}}')
    settings.chmod(0o600)
    hooks.install("claude-code", "user")
    assert settings.stat().st_mode & 0o777 == 0o600
    hooks.uninstall("claude-code", "user")
    assert settings.stat().st_mode & 0o777 == 0o600


def test_install_does_not_follow_a_repositorys_symlinked_settings(tmp_path):
    """A repository's .claude/settings.json that links to a file of the
    user's is refused, not read and copied into the project."""
    from caper.front import hooks
    secret = tmp_path / "docker-config.json"
    secret.write_text('{"auths": {"x": {"auth": "c2VjcmV0"}}}')
    (tmp_path / "proj" / ".claude").mkdir(parents=True)
    (tmp_path / "proj" / ".claude" / "settings.json").symlink_to(secret)
    with pytest.raises(ValueError, match="symlink"):
        hooks.install("claude-code", "project", cwd=str(tmp_path / "proj"))
    assert (tmp_path / "proj" / ".claude" / "settings.json").is_symlink()
