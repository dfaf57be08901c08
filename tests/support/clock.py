"""A clock that stands still until the test moves it: the one thing tests mock besides chance."""

from __future__ import annotations


class Clock:
    """``now`` as the test sets it; ``sleep`` moves it on (by at least a millisecond, so a
    loop that sleeps for nothing still sees time pass). Pass it where code takes a clock,
    or put it in place of ``time.monotonic``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)
