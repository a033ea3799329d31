"""The ctime threshold as the native init waits for it."""
from __future__ import annotations

import time

from caper.commit import ctimes


def wait_for(threshold: ctimes.Threshold) -> None:
    # What the native init does before it starts the command.
    while time.clock_gettime_ns(ctimes.CLOCK_REALTIME_COARSE) < threshold.not_before_ns:
        time.sleep(0.0002)
