"""The README's set-up on a fresh Debian 12 host, for real: scripts/fresh-host
builds a minimal image (mmdebstrap), enters it with a new mount and pid
namespace and pivot_root, and there runs `./bootstrap && .venv/bin/caper
demo`, `./bootstrap && .venv/bin/python -m pytest -q` on a few test files,
and a non-editable `pip install .` with `caper demo` from that venv.

Four variants cover each choice at least twice: root without sudo and a
normal user with sudo, /tmp on tmpfs and on ext4, with and without unusual
mount trees (a chroot with its own proc/sys/cgroup/devpts mounts, a
read-only bind, an overlay, one ext4 at two places, a squashfs, nested
tmpfs, FUSE mounts of root's and of another user's that the other cannot
even stat).

Opt-in (CAPER_TEST_FRESH_HOST=1): it needs root, mmdebstrap and the network
to the Debian mirror and PyPI, and takes minutes per variant."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "fresh-host"
TESTS = ["tests/test_demo.py", "tests/test_run.py", "tests/test_rootless.py"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("CAPER_TEST_FRESH_HOST") != "1",
                       reason="opt-in: CAPER_TEST_FRESH_HOST=1 (root, mmdebstrap, network; minutes)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to build and enter the image"),
    pytest.mark.skipif(not (shutil.which("mmdebstrap") and shutil.which("unshare")),
                       reason="needs mmdebstrap (apt-get install mmdebstrap) and unshare"),
]

VARIANTS = {
    "root-tmpfs": ["--as", "root", "--tmp", "tmpfs"],
    "root-ext4-mounts": ["--as", "root", "--tmp", "ext4", "--mounts"],
    "user-tmpfs-mounts": ["--as", "user", "--tmp", "tmpfs", "--mounts"],
    "user-ext4": ["--as", "user", "--tmp", "ext4"],
}

DEMO_LINES = ["verdict: BLOCKED, nothing changed", "verdict: ALLOWED and committed",
              "A: src/ still there, .git/ still there", "B: build/app rebuilt, prints: 2 + 3 = 5"]


@pytest.fixture(scope="module")
def collected() -> int:
    """How many tests the image's run of TESTS must account for."""
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *TESTS],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    m = re.search(r"^(\d+) tests? collected", p.stdout, re.M)
    assert m, p.stdout[-2000:] + p.stderr[-2000:]
    return int(m.group(1))


def _step(out: str, name: str) -> str:
    """The output of one step, between its start and end markers."""
    m = re.search(rf"^== fresh-host step {name}: (?!ok \(|FAILED).*?$(.*?)"
                  rf"^== fresh-host step {name}: (ok|FAILED[^\n]*)", out, re.M | re.S)
    assert m, f"no step {name} in:\n{out[-3000:]}"
    assert m.group(2).startswith("ok"), f"step {name}: {m.group(2)}\n{m.group(1)[-4000:]}"
    return m.group(1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fresh_host_installs_and_runs(variant, collected):
    args = VARIANTS[variant]
    # timeout(1) sends SIGTERM, on which the script still ends its run and cleans up.
    p = subprocess.run(["timeout", "3600", str(SCRIPT), *args, "--tests", " ".join(TESTS)],
                       capture_output=True, text=True, timeout=3700)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert re.search(rf"^== fresh-host {variant}: 3 of 3 steps ok", out, re.M), out[-3000:]

    # Nothing of the run is left on the host: its directory, mounts, loop devices.
    run = re.search(r"^== fresh-host \S+: .* at \S+, in (\S+), log ", out, re.M)
    assert run, out[:2000]
    assert not os.path.exists(run.group(1))
    assert run.group(1) not in subprocess.run(["findmnt", "-rn", "-o", "TARGET"],
                                              capture_output=True, text=True).stdout
    assert run.group(1) not in subprocess.run(["losetup", "-l", "-n"],
                                              capture_output=True, text=True).stdout

    root = "--as" in args and args[args.index("--as") + 1] == "root"
    tmp = args[args.index("--tmp") + 1]
    who = re.search(r"^== fresh-host: as (\S+) \((\d+)\), sudo: (\S+), /tmp: (\S+)$", out, re.M)
    assert who, out[-3000:]
    assert who.groups() == (("root", "0", "none", tmp) if root
                            else ("dev", "1000", "/usr/bin/sudo", tmp))
    mounts = set(re.findall(r"^  mount: (\S+) (\S+)$", out, re.M))
    if "--mounts" in args:
        c = "/srv/chroot/bookworm"
        want = {(f"{c}/proc", "proc"), (f"{c}/proc/sys/fs/binfmt_misc", "binfmt_misc"),
                (f"{c}/sys/fs/cgroup", "tmpfs"), (f"{c}/sys/fs/cgroup/unified", "cgroup2"),
                (f"{c}/dev/pts", "devpts"), (f"{c}/dev/mqueue", "mqueue"),
                ("/srv/ro-usr", "ext4"), ("/srv/overlay", "overlay"), ("/srv/data", "ext4"),
                ("/mnt/data", "ext4"), ("/run/user/1000", "tmpfs"), ("/srv/nested/a/b", "tmpfs")}
        if shutil.which("mksquashfs"):
            want.add(("/snap/hello/1", "squashfs"))
        if os.path.exists("/dev/fuse"):
            want |= {("/srv/fuse", "fuse"), ("/run/user/1000/gvfs", "fuse")}
        assert want <= mounts, want - mounts

    # A fresh host's set-up says nothing alarming (Debian 12's venv setuptools
    # once warned "beta" at every bootstrap).
    for noise in ("Warning:", "warnings.warn(", "unable to resolve host", "Traceback"):
        assert noise not in out, [line for line in out.splitlines() if noise in line][:5]

    for name in ("demo", "pip-install"):
        text = _step(out, name)
        for line in DEMO_LINES:
            assert line in text, f"{name}: no {line!r} in:\n{text[-4000:]}"
        assert text.count("verdict: BLOCKED") == 2, text[-4000:]

    summary = _step(out, "tests").strip().splitlines()[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    assert set(counts) <= {"passed", "skipped"}, summary
    if root:
        assert counts == {"passed": collected}, summary
    else:
        # The user's run skips the tests that need root (tests/test_rootless.py
        # switches uids); caper itself runs rootless in all the others.
        assert counts["passed"] > 0 and counts["passed"] + counts.get("skipped", 0) == collected, \
            summary
