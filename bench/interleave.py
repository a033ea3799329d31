#!/usr/bin/env python3
"""The btrfs backend's cost next to its floor, with the variants interleaved.

    python3 bench/interleave.py [--rounds 40]     # as root; ~1 min

pytest-benchmark runs each variant's rounds back to back. On this shared VM
the machine's speed drifts by up to 2x over minutes, so a variant measured
in a slow minute looks dear beside one measured in a fast minute. Here every
round runs each variant once, in turn (native, the floor's parts, caper.run
overlay and btrfs, block and allow), so that a slow minute hits all of them
alike; the medians are then comparable with each other. The workspace is the
bench's: 10,000 files, a subvolume on a loop-mounted btrfs image.

floor (`true`) = sandbox - native + snapshot ioctl: what a btrfs run of
`true` costs before caper's report, approval and bookkeeping; for a command
that writes, the sync that makes its writes visible to the listing comes on
top (and, on the commit path, one more for the exchange).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import btrfsutil  # noqa: E402
from benchlib import fill_workspace, sandbox_alone  # noqa: E402 - puts the checkout on sys.path

import caper  # noqa: E402
from caper.view.overlay import settle  # noqa: E402

WORKLOADS = {"true": "true", "touch": "touch x"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="caper-interleave-")
    img, mnt = os.path.join(work, "btrfs.img"), os.path.join(work, "btrfs")
    os.mkdir(mnt)
    with open(img, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run(["mkfs.btrfs", "-q", img], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
    try:
        ws = os.path.join(mnt, "ws10k")
        subprocess.run(["btrfs", "-q", "subvolume", "create", ws], check=True)
        fill_workspace(ws)
        measure(ws, os.path.join(work, "state"), args.rounds)
    finally:
        settle()
        subprocess.run(["umount", "-l", mnt], check=False)
        subprocess.run(["rm", "-rf", work], check=False)


def measure(ws: str, state: str, rounds: int) -> None:
    os.makedirs(state)
    snap = os.path.join(os.path.dirname(ws), ".interleave-floor")

    def reset() -> None:
        settle()
        if os.path.exists(snap):
            btrfsutil.delete_subvolume(snap)
        if os.path.exists(os.path.join(ws, "x")):
            os.unlink(os.path.join(ws, "x"))
        os.sync()

    def write_then_sync() -> float:      # only the sync is timed
        btrfsutil.create_snapshot(ws, snap)
        with open(os.path.join(snap, "x"), "w"):
            pass
        t = time.perf_counter()
        btrfsutil.sync(snap)
        return time.perf_counter() - t

    variants: dict[str, object] = {
        "native true": lambda: subprocess.run(["/bin/sh", "-c", "true"], cwd=ws, check=True,
                                              capture_output=True),
        "native touch": lambda: subprocess.run(["/bin/sh", "-c", "touch x"], cwd=ws, check=True,
                                               capture_output=True),
        "floor: sandbox": lambda: sandbox_alone(ws, state),
        "floor: snapshot ioctl": lambda: btrfsutil.create_snapshot(ws, snap),
        "floor: sync after a write": write_then_sync,
    }
    for name, cmd in WORKLOADS.items():
        for backend in ("overlay", "btrfs"):
            for approver in ("block", "allow"):
                variants[f"{backend} {approver} {name}"] = (
                    lambda c=cmd, b=backend, a=approver:
                    caper.run(c, cwd=ws, workspace=ws, approver=a, backend=b, state_dir=state))
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds + 1):          # round 0 warms up
        for name, fn in variants.items():
            reset()
            t = time.perf_counter()
            inner = fn()
            dt = inner if isinstance(inner, float) else time.perf_counter() - t
            if r:
                times[name].append(dt * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"medians of {rounds} interleaved rounds, ms (kernel {os.uname().release})\n")
    for k, v in med.items():
        print(f"  {k:28} {v:7.2f}")
    floor = med["floor: sandbox"] - med["native true"] + med["floor: snapshot ioctl"]
    print(f"\n  floor, true (added):        {floor:7.2f}")
    print(f"  floor, touch (added):       {floor + med['floor: sync after a write']:7.2f}")
    for name in WORKLOADS:
        for backend in ("overlay", "btrfs"):
            for approver in ("block", "allow"):
                k = f"{backend} {approver} {name}"
                print(f"  added, {k:20} {med[k] - med['native ' + name]:7.2f}")


if __name__ == "__main__":
    main()
