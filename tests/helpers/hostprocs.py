"""Which processes of the host have a given piece of command line: how the
tests check that nothing of a sandbox outlived it."""
from __future__ import annotations

import os


def pids_with_cmdline(fragment: bytes) -> list[int]:
    """Pids whose NUL-separated /proc/<pid>/cmdline contains fragment."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if fragment in f.read():
                        found.append(int(d))
            except OSError:
                pass
    return found
