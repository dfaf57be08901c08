"""The Memcached memory a worker's resumable logs may reserve together. No I/O here.

Each resumable stream reserves what its log may grow to (LLMGATE_RESUME_STREAM_BYTES) at its
start, so a stream that would not fit is told so in its headers, never at the reconnect.
The reservation is held until the log expires from Memcached (the window after the stream's
end), because until then Memcached holds it. Expired reservations are counted back lazily, at
the next reservation: a plain list, one budget per worker, touched only by its greenlets.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class Reservation:
    def __init__(self, budget: ResumeBudget, size: int) -> None:
        self.budget, self.size = budget, size
        self.expires: float | None = None

    def expire_at(self, when: float) -> None:
        """The log is gone from Memcached at ``when`` (the budget's clock): free it then."""
        if self.expires is None:
            self.expires = when
            heapq.heappush(self.budget.expiring, (when, id(self), self))


class ResumeBudget:
    def __init__(self, limit: int, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.held = 0
        self.expiring: list[tuple[float, int, Reservation]] = []
        self._clock = clock

    def reserve(self, size: int) -> Reservation | None:
        """A reservation of ``size`` bytes, or None when it does not fit."""
        now = self._clock()
        while self.expiring and self.expiring[0][0] <= now:
            self.held -= heapq.heappop(self.expiring)[2].size
        if self.held + size > self.limit:
            return None
        self.held += size
        return Reservation(self, size)
