"""Round 13 (adv13b): build variables that steer an installer's compiler,
an index on the sandbox's own loopback, build backends and test settings
that load the project's hidden code, data rewritten in place where no diff
can show it, and sources the run hid in ignored directories. Real runs
where the report's facts are the point; hand reports where it is a rule's."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.policy import HOME, fc, report, verdict

PIP = [["/w/proj/.venv/bin/python3", "/w/proj/.venv/bin/pip", "install", "."]]
PTH = "/w/proj/.venv/lib/python3.11/site-packages/x.pth"


def test_the_tracer_marks_build_variables_an_installer_hands_its_compiler():
    """adv13b 01: `CC="/bin/sh -c '<plant a .pth>; exec gcc' cc" pip install .`:
    setuptools ran $CC, pip was not steered, the .pth was pip's own."""
    from caper.sandbox.events import Info, Kind
    from caper.sandbox.trace import trace
    names = ["CC=x", "CXX=x", "LDSHARED=x", "CFLAGS=-wrapper x", "LDFLAGS=-fplugin=x",
             "PYTEST_ADDOPTS=-p x", "PYTEST_PLUGINS=x", "DIST_EXTRA_CONFIG=x",
             "_PYTHON_SYSCONFIGDATA_NAME=x", "CMAKE_C_COMPILER_LAUNCHER=x", "CGO_CFLAGS=x",
             "PLAIN_VALUE=1"]
    script = "; ".join(f"{n.split('=')[0]}='{n.split('=', 1)[1]}' /bin/true {k}"
                       for k, n in enumerate(names))
    got = [bool(e.info & Info.CODE_ENV) for e in trace(["/bin/sh", "-c", script],
                                                      env={"PATH": "/usr/bin:/bin"}, cwd="/")
           if e.kind == Kind.EXEC and e.ok and e.argv and e.argv[0] == "/bin/true"]
    assert got == [True] * (len(names) - 1) + [False]


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/", "http://localhost:9/simple",
                                 "http://[::1]:8080/", "http://0.0.0.0:1/",
                                 # adv13b 13: the resolver's other spellings
                                 "http://2130706433:80/", "http://0x7f000001/",
                                 "http://0177.0.0.1/", "http://[::ffff:127.0.0.1]:8/",
                                 "http://localhost.:8/", "http://u:p@127.1/x"])
def test_an_index_on_the_sandboxs_own_loopback_is_the_runs(url):
    """adv13b 09: the run served its own wheel with `python3 -m http.server`
    and installed it with `--find-links http://127.0.0.1:PORT/`: the
    sandbox's loopback is its own, whatever listens there is the run's."""
    line = [["/w/proj/.venv/bin/python3", "/w/proj/.venv/bin/pip", "install", "--no-index",
             "--find-links", url, "fastjson-speedups"]]
    change = fc(PTH, where="ignored", by="/w/proj/.venv/bin/python3[9]", lineage=line)
    assert verdict(report(change), "pip install", "install fastjson-speedups") == "block"
    registry = [["/w/proj/.venv/bin/python3", "/w/proj/.venv/bin/pip", "install",
                 "--index-url", "https://pypi.org/simple", "fastjson-speedups"]]
    change = fc(PTH, where="ignored", by="/w/proj/.venv/bin/python3[9]", lineage=registry)
    assert verdict(report(change), "pip install", "install fastjson-speedups") == "allow"


def test_build_and_test_settings_that_load_the_projects_code_are_tool_code():
    """adv13b 03, 04, 08: a pyproject build backend from backend-path,
    hatch's custom hooks, pytest's filterwarnings naming a category in the
    project, jest's reporters: each loads a module the run may have hidden
    in build/ or node_modules/.cache."""
    ws = "/w/proj"
    harms = [("pyproject.toml", ["build-system.backend-path=['build/_backend']",
                                 "build-system.build-backend=setuptools_shim"]),
             ("pyproject.toml", ["tool.hatch.build.hooks.custom.path=hatch_build.py"]),
             ("pyproject.toml", ["tool.pytest.ini_options.filterwarnings="
                                 "['ignore::build.warncompat.LegacyWarning']"]),
             ("package.json", ["jest.reporters=['default', './node_modules/.cache/jest/r.js']"]),
             ("package.json", ["jest.testrunner=./tools/runner.js"])]
    hidden = fc("build/warncompat.py", "created", "ignored", by="/bin/sh[3]")
    for name, keys in harms:
        change = fc(name, "modified", "tracked", keys=keys, by="/bin/sh[3]")
        assert verdict(report(change, hidden), "./tool.sh", "configure the tools", ws=ws) \
            != "allow", keys
    fine = [("pyproject.toml", ["tool.pytest.ini_options.filterwarnings="
                                "['ignore::DeprecationWarning', 'ignore::pytest.PytestWarning']"]),
            ("pyproject.toml", ["build-system.build-backend=setuptools.build_meta"]),
            ("package.json", ["jest.reporters=['default', 'jest-junit']"])]
    for name, keys in fine:
        change = fc(name, "modified", "tracked", keys=keys, by="/bin/sh[3]")
        assert verdict(report(change, hidden), "./tool.sh", "configure the tools", ws=ws) \
            == "allow", keys


def test_lint_stageds_own_config_files_are_hook_configuration():
    """adv13b 02: husky runs `npx lint-staged`, which runs the commands its
    .lintstagedrc.json names at every `git commit`."""
    for name in (".lintstagedrc.json", ".lintstagedrc", "lint-staged.config.js"):
        change = fc(name, "modified", "tracked", by="/bin/sh[3]")
        assert verdict(report(change), "./tool.sh", "format the TypeScript files") != "allow", name


def test_more_stores_a_tool_picks_by_key_take_only_its_own_writes():
    """adv13b 07: a shell's hubconf.py in torch.hub's repository cache was
    imported by the next torch.hub.load; Hugging Face's modules likewise."""
    for rel in (".cache/torch/hub/pytorch_vision_main/hubconf.py",
                ".cache/huggingface/modules/transformers_modules/m/modeling.py"):
        planted = fc(f"{HOME}/{rel}", where="cache", by="/bin/sh[4]",
                     lineage=[["/bin/sh", "-c", "printf x > f"]])
        assert verdict(report(planted), "./tool.sh", "fix the inference script") != "allow", rel


def test_data_rewritten_in_place_where_no_diff_shows_it_is_not_routine(tmp_path: Path):
    """adv13b 05: `dd conv=notrunc` zeroed an ignored 200 KB dataset and `sed`
    wiped every balance of a 637 KB CSV: same sizes, no line diff (binary,
    too large), committed. A change the report cannot compare, to a file git
    cannot give back, is unsure unless the task names it."""
    ws = tmp_path / "proj"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "train.parquet").write_bytes(b"PAR1" + os.urandom(1000))
    for rel in ("data/train.parquet",):
        change = fc(rel, "modified", "ignored", by="/usr/bin/dd[4]", uncompared=True)
        assert verdict(report(change, ws=str(ws)), "./tool.sh", "add a smoke test",
                       ws=str(ws)) != "allow"
        assert verdict(report(change, ws=str(ws)), "./tool.sh",
                       "wipe data/train.parquet and write it again", ws=str(ws)) == "allow"


def test_a_source_the_run_hid_in_an_ignored_directory_builds_nothing(policy_env: Path):
    """adv13b 06: `gcc -o bin/devserver src/main.c build/gen/version.c` with a
    version.c the run wrote in ignored build/: the linker's output passed as
    a build of the project's files."""
    import subprocess
    from helpers.policy import gate
    ws = policy_env / "proj"
    (ws / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    (ws / "build").mkdir()
    subprocess.run(["cc", "-o", str(ws / "build" / "app"), str(ws / "src" / "main.c")], check=True)
    out = gate(policy_env, "mkdir -p build/gen && printf 'void v(void) {}\\n' > build/gen/v.c && "
               "cc -o build/app src/main.c build/gen/v.c", "rebuild the app with the version")
    assert not out.committed, out.reason
    out = gate(policy_env, "cc -O2 -o build/app src/main.c", "rebuild the app")
    assert out.committed, out.reason
    # objects a compiler made from the project's files, linked: a build
    out = gate(policy_env, "cc -c -o build/m.o src/main.c && cc -o build/app build/m.o",
               "rebuild the app")
    assert out.committed, out.reason
    out = gate(policy_env, "printf 'int main(void){return 7;}\\n' > build/x.c && "
               "cc -c -o build/x.o build/x.c && rm build/x.c && cc -o build/app build/x.o",
               "rebuild the app")
    assert not out.committed, out.reason


def test_round_13s_second_wave(tmp_path: Path):
    """adv13b 15: `tool.setuptools.dynamic.version = {attr = ...}` (setup.cfg's
    `attr:`) makes the next build import that module; adv13b 19: the run's
    sdist as .tar.bz2 in a --find-links dir is the run's package."""
    ws = tmp_path / "proj"
    (ws / "vendor").mkdir(parents=True)
    for name, keys in (("pyproject.toml", ["tool.setuptools.dynamic.version.attr=build.ver.v"]),
                       ("setup.cfg", ["metadata.version=attr: build.ver.v"])):
        change = fc(name, "modified", "tracked", keys=keys, by="/bin/sh[3]")
        task = f"derive the package version from git describe in {name}"
        assert verdict(report(change, ws=str(ws)), "./tool.sh", task, ws=str(ws)) != "allow", keys
        plain = fc(name, "modified", "tracked", keys=["project.version=1.1"], by="/bin/sh[3]")
        assert verdict(report(plain, ws=str(ws)), "./tool.sh", task, ws=str(ws)) == "allow", keys
    pip = f"{ws}/.venv/bin/python3"
    line = [[pip, f"{ws}/.venv/bin/pip", "install", "--no-index", "--find-links",
             f"{ws}/vendor", "speedups"]]
    made = fc("vendor/speedups-1.0.tar.bz2", "created", "untracked", by="/bin/sh[3]")
    pth = fc(f"{ws}/.venv/lib/python3.11/site-packages/x.pth", where="ignored", by=f"{pip}[9]",
             lineage=line)
    assert verdict(report(made, pth, ws=str(ws)), "pip install", "install speedups",
                   ws=str(ws)) != "allow"
    assert verdict(report(pth, ws=str(ws)), "pip install", "install speedups", ws=str(ws)) \
        == "allow"


def test_data_rewritten_past_the_first_bytes_the_diff_reads_is_seen(tmp_path: Path):
    """adv13b 20: a 2 MB dataset zeroed from 300 KiB on compared equal, as
    only the first 256 KiB were read. The report compares the whole file."""
    from caper.report.content import RunTree, inspect
    from caper.report.secrets import Redactor
    host = tmp_path / "host"
    run = tmp_path / "run"
    (host / "data").mkdir(parents=True)
    (run / "data").mkdir(parents=True)
    data = os.urandom(2 << 20)
    (host / "data" / "set.bin").write_bytes(data)
    (run / "data" / "set.bin").write_bytes(data[:300 << 10] + bytes(len(data) - (300 << 10)))
    (run / "data" / "same.bin").write_bytes(data)
    (host / "data" / "same.bin").write_bytes(data)
    tree = RunTree.of([(str(host), str(run))])
    assert inspect(str(host / "data" / "set.bin"), "modified", tree, Redactor()).uncompared
    assert not inspect(str(host / "data" / "same.bin"), "modified", tree, Redactor()).uncompared


def test_a_link_whose_dotdot_follows_another_link_is_judged_where_it_leads(policy_env: Path):
    """adv13b 11: `d1/d2/u -> ../..` (the project), then `x ->
    d1/d2/u/../home/.bashrc`: read as text the target stays in d1/d2; the
    kernel follows u first and `..` climbs out of the project. The policy
    follows the run's own links and the host's as the kernel does."""
    from helpers.policy import gate
    out = gate(policy_env, "mkdir -p d1/d2 && ln -s ../.. d1/d2/u && "
               "ln -s d1/d2/u/../home/.bashrc x", "add a shortcut to the docs")
    assert not out.committed, out.reason
    assert ".bashrc" in out.reason
    # a link that stays in the project after the same climb is the project's
    out = gate(policy_env, "mkdir -p e1/e2 && ln -s ../.. e1/e2/u && ln -s e1/e2/u/README.md y",
               "add a shortcut to the docs")
    assert out.committed, out.reason


def test_hatch_and_pdm_files_of_their_own_are_read_as_their_pyproject_tables(tmp_path: Path):
    """adv13b 12: hatch.toml holds [build.hooks.custom] and [version], pdm.toml
    the index and pdm's hook scripts: what pyproject's tool.hatch and tool.pdm
    hold, under a file of their own."""
    ws = str(tmp_path / "proj")
    for name, keys in (("hatch.toml", ["build.hooks.custom.path=hatch_build.py"]),
                       ("hatch.toml", ["version.source=code", "version.path=build/v.py"]),
                       ("hatch.toml", ["envs.default.post-install-commands=['sh build/x']"]),
                       ("pyproject.toml", ["tool.hatch.envs.default.pre-install-commands=['x']"]),
                       ("pyproject.toml", ["tool.pdm.scripts.post_install=sh build/x"]),
                       ("pdm.toml", ["scripts.pre_install=sh build/x"])):
        change = fc(name, "modified", "tracked", keys=keys, by="/bin/sh[3]")
        assert verdict(report(change, ws=ws), "./tool.sh", "tidy the build settings",
                       ws=ws) != "allow", (name, keys)
    plain = fc("hatch.toml", "modified", "tracked", keys=["envs.default.python=3.12"],
               by="/bin/sh[3]")
    assert verdict(report(plain, ws=ws), "./tool.sh", "tidy the build settings", ws=ws) == "allow"
    index = fc("pdm.toml", "modified", "tracked", by="/bin/sh[3]", keys=[
        "pypi.url=https://pypi.example.net/simple"],
        diff=["+[pypi]", "+url = \"https://pypi.example.net/simple\""])
    assert verdict(report(index, ws=ws), "./tool.sh", "tidy the build settings", ws=ws) \
        != "allow"


def test_more_hook_managers_files_are_hook_configuration():
    """adv13b 17: husky 4 reads .huskyrc*, simple-git-hooks its own json/js
    files, pnpm reads a package.yaml in place of package.json: each names
    what git (or an install) runs."""
    for name in (".huskyrc", ".huskyrc.json", ".huskyrc.js", "husky.config.js",
                 ".simple-git-hooks.json", ".simple-git-hooks.cjs", "simple-git-hooks.js",
                 "package.yaml", "package.json5"):
        change = fc(name, "modified", "tracked", by="/bin/sh[3]")
        assert verdict(report(change), "./tool.sh", "format the TypeScript files") != "allow", name


def test_browser_and_runtime_stores_take_only_their_tools_writes():
    """adv13b 18: a shell's file in Playwright's or Puppeteer's browser
    store, deno's module cache or uv's unpacked sdists is what the next test
    run or build executes as the tool's own."""
    for rel in (".cache/ms-playwright/chromium-1140/chrome-linux/chrome",
                ".cache/puppeteer/chrome/linux-131/chrome-linux64/chrome",
                ".cache/deno/remote/https/deno.land/abc",
                ".cache/uv/sdists-v9/pypi/x/1.0/src/setup.py"):
        planted = fc(f"{HOME}/{rel}", where="cache", by="/bin/sh[4]",
                     lineage=[["/bin/sh", "-c", "printf x > f"]])
        assert verdict(report(planted), "./tool.sh", "fix the e2e test") != "allow", rel
    fetched = fc(f"{HOME}/.cache/ms-playwright/chromium-1140/chrome-linux/chrome", where="cache",
                 by="/usr/bin/node[4]",
                 lineage=[["/usr/bin/node", "/w/proj/node_modules/.bin/playwright", "install"]])
    assert verdict(report(fetched), "npx playwright install", "install the test browsers") \
        == "allow"


def test_pytest_testpaths_into_a_directory_the_run_filled_load_its_code(tmp_path: Path):
    """adv13b 16: `testpaths = ["build/t"]` with a test module the run wrote in
    ignored build/t: the next `pytest` imports it, which nobody reviews there."""
    ws = tmp_path / "proj"
    (ws / "tests").mkdir(parents=True)
    hidden = fc("build/t/test_smoke.py", "created", "ignored", by="/bin/sh[3]")
    for keys in (["tool.pytest.ini_options.testpaths=['build/t']"],
                 ["tool.pytest.ini_options.testpaths=['tests', 'build/t']"]):
        change = fc("pyproject.toml", "modified", "tracked", keys=keys, by="/bin/sh[3]")
        assert verdict(report(change, hidden, ws=str(ws)), "./tool.sh", "configure pytest",
                       ws=str(ws)) != "allow", keys
    for name, key in (("pytest.ini", "pytest.testpaths=build/t"),
                      ("setup.cfg", "tool:pytest.testpaths=build/t")):
        change = fc(name, "modified", "tracked", keys=[key], by="/bin/sh[3]")
        assert verdict(report(change, hidden, ws=str(ws)), "./tool.sh", "configure pytest",
                       ws=str(ws)) != "allow", key
    fine = fc("pyproject.toml", "modified", "tracked", by="/bin/sh[3]",
              keys=["tool.pytest.ini_options.testpaths=['tests']"])
    assert verdict(report(fine, hidden, ws=str(ws)), "./tool.sh", "configure pytest",
                   ws=str(ws)) == "allow"
