"""caper run's cost next to running natively, on the commit path (approver
allow) and the rollback path (approver block), in a 10,000-file workspace.

    python3 -m pytest bench/test_transaction.py --benchmark-columns=min,median,max,rounds

Variants: native (subprocess), caper (caper.run in this process: what an
embedding agent pays, overlay backend), caper-btrfs (the same with the
workspace a subvolume on a loop-mounted btrfs image the bench makes;
native-btrfs is the command there),
caper-cli (python3 -m caper run --no-gate: a fresh interpreter that runs
the command itself), caper-gate (python3 -m caper run through the resident
gate, started before timing: what a hook pays); each with allow and block.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from benchlib import ROOT, fill_workspace, sandbox_alone

SCALE = float(os.environ.get("CAPER_BENCH_SCALE", "1"))
ROUNDS = max(5, round(30 * SCALE))

WORKLOADS = {
    "true": "true",
    "touch": "touch x",
    "rm-rf-100": "rm -rf doomed",
}


@pytest.fixture(scope="session")
def workspace(workdir):
    ws = os.path.join(workdir, "ws10k")
    if not os.path.exists(ws):
        fill_workspace(ws)
    return ws


@pytest.fixture(scope="session")
def btrfs_workspace(workdir):
    """The same workspace as a subvolume on a loop-mounted btrfs image."""
    from caper.view.btrfs import is_subvolume
    if not shutil.which("mkfs.btrfs"):
        pytest.skip("mkfs.btrfs missing")
    img, mnt = os.path.join(workdir, "btrfs.img"), os.path.join(workdir, "btrfs")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run(["mkfs.btrfs", "-q", img], check=True)
    subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
    try:
        ws = os.path.join(mnt, "ws10k")
        subprocess.run(["btrfs", "-q", "subvolume", "create", ws], check=True)
        fill_workspace(ws)
        assert is_subvolume(ws)
        yield ws
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)


def _reset(ws: str) -> None:
    doomed = os.path.join(ws, "doomed")
    if not os.path.isdir(doomed):
        os.mkdir(doomed)
        for i in range(100):
            with open(os.path.join(doomed, f"f{i}"), "w") as fh:
                fh.write("x\n")
    x = os.path.join(ws, "x")
    if os.path.exists(x):
        os.unlink(x)
    # Files a command deletes are on disk already, as in real use. Unsynced,
    # ext4 frees a never-written (delayed-allocation) file in ~6 us, while a
    # written one takes ~100 us here (discard mount): the native rm would
    # get the cheap kind and caper's commit, whose sync writes them out
    # first, the dear kind.
    os.sync()


@pytest.mark.parametrize("variant", ["native", "caper-allow", "caper-block",
                                     "caper-cli-allow", "caper-cli-block",
                                     "caper-gate-allow", "caper-gate-block"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_run(benchmark, request, workdir, workload, variant):
    _bench(benchmark, request, workdir, workload, variant)


# After every other variant: btrfs deletes a dropped snapshot on a kernel
# thread, for a while after each run, which slowed what ran next by ~3 ms.
# native-btrfs: the command itself on the btrfs workspace, the baseline of
# the btrfs variants (deleting files costs btrfs more than ext4).
@pytest.mark.parametrize("variant", ["native-btrfs", "caper-btrfs-allow", "caper-btrfs-block"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_run_btrfs(benchmark, request, workdir, workload, variant):
    _bench(benchmark, request, workdir, workload, variant)


# What a btrfs run of `true` cannot go below here, whatever caper's own code
# does, measured beside the runs above: the sandbox and tracer over the
# overlays a btrfs run has (no report, approver or commit), the snapshot
# ioctl (one btrfs transaction commit), and the commit that puts a run's
# writes where the tree search that lists them can see them (a sync).
@pytest.mark.parametrize("part", ["sandbox", "snapshot-ioctl", "sync-after-write"])
def test_btrfs_floor(benchmark, workdir, btrfs_workspace, part):
    import btrfsutil

    from caper.view.overlay import settle

    ws, state = btrfs_workspace, os.path.join(workdir, "caper-state")
    snap = os.path.join(os.path.dirname(ws), ".bench-floor")
    os.makedirs(state, exist_ok=True)
    benchmark.group = "btrfs-floor"

    def drop() -> None:
        settle()
        if os.path.exists(snap):
            btrfsutil.delete_subvolume(snap)
        os.sync()

    if part == "sandbox":
        def fn():
            sandbox_alone(ws, state)
        setup = drop
    elif part == "snapshot-ioctl":
        def fn():
            btrfsutil.create_snapshot(ws, snap)
        setup = drop
    else:
        def fn():
            btrfsutil.sync(snap)

        def setup():
            drop()
            btrfsutil.create_snapshot(ws, snap)
            with open(os.path.join(snap, "x"), "w"):
                pass
    try:
        benchmark.pedantic(fn, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    finally:
        drop()


def _bench(benchmark, request, workdir, workload, variant):
    import caper

    workspace = request.getfixturevalue(
        "btrfs_workspace" if "btrfs" in variant else "workspace")
    cmd = WORKLOADS[workload]
    state = os.path.join(workdir, "caper-state")
    env = {**os.environ, "CAPER_STATE_DIR": state, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("CAPER_NO_GATE", None)
    benchmark.group = f"run-{workload}"
    if variant.startswith("native"):
        fn = lambda: subprocess.run(["/bin/sh", "-c", cmd], cwd=workspace, check=True,
                                    capture_output=True)
    elif variant.startswith(("caper-cli", "caper-gate")):
        approver = variant.rsplit("-", 1)[1]
        argv = [sys.executable, "-m", "caper", "run", "--approver", approver, "--backend",
                "overlay", "--workspace", workspace, "-q", "-c", cmd]
        if variant.startswith("caper-cli"):
            argv.insert(4, "--no-gate")
        else:   # start the gate before timing
            subprocess.run(argv[:4] + ["-c", "true"], cwd=workspace, env=env, check=True,
                           capture_output=True)
        fn = lambda: subprocess.run(argv, cwd=workspace, env=env, capture_output=True)
    else:
        approver = variant.rsplit("-", 1)[1]
        backend = "btrfs" if "btrfs" in variant else "overlay"
        fn = lambda: caper.run(cmd, cwd=workspace, workspace=workspace, approver=approver,
                               backend=backend, state_dir=state)
    benchmark.pedantic(fn, setup=lambda: _reset(workspace), rounds=ROUNDS, warmup_rounds=1)
