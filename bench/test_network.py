"""What caper's proxy adds to a `pip install` of a local wheel from an index on
the host's loopback (tests/registry.py): native pip, straight to the index, vs
caper.run with the index's host:port allowed (pip goes through the proxy;
approver allow, so the installed files are committed), or by the name
registry.localhost with the proxy variables unset (caper-route: caper's DNS and
its transparent route). The same pair with pip
reading the wheel from a file (native-file, caper-file: no network) gives the
sandbox's and commit's share, so the rest is the proxy's.

    python3 -m pytest bench/test_network.py --benchmark-columns=min,median,max,rounds
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchlib import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))   # the registry the tests use
from registry import WHEEL, Registry, command_env  # noqa: E402

ROUNDS = max(5, round(15 * float(os.environ.get("CAPER_BENCH_SCALE", "1"))))


@pytest.fixture(scope="module")
def registry(workdir):
    root = os.path.join(workdir, "registry")
    os.mkdir(root)
    with Registry(Path(root)) as r:
        yield r


@pytest.mark.parametrize("variant", ["native", "caper-proxy", "caper-route", "native-file",
                                     "caper-file"])
def test_pip_install(benchmark, workdir, registry, variant):
    import caper

    ws = os.path.join(workdir, f"pip-{variant}")
    home = os.path.join(workdir, f"home-{variant}")
    os.makedirs(ws, exist_ok=True)
    os.makedirs(home, exist_ok=True)
    wheel = os.path.join(ws, WHEEL)
    with open(wheel, "wb") as f:
        f.write(registry.wheel)
    env = command_env(home)
    named = f"registry.localhost:{registry.port}"
    source = (wheel if variant.endswith("-file") else
              f"--trusted-host registry.localhost --index-url http://{named}/simple/ demo-pkg"
              if variant == "caper-route" else
              f"--index-url http://{registry.host}/simple/ demo-pkg")
    cmd = f"{sys.executable} -m pip install -q --target vendor {source}"
    if variant == "caper-route":
        cmd = "env -u http_proxy -u https_proxy -u all_proxy -u HTTP_PROXY -u HTTPS_PROXY " \
              "-u ALL_PROXY " + cmd
    benchmark.group = "pip-install-local-wheel"

    def reset() -> None:
        shutil.rmtree(os.path.join(ws, "vendor"), ignore_errors=True)

    def native() -> None:
        subprocess.run(cmd, shell=True, cwd=ws, env=env, check=True, capture_output=True)

    def through_caper() -> None:
        out = caper.run(cmd, cwd=ws, workspace=ws, approver="allow", env=env,
                        state_dir=os.path.join(workdir, "caper-state"),
                        allow_net=[registry.host] if variant == "caper-proxy" else
                        [named] if variant == "caper-route" else ())
        assert out.exit_code == 0 and out.committed, out.stderr.text()[-500:]

    benchmark.pedantic(native if variant.startswith("native") else through_caper, setup=reset,
                       rounds=ROUNDS, warmup_rounds=1)
    assert os.path.exists(os.path.join(ws, "vendor", "demo_pkg", "__init__.py"))
