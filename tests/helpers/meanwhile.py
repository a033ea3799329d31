"""A run during which the user saves a file: the host edit a commit must
see as a conflict."""
from __future__ import annotations

import threading
import time

from caper.transaction import run


def run_while_the_user_edits_readme(ws, state, command: str, **kw):
    """command runs for 0.8 s (approver allow unless kw says); the user
    saves ws/README 0.3 s into it."""
    def edit_meanwhile():
        time.sleep(0.3)
        (ws / "README").write_text("user edit\n")

    t = threading.Thread(target=edit_meanwhile)
    t.start()
    try:
        return run(f"sleep 0.8; {command}", cwd=str(ws), approver=kw.pop("approver", "allow"),
                   state_dir=str(state), **kw)
    finally:
        t.join()
