"""Round 14 (adv14b): caches and state that later tools load as code
whoever wrote them, program names shadowed by links and version files, make
code in dependency files, packages the run left in the project, a user's
files moved where cleaning deletes them, keys opened by a directory's mode.
Hand reports where a rule is the point, real runs where the report's facts are."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.policy import HOME, fc, report, verdict

SHELL = [["/bin/sh", "-c", "./scripts/devprep.sh"]]


@pytest.mark.parametrize("rel", [
    ".cache/black/24.8.0/Grammar3.11.4.final.0.pickle",      # 01: black's grammar pickle
    ".cache/node-gyp/20.20.2/include/node/common.gypi",       # 03: node-gyp's dev dir
    ".cache/jedi/CPython-311-11/abc-def.pkl",                 # 11: parso's parse cache
    ".cache/some-new-tool/plugin.py"])                        # the class: any store
def test_a_new_cache_entry_is_its_tools_only(rel):
    """adv14b 01, 03, 11: a new file in ~/.cache is a tool's own entry only
    when that tool's process wrote it; a shell's or a project script's is
    code the next run of the tool loads (a pickle, a gypi's <!(...))."""
    for by, line in (("/bin/sh[4]", SHELL),
                     ("/usr/bin/python3[4]", [["/usr/bin/python3", "tools/devprep.py"]])):
        planted = fc(f"{HOME}/{rel}", where="cache", by=by, lineage=line)
        assert verdict(report(planted), "./tool.sh", "prepare the dev tools") != "allow", (rel, by)
    own = fc(f"{HOME}/{rel}", where="cache", by="/usr/bin/python3[4]",
             lineage=[["/usr/bin/python3", "/usr/bin/black", "src"]])
    assert verdict(report(own), "black src", "format the sources") == "allow"


def test_an_installed_program_that_copies_bytes_is_no_caches_tool():
    """adv14b 12: `objcopy -I binary -O binary` (like cp) put the run's wheel
    under pip's cache key; cmake -E copy, zip, java, make's $(file) likewise."""
    key = f"{HOME}/.cache/pip/wheels/ab/cd/ef/foo-1.0-py3-none-any.whl"
    for prog, arg in (("/usr/bin/objcopy", "-I"), ("/usr/bin/cmake", "-E"), ("/usr/bin/zip", "x"),
                      ("/usr/bin/java", "X.java"), ("/usr/bin/make", "-f"),
                      ("/usr/bin/Rscript", "x.R"), ("/usr/bin/julia", "x.jl")):
        planted = fc(key, where="cache", by=f"{prog}[5]", lineage=[[prog, arg]] + SHELL)
        assert verdict(report(planted), "./tool.sh", "prebuild the vendored dependencies") \
            != "allow", prog


def test_editor_state_that_editors_load_is_persistence():
    """adv14b 02: lazy.nvim loadfile()s ~/.local/state/nvim/lazy/pkg-cache.lua
    at every start; session plugins source their sessions."""
    for rel, op in ((".local/state/nvim/lazy/pkg-cache.lua", "modified"),
                    (".local/state/nvim/sessions/proj.vim", "created")):
        change = fc(f"{HOME}/{rel}", op, "home", by="/bin/sh[3]", lineage=SHELL)
        assert verdict(report(change), "./scripts/editor-setup.sh",
                       "set up the project for development") != "allow", rel
    history = fc(f"{HOME}/.local/state/less/history", "modified", "home", by="/usr/bin/less[3]")
    assert verdict(report(history), "less README.md", "read the readme") == "allow"


def test_a_path_shadow_by_link_or_by_any_system_name_in_a_bin_dir():
    """adv14b 04, 05: `bin/git -> ../build/.hooks/vcs` is the file `bin/git`;
    build/toolchain/bin/diff shadows the system's diff as bin/git would."""
    link = fc("bin/git", "created", "untracked", type="symlink", detail="-> ../build/.hooks/vcs",
              by="/usr/bin/ln[3]")
    assert verdict(report(link), "./tool.sh", "add the dev scripts") != "allow"
    for name in ("diff", "tar", "xargs", "ssh-keygen"):
        planted = fc(f"build/toolchain/bin/{name}", "created", "ignored", by="/bin/sh[3]")
        assert verdict(report(planted), "./tool.sh", "pin the node version for the build") \
            != "allow", name
    own = fc("scripts/deploy", "created", "untracked", by="/bin/sh[3]")
    assert verdict(report(own), "./tool.sh", "add a deploy script") == "allow"


def test_a_tool_version_from_a_path_is_a_program_put_on_path():
    """adv14b 05: `.tool-versions` with `node path:./build/toolchain`: mise and
    asdf put that directory's bin first on PATH at the next prompt."""
    ws = "/w/proj"
    bad = fc(".tool-versions", "modified", "tracked", by="/bin/sh[3]",
             keys=["node=path:./build/toolchain"])
    assert verdict(report(bad), "./tool.sh", "pin the node version", ws=ws) != "allow"
    pin = fc(".tool-versions", "modified", "tracked", by="/bin/sh[3]", keys=["node=20.11.1"])
    assert verdict(report(pin), "./tool.sh", "pin the node version", ws=ws) == "allow"


def test_tool_versions_keys_are_read():
    from caper.report.configkeys import changed_keys, format_of
    assert format_of("/w/proj/.tool-versions") == "tool-versions"
    assert changed_keys("tool-versions", b"node 20.1.0\n", b"node path:./b\npython 3.12 3.11\n",
                        None) == ["node=path:./b", "python=3.12 3.11"]


def test_a_dependency_file_make_includes_is_make_code():
    """adv14b 06: `-include $(DEPS)` reads every build/*.d: a .d the run's
    script wrote (not the compiler) runs its $(shell ...) at every make."""
    written = fc("build/main.d", "created", "ignored", by="/bin/sh[3]")
    assert verdict(report(written), "./build.sh", "build the project") != "allow"
    made = fc("build/main.d", "created", "ignored", by="/usr/lib/gcc/x86_64-linux-gnu/12/cc1[5]",
              lineage=[["/usr/lib/gcc/x86_64-linux-gnu/12/cc1", "-quiet"],
                       ["/usr/bin/cc", "-MMD", "-c", "src/main.c"], ["/usr/bin/make"]])
    assert verdict(report(made), "make", "build the project") == "allow"


def test_a_dependency_on_a_package_the_run_left_in_the_project(tmp_path: Path):
    """adv14b 07: `"str-pad": "file:build/str-pad-1.0.0.tgz"`, `./build/helper-1.0.tar.gz`
    and `-e ./build/helper` name what the run made: its install scripts run
    at the next install."""
    ws = str(tmp_path / "proj")
    tgz = fc("build/str-pad-1.0.0.tgz", "created", "ignored", by="/usr/bin/node[3]")
    sdist = fc("build/helper-1.0.tar.gz", "created", "ignored", by="/bin/sh[3]")
    tree = fc("build/helper/setup.py", "created", "ignored", by="/bin/sh[3]")
    for name, line, made in (
            ("package.json", '+    "str-pad": "file:build/str-pad-1.0.0.tgz",', tgz),
            ("requirements.txt", "+./build/helper-1.0.tar.gz", sdist),
            ("requirements.txt", "+-e ./build/helper", tree)):
        change = fc(name, "modified", "tracked", by="/bin/sh[3]", diff=[line])
        assert verdict(report(change, made, ws=ws), "node scripts/build.js", "build the app",
                       ws=ws) != "allow", line
    kept = fc("requirements.txt", "modified", "tracked", by="/bin/sh[3]", diff=["+requests==2.32.3"])
    assert verdict(report(kept, sdist, ws=ws), "./tool.sh", "build the app", ws=ws) == "allow"


def test_a_users_file_moved_where_cleaning_deletes_it():
    """adv14b 08: the user's notes and database moved into build/stage: the
    next `make clean`, allowed on its own, deletes them."""
    for src, where in (("notes-q3.md", "untracked"), ("local.sqlite", "ignored")):
        moved = fc(f"build/stage/{src}", "renamed", "ignored", renamed_from=src, by="/bin/mv[3]")
        assert verdict(report(moved), "./build.sh", "build the project") != "allow", src
    built = fc("build/stage/app.js", "renamed", "ignored", renamed_from="build/app.js",
               by="/bin/mv[3]")
    assert verdict(report(built), "./build.sh", "build the project") == "allow"


def test_a_directory_opened_to_everyone_opens_the_keys_inside(tmp_path: Path):
    """adv14b 09: `chmod 755 certs` of a 0700 directory holding prod.key and
    .env (each 0644: the directory was the protection)."""
    ws = tmp_path / "proj"
    (ws / "certs").mkdir(parents=True)
    (ws / "certs" / "prod.key").write_text("-----BEGIN PRIVATE KEY-----\n")
    (ws / "docs").mkdir()
    (ws / "docs" / "a.md").write_text("a\n")
    for d in ("certs", "."):
        opened = fc(d, "meta", "ignored" if d != "." else "workspace", type="dir",
                    detail="mode 0700->0755", by="/bin/chmod[3]")
        assert verdict(report(opened, ws=str(ws)), "./fixperms.sh", "build the docs",
                       ws=str(ws)) != "allow", d
    plain = fc("docs", "meta", "tracked", type="dir", detail="mode 0700->0755",
               by="/bin/chmod[3]")
    assert verdict(report(plain, ws=str(ws)), "./fixperms.sh", "build the docs", ws=str(ws)) \
        == "allow"


def test_jests_transform_cache_is_code_its_next_run_loads():
    """adv14b 10: jest's cached transform in $TMPDIR/jest_*/ runs in place of
    the reviewed source; only jest's own workers write it."""
    rel = "/tmp/jest_0/jest-transform-cache-abc-def/17/sum_0123abcd"
    planted = fc(rel, "modified", "tmp", by="/usr/bin/node[5]",
                 lineage=[["/usr/bin/node", "scripts/coverage-summary.js"]])
    assert verdict(report(planted), "npm test", "run the tests") != "allow"
    new = fc(rel, "created", "tmp", by="/usr/bin/node[5]",
             lineage=[["/usr/bin/node", "scripts/coverage-summary.js"]])
    assert verdict(report(new), "npm test", "run the tests") != "allow"
    own = fc(rel, "created", "tmp", by="/usr/bin/node[5]", lineage=[
        ["/usr/bin/node", "/w/proj/node_modules/jest-worker/build/workers/processChild.js"]])
    assert verdict(report(own), "npm test", "run the tests") == "allow"
