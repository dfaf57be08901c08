"""A flight's event log: every event of the answer while it can still serve someone who has
not read it yet, otherwise only what its readers have yet to read.

The whole log is kept (``keep``) while it can serve a cache entry or a coalesced follower yet
to come, up to ``limit`` bytes of payload and while the worker's log memory budget has room
(app/streams/log_memory.py: the log takes its share event by event). Past either, the log is
given up: from then on it holds only the events some reader has not passed, which the flight
trims as readers move on (``trim``, in batches), and its share of the budget shrinks to that.
Events are numbered from the answer's first: event ``n`` is at ``n - dropped`` while it is
held. No I/O here; the flight (app/streams/flight.py) decides when to trim and release.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from app.streams.log_memory import LogBudget, LogShare, event_cost
from llmgate_wire import sse

TOO_LARGE, LOG_MEMORY = "too_large", "log_memory"


class EventLog:
    def __init__(self, *, keep: bool, limit: int | None, budget: LogBudget | None) -> None:
        self.held: list[sse.Event] = []  # events from number ``dropped`` on
        self.dropped = 0
        self.bytes = 0  # payload bytes of every event while the whole log is kept
        self.keep = keep
        self.whole = keep  # every event since the first is held
        self.limit = limit
        self.given_up = ""  # why the whole log was given up: TOO_LARGE or LOG_MEMORY
        # The log's share of the worker's budget, given back when the log is given up or
        # nobody reads it any more (``release``); and, should a flight ever be dropped with a
        # listener that never left, when the log is collected with it.
        self._share = LogShare(budget) if budget is not None and keep else None
        if self._share is not None:
            weakref.finalize(self, self._share.release).atexit = False

    @property
    def count(self) -> int:
        """Events added so far (held or dropped)."""
        return self.dropped + len(self.held)

    @property
    def events(self) -> list[sse.Event]:
        """Every event of the answer; only while the log is whole."""
        if not self.whole:
            raise RuntimeError("the event log was given up")
        return self.held

    def add(self, events: Sequence[sse.Event], size: int) -> str:
        """Events that arrived together, ``size`` payload bytes. While the whole log is kept:
        the reason it must be given up now (past its limit: TOO_LARGE; no room in the
        budget: LOG_MEMORY), else ""."""
        self.held.extend(events)
        if not self.keep:
            return ""
        self.bytes += size
        if self.limit is not None and self.bytes > self.limit:
            return TOO_LARGE
        if self._share is not None and not self._share.take(sum(map(event_cost, events))):
            return LOG_MEMORY
        return ""

    def between(self, start: int, until: int) -> list[sse.Event]:
        """The events numbered ``start`` up to ``until`` (exclusive), all still held."""
        first = start - self.dropped
        return self.held[first : first + until - start]

    def give_up(self, reason: str, low: int) -> None:
        """Stop keeping the whole log: no entry, no new followers; memory follows readers
        (``low``: the number of the next event the slowest reader reads)."""
        self.keep = self.whole = False
        self.given_up = reason
        self.trim(low)
        if self._share is not None:
            # What is left is what a reader has yet to read: held until the flight is done.
            self._share.keep_only(sum(map(event_cost, self.held)))

    def trim(self, low: int) -> None:
        """Drop the events before number ``low`` (in batches: amortised O(1))."""
        passed = low - self.dropped
        if passed >= 64 or (passed > 0 and passed * 2 >= len(self.held)):
            del self.held[:passed]
            self.dropped = low

    def release(self) -> None:
        """The log serves nobody any more: its share of the budget goes back."""
        if self._share is not None:
            self._share.release()
