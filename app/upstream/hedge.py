"""Hedged first token: when to send a backup request, from the TTFT an upstream has shown.

No I/O here, and no clock of its own: the seconds are passed in.

A stream that has not produced its first event after a delay gets one backup request to
another upstream serving its model; whichever streams first is kept and the other is closed
(app/upstream/race.py). The delay is either fixed (``hedge_after = 300``, milliseconds) or a
percentile of the time to first event this worker recently saw from the upstream
(``hedge_after = "p95"``), held between ``hedge_min_ms`` and ``hedge_max_ms``. Until
``MIN_SAMPLES`` streams were seen the percentile is not known yet and ``hedge_max_ms`` is
used: a cold worker hedges late rather than doubling its first calls.

Only winners are observed: a stream cancelled because the other one won has no TTFT. The
window therefore leans fast once hedging fires often, which makes it hedge a little sooner:
the cost stays visible in ``llmgate_hedges_total``.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

MIN_SAMPLES = 20
WINDOW = 256  # the most recent first-event times kept per upstream and worker
_PERCENTILE = re.compile(r"^p([1-9][0-9]?(?:\.[0-9])?)$")


@dataclass(frozen=True)
class HedgePolicy:
    """When a stream sent to one upstream gets a backup: after ``after_ms``, or after the
    ``percentile`` of the observed TTFT clamped to [``min_ms``, ``max_ms``]."""

    after_ms: float | None = None  # fixed delay; None: use the percentile
    percentile: float | None = None
    min_ms: float = 50.0
    max_ms: float = 2000.0

    @classmethod
    def parse(cls, value: object, min_ms: float = 50.0, max_ms: float = 2000.0) -> HedgePolicy:
        """``300`` (ms) or ``"p95"``; ValueError saying what is accepted otherwise."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError('must be milliseconds (e.g. 300) or a percentile (e.g. "p95")')
        if not 0 <= min_ms <= max_ms:
            raise ValueError("needs 0 <= hedge_min_ms <= hedge_max_ms")
        if isinstance(value, str):
            match = _PERCENTILE.match(value)
            if match is None:
                raise ValueError(f'must be a percentile from "p1" to "p99.9", got {value!r}')
            return cls(percentile=float(match.group(1)), min_ms=min_ms, max_ms=max_ms)
        if value <= 0:
            raise ValueError("must be > 0 milliseconds")
        return cls(after_ms=float(value), min_ms=min_ms, max_ms=max_ms)

    def delay(self, window: TtftWindow) -> float:
        """Seconds to wait for a first event before hedging."""
        if self.after_ms is not None:
            return self.after_ms / 1000
        assert self.percentile is not None
        seen = window.percentile(self.percentile)
        if seen is None:
            return self.max_ms / 1000
        return min(max(seen * 1000, self.min_ms), self.max_ms) / 1000


class TtftWindow:
    """The last ``WINDOW`` times to first event (seconds) of one upstream in one worker."""

    def __init__(self, size: int = WINDOW) -> None:
        self._seen: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._seen.append(seconds)

    def percentile(self, p: float) -> float | None:
        """The nearest-rank ``p``-th percentile, or None below ``MIN_SAMPLES`` samples."""
        if len(self._seen) < MIN_SAMPLES:
            return None
        ordered = sorted(self._seen)
        rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100), at least 1
        return ordered[int(rank) - 1]

    def __len__(self) -> int:
        return len(self._seen)
