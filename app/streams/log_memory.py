"""The memory budget of kept event logs: one per worker, shared by all its flights. No I/O here.

A flight keeps its whole event log while the log can serve a cache entry or a coalesced
follower (app/streams/flight.py). Each flight's log is bounded by ``LLMGATE_CACHE_MAX_ENTRY_BYTES``
of payload, but nothing bounded their sum, and a kept event costs far more than its bytes on the
wire: an ``sse.Event`` object, its ``raw`` bytes and its decoded ``data`` text (about the same
size again), the ``event`` name of a typed stream, and a slot in the log's list. A chat chunk
of ~180 bytes holds ~575 bytes of Python objects.

So the budget (``LLMGATE_LOG_MEMORY_BYTES``) counts that memory, estimated per event by
``event_cost``. A stream starting while the budget is full keeps no log from the start; a
flight that cannot get room for its next events gives its log up (app/streams/flight.py: from
then on it is neither stored nor joined, and its readers still get every event). A flight gives
its share back when its log is given up or when it ended and its last listener left.

Plain counters: one budget per worker, touched only by that worker's greenlets, which switch
only at I/O - never between a check and its update.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from llmgate_wire.sse import Event

# Per kept event, beyond sys.getsizeof of its bytes and text: the Event instance with its
# attribute values, and its slot in the log's list. Measured with tracemalloc on CPython
# 3.11 (the log of 20,000 decoded chat chunks, and of Responses events, 4 KB and 64 KB events:
# 136-138 bytes each above the getsizeof of raw, data and event);
# tests/unit/streams/test_log_memory.py measures it again, so a Python that grows the Event
# fails there.
EVENT_OVERHEAD = 136
# The gauge of held bytes is told of changes this large (or of an empty budget): a metrics
# write per published event would cost a fair share of relaying one.
REPORT_STEP = 64 * 1024

# What happened, and the bytes every kept log of the worker holds now. What happened is
# "held" (the held bytes moved), or "refused_start" / "refused_running": a flight kept no
# log from its start, or gave its log up on the way, because the budget was full.
Observer = Callable[[str, int], None]


def event_cost(event: Event, size: Callable[[object], int] = sys.getsizeof) -> int:
    """The memory one event in a kept log holds, in bytes (see EVENT_OVERHEAD). Once per
    kept event, so written out rather than looped: ~0.2 us."""
    cost = EVENT_OVERHEAD + size(event.raw)
    if event.data is not None:
        cost += size(event.data)
    if event.event is not None:
        cost += size(event.event)
    if event.id is not None:
        cost += size(event.id)
    if event.comments:
        cost += sum(size(comment) + 8 for comment in event.comments)  # 8: its tuple slot
    return cost


class LogBudget:
    """The bytes this worker's kept event logs may hold together (``limit``; 0: none)."""

    def __init__(self, limit: int, observe: Observer | None = None) -> None:
        self.limit = limit
        self.held = 0
        self._observe = observe
        self._reported = 0

    def admit(self) -> bool:
        """May a new flight start a log? Counted as refused when it may not."""
        if self.held < self.limit:
            return True
        self._tell("refused_start")
        return False

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes, or nothing (refused) when they do not fit."""
        if self.held + size > self.limit:
            self._tell("refused_running")
            return False
        self.held += size
        if self.held - self._reported >= REPORT_STEP:
            self._tell("held")
        return True

    def give_back(self, size: int) -> None:
        if not 0 <= size <= self.held:
            raise ValueError(f"giving back {size} bytes of {self.held} held")
        self.held -= size
        if self._reported - self.held >= REPORT_STEP or (self.held == 0 and self._reported):
            self._tell("held")

    def _tell(self, what: str) -> None:
        self._reported = self.held
        if self._observe is not None:
            self._observe(what, self.held)


class LogShare:
    """One flight's share of the budget: what its log holds, given back at once or in part."""

    def __init__(self, budget: LogBudget) -> None:
        self.budget = budget
        self.held = 0

    def take(self, size: int) -> bool:
        if not self.budget.take(size):
            return False
        self.held += size
        return True

    def keep_only(self, size: int) -> None:
        """Give back all but ``size`` bytes (what the log still holds)."""
        extra = self.held - size
        if extra > 0:
            self.budget.give_back(extra)
            self.held = size

    def release(self) -> None:
        self.keep_only(0)
