#!/usr/bin/env python3
"""What appending one line to a large file costs under caper, per filesystem.

    sudo python3 bench/large_files.py [--sizes 100,1000] [--fs ext4,btrfs,xfs] [--json out.json]

For each filesystem (a loop image under a private temporary directory,
unmounted afterwards) and each size in MB: a file of that size in a
workspace on it, caper's state directory on the same filesystem, then
`echo x >> big` natively and through `caper.run(..., approver="allow")`
(overlay backend: the workspace is a plain directory). overlayfs copies the
whole file up before the first write; where the upper and lower share a
filesystem that can clone (btrfs, xfs with reflink), the kernel clones it
instead, and the commit hard-links the copy into place either way. Prints
one line per case: native ms, caper's run and commit ms, and the bytes the
filesystem used for the copy-up (df before and after, rounded).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MKFS = {"ext4": ["mkfs.ext4", "-q"], "btrfs": ["mkfs.btrfs", "-q"], "xfs": ["mkfs.xfs", "-q"]}


def _used(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def one(fs: str, size_mb: int, base: str) -> dict:
    from caper import run
    img, mnt = os.path.join(base, f"{fs}-{size_mb}.img"), os.path.join(base, f"{fs}-{size_mb}")
    os.mkdir(mnt)
    subprocess.run(["truncate", "-s", f"{size_mb * 3 + 400}M", img], check=True)
    subprocess.run([*MKFS[fs], img], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
    try:
        ws, state = os.path.join(mnt, "ws"), os.path.join(mnt, "state")
        os.mkdir(ws)
        with open(os.path.join(ws, "big"), "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(size_mb):
                f.write(chunk)
        subprocess.run(["sync"], check=True)
        t = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", "echo x >> big"], cwd=ws, check=True)
        native_ms = (time.perf_counter() - t) * 1000
        run("true", cwd=ws, workspace=ws, approver="allow", state_dir=state)   # warm
        subprocess.run(["sync"], check=True)
        before = _used(mnt)
        t = time.perf_counter()
        out = run("echo x >> big", cwd=ws, workspace=ws, approver="allow", state_dir=state)
        total_ms = (time.perf_counter() - t) * 1000
        subprocess.run(["sync"], check=True)
        grown = _used(mnt) - before
        assert out.committed, out.reason
        assert os.path.getsize(os.path.join(ws, "big")) == size_mb * (1 << 20) + 4
        return {"fs": fs, "size_mb": size_mb, "native_ms": round(native_ms, 1),
                "caper_ms": round(total_ms, 1), "run_ms": round(out.timings.get("run_ms", 0), 1),
                "commit_ms": round(out.timings.get("commit_ms", 0), 1),
                "backend": out.report.backend, "copied_mb": round(grown / (1 << 20))}
    finally:
        from caper.view.overlay import settle
        settle()
        subprocess.run(["umount", mnt], check=False)
        os.unlink(img)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000")
    ap.add_argument("--fs", default="ext4,btrfs,xfs")
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (loop mounts)", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="caper-bench-large-")
    rows = []
    try:
        for fs in args.fs.split(","):
            if not shutil.which(MKFS[fs][0]):
                print(f"{fs}: {MKFS[fs][0]} not installed, skipped", file=sys.stderr)
                continue
            for size in map(int, args.sizes.split(",")):
                row = one(fs, size, base)
                rows.append(row)
                print(f"{fs:6} {size:5} MB: native {row['native_ms']:8.1f} ms, caper "
                      f"{row['caper_ms']:8.1f} ms (run {row['run_ms']:.1f}, commit "
                      f"{row['commit_ms']:.1f}), copy-up used {row['copied_mb']} MB", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
