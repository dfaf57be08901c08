"""Waiting for something another thread or process does: the one poll every test uses.

A test waits for a fact it can check (a counter reached, a line logged), never for a fixed
time; the timeout is a generous bound for a slow machine, not a measurement, and the caller
asserts the answer so a failure says what did not happen.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 5.0, every: float = 0.01) -> bool:
    """True as soon as ``predicate()`` holds, checked every ``every`` seconds; after
    ``timeout`` seconds its last answer (one more check, so a fact that came during the last
    sleep still counts)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())


def minute_with_room(room_s: float) -> None:
    """Return in a wall-clock minute with at least ``room_s`` seconds of it left, waiting for
    the next one if need be. Per-minute limits count in the minute's own counter and start
    again at its edge, so a test that reads a minute's count begins and ends in one minute:
    ``room_s`` is a generous bound on the test's own length (a test waits in ``room_s`` / 60
    of its runs, for ``room_s`` + 1 s at most)."""
    left = 60 - time.time() % 60
    if left < room_s:
        time.sleep(left + 1)
