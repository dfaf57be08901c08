"""A resume's events: a stream's log read back from Memcached, then followed as it grows.

``StoredStream`` reads as a flight's listener does (app/streams/listener.py), so the relay
(app/streams/relay.py) sends a resume exactly as it sends a live stream: events with their
ids, pings while it waits, the end (or one error event). It reads the chunks written so far
(app/resume/record.py), then polls the open chunk every ``POLL_S`` for the rest; the relay
leaves out the events the caller already has. While it reads it keeps the stream's ``resumed_key``
alive, so the writer does not stop a stream someone came back to. A log that stops growing
before its end (its writer's worker died, Memcached lost an item its writer could not write
again) ends the resume with an error event once the stream's own deadline has passed, or
within two seconds when its writer stopped the stream and deleted the log: never silence,
never a hang.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import gevent

from app.core.errors import GatewayError
from app.resume import ids
from app.resume.record import ENDED, SEALED, LogFault, decode_chunk
from app.resume.writer import Store
from app.streams.answer import Finished, Head
from llmgate_wire import sse

POLL_S = 0.1
CHECK_S = 1.0  # how often a waiting resume looks whether its stream was stopped


class StoredStream:
    """The events of one stream's log, then its end; ``after``: the caller has those up to
    there (the relay does not send them again)."""

    def __init__(
        self,
        store: Store,
        key: str,
        *,
        after: int,
        window_s: int,
        patience_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = gevent.sleep,
    ) -> None:
        self.store, self.key, self.window_s = store, key, window_s
        # Every event is handed out, from the first: the relay reads those up to ``after``
        # for how the stream ended and sends the rest (app/streams/relay.py).
        self.position = 0  # the number of the last event handed out
        self.after = after
        self.replayed = 0  # events after ``after`` that were in the log when the resume began
        self._seen = 0  # events of the log read so far
        self._index = 0  # the chunk being read
        self._in_chunk = 0  # events of that chunk already read
        self._ready: deque[sse.Event] = deque()
        self._end: Finished | GatewayError | None = None
        self._clock, self._sleep = clock, sleep
        self._patience = patience_s  # how long a log may stay still before it counts as lost
        self._grew_at = clock()
        self._marked_at: float | None = None
        self._looked_at = clock()
        self._missing = False  # the meta item was missing at the last look
        self._live = False  # the first read is done: later events are live, not replayed

    # -- as relay() reads a listener ------------------------------------------------------
    def wait_head(self, timeout: float | None) -> Head:
        return Head(200, [], 1, None, "")

    def next_item(self, timeout: float | None) -> sse.Event | Finished | GatewayError | None:
        """The next event, the end once every event is out, None when ``timeout`` passed."""
        if not self._wait(timeout):
            return self._end
        self.position += 1
        return self._ready.popleft()

    def next_batch(self, timeout: float | None) -> list[sse.Event] | Finished | GatewayError | None:
        """Every event read back and not yet out (at least one), else as ``next_item``."""
        if not self._wait(timeout):
            return self._end
        return self.ready_events()

    def _wait(self, timeout: float | None) -> bool:
        """Until events are ready (True), or the end is (False, ``_end`` set) or ``timeout``
        passed (False, ``_end`` None)."""
        until = None if timeout is None else self._clock() + timeout
        while True:
            if not self._ready and self._end is None:
                self._read()
            if self._ready:
                return True
            if self._end is not None:
                return False
            now = self._clock()
            if now - self._grew_at > self._patience or not self._still_there(now):
                self._end = LogFault("The stream's log stopped before its end.")
                continue
            if until is not None and now >= until:
                return False
            self._sleep(POLL_S if until is None else max(0.0, min(POLL_S, until - now)))

    def ready_events(self) -> list[sse.Event]:
        """The events read back and not yet out, without waiting."""
        events = list(self._ready)
        self._ready.clear()
        self.position += len(events)
        return events

    # -- the log --------------------------------------------------------------------------
    def _read(self) -> None:
        """Every chunk there is now, from where the last read stopped."""
        self._mark()
        while True:
            data = self.store.get(ids.chunk_key(self.key, self._index))
            if data is None:
                break
            chunk = decode_chunk(data)
            if chunk is None:
                self._end = LogFault("The stream's log is damaged; it cannot be resumed.")
                break
            for raw in chunk.events[self._in_chunk :]:
                self._seen += 1
                # As the log has it, parsed or not: nothing logged is left out.
                self._ready.append(sse.Decoder.event_of(raw) or sse.Event(raw))
                self.replayed += not self._live and self._seen > self.after
            if len(chunk.events) > self._in_chunk:
                self._grew_at = self._clock()
            self._in_chunk = len(chunk.events)
            if chunk.state == ENDED:
                self._end = chunk.end
                break
            if chunk.state != SEALED:
                break
            self._index, self._in_chunk = self._index + 1, 0
        self._live = True

    def _still_there(self, now: float) -> bool:
        """Whether the log's meta item is still there, looked at once a second while the log
        does not grow: its writer deletes it when it stops the stream (app/resume/writer.py).
        Missing at two looks in a row: one look may fall between a Memcached restart and
        the writer's rewrite of what it lost (within a second, ``CHECK_S`` there)."""
        if now - self._looked_at < CHECK_S:
            return True
        self._looked_at = now
        if self.store.get(self.key) is not None:
            self._missing = False
            return True
        missing, self._missing = self._missing, True
        return not missing

    def _mark(self) -> None:
        """Tell the writer someone reads this stream (at most once a third of the window)."""
        now = self._clock()
        if self._marked_at is None or now - self._marked_at >= self.window_s / 3:
            self._marked_at = now
            self.store.set(ids.resumed_key(self.key), b"1", self.window_s)
