"""Trees the tests build and compare: a tree's whole state, git projects."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

def tree(path: Path) -> dict:
    """Everything about a tree that a user would miss: types, modes, contents, links."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath, name)
            rel = str(p.relative_to(path))
            try:
                st = p.lstat()
            except PermissionError:  # its directory was chmodded unsearchable
                out[rel] = ("unsearchable",)
                continue
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode & 0o7777)
            else:
                try:
                    out[rel] = ("file", st.st_mode & 0o7777, p.read_bytes())
                except PermissionError:  # an unprivileged run chmodded it shut
                    out[rel] = ("file", st.st_mode & 0o7777, st.st_size, "unreadable")
    return out


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                   check=True, capture_output=True)


def git_project(root: Path, files: dict[str, str], tracked: tuple[str, ...] = ("-A",)) -> Path:
    """A git repository at root holding files, with `tracked` committed."""
    root.mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git(root, "init", "-q")
    git(root, "add", *tracked)
    git(root, "commit", "-qm", "init")
    return root
