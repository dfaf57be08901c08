"""A resumable stream's log, written to Memcached as the answer passes (docs/streams.md).

The writer is one more listener of the stream's flight (app/streams/flight.py), in its own
greenlet. Being a listener is what keeps the answer going when the caller leaves: a flight
is cancelled only when its last listener leaves, so the upstream is read to the end and the
answer billed once, complete for a resume. The writer leaves early in one case: its caller
has been gone for the whole window and nobody resumed (the stream's ``resumed_key`` is not
there), so the rest would be pure cost; or its owner deleted the stream (a client that stopped
reading early, ``deleted_key``), looked at once a second while the caller is gone. It then
deletes the log (a late resume gets the 404) and, the last listener, cancels the upstream
call.

What it writes (app/resume/record.py): the meta item first, then events into the current
chunk, rewritten at most every ``FLUSH_S`` (and at once when it seals, at ``SEAL_BYTES``,
and at the end). While the stream runs its items live as long as the stream may (its
deadline) plus the window; at the end each is given the window, so the log is gone from
Memcached ``window`` seconds after the stream's end. A log past ``cap`` bytes stops: its last
chunk says so (overflow) and the writer leaves. A write Memcached refuses stops the log the
same way as far as it can (a resume then finds nothing more and ends with an error event).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import gevent

from app.request.events import END_OF_STREAM, TERMINAL_TYPES, data_of, event_type, is_error_event
from app.request.usage import Usage, may_carry_usage, usage_in_event
from app.resume import ids
from app.resume.record import ENDED, OPEN, SEAL_BYTES, SEALED, Meta, encode_chunk, end_record
from app.streams.answer import ClientGone, Finished
from app.streams.flight import Flight
from llmgate_wire import sse

log = logging.getLogger("llmgate.resume")

FLUSH_S = 0.1  # the longest an event waits before a resume on another worker can read it
CHECK_S = 1.0  # how often a writer with nothing to write looks whether its caller is back


class Store(Protocol):
    """What a log needs of Memcached (app/cache/memcached.py; app/cache/memory.py without
    one)."""

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes, ttl: int) -> bool: ...

    def delete(self, key: str, *, force: bool = False) -> None: ...

    def touch(self, key: str, ttl: int) -> bool: ...


class LogFailed(Exception):
    """Memcached did not take a write: the log stops."""


class LogWriter:
    def __init__(
        self,
        store: Store,
        key: str,
        flight: Flight,
        meta: Meta,
        *,
        window_s: int,
        cap: int,
        lifetime_s: float,
        on_end: Callable[[LogWriter], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.key, self.flight, self.meta = store, key, flight, meta
        self.window_s, self.cap = window_s, cap
        self.lifetime_s = lifetime_s  # how long the stream may still run (its deadline)
        self.usage: Usage | None = None  # the answer's usage as it passed (the settlement's)
        self._end = END_OF_STREAM.get(meta.route)
        self._saw_end = self._saw_error = False
        self._whole = False  # the answer reached its end as the caller's relay would bill it
        self.how = "failed"  # how the log ended: complete, abandoned, deleted, overflow, failed
        self.finished = False
        self._waiting: list[Callable[[], None]] = []
        self._on_end = on_end
        self._clock = clock
        # Joined now, before the flight's greenlet runs: the log starts at the first event.
        self.listener = flight.join()
        self._chunk: list[bytes] = []
        self._chunk_bytes = 0
        self._index = 0
        self._written = 0
        self._alone_since: float | None = None
        gevent.spawn(self._run)

    @property
    def bill(self) -> Usage | None:
        """The answer's usage when it is the upstream's bill for the whole answer (the
        stream reached its route's end without an error, and the usage is not a
        translation's estimate), as app/edge/finish.py bills a caller who read to the end;
        else None: the call keeps its reservation."""
        return self.usage if self._whole else None

    def when_finished(self, then: Callable[[], None]) -> None:
        """Run ``then`` once the writer is done (at once if it is)."""
        if self.finished:
            then()
        else:
            self._waiting.append(then)

    # -- the greenlet ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._write()
        except (ClientGone, LogFailed):
            self._forget()  # dropped as too slow, or Memcached failed: no log to resume
        except Exception:
            log.exception("resumable log failed (request %s)", self.flight.request_id or "-")
            self._forget()
        finally:
            self.listener.leave()
            self.finished = True
            self._on_end(self)
            for then in self._waiting:
                then()

    def _write(self) -> None:
        started = self._clock()
        live_ttl = int(self.lifetime_s) + self.window_s + 1
        self._set(self.key, self.meta.encode(), live_ttl)
        last_flush, last_check, pending = started, started, False
        while True:
            wait = max(0.0, FLUSH_S - (self._clock() - last_flush)) if pending else CHECK_S
            item = self.listener.next_batch(wait)
            if self._clock() - last_check >= CHECK_S:
                last_check = self._clock()
                if self._gave_up():
                    return
            if item is None:
                if pending:
                    self._flush(OPEN, live_ttl)
                    last_flush, pending = self._clock(), False
                continue
            if isinstance(item, list):
                if not self._add(item):
                    self._flush(ENDED, self.window_s, end_record(None))
                    self._ended()
                    self.how = "overflow"  # the writer leaves: a caller gone, no one to pay for
                    return
                if self._chunk_bytes >= SEAL_BYTES:
                    self._flush(SEALED, live_ttl)
                    self._index, self._chunk, self._chunk_bytes = self._index + 1, [], 0
                    last_flush, pending = self._clock(), False
                elif self._clock() - last_flush >= FLUSH_S:
                    self._flush(OPEN, live_ttl)
                    last_flush, pending = self._clock(), False
                else:
                    pending = True
                continue
            self._flush(ENDED, self.window_s, end_record(item))
            self._ended()
            self.how = "complete"
            if isinstance(item, Finished):
                ended = self._saw_end or self._end is None
                self._whole = ended and not self._saw_error and not item.usage_estimated
            return

    def _add(self, batch: list[sse.Event]) -> bool:
        """The events into the current chunk and the usage; False past the log's cap."""
        for event in batch:
            raw = event.raw
            self._written += len(raw)
            if self._written > self.cap:
                return False
            self._chunk.append(raw)
            self._chunk_bytes += len(raw)
            self.usage = _usage_after(self.meta.route, raw, self.usage)
            if not self._saw_error and is_error_event(event):
                self._saw_error = True
            if not self._saw_end and self._end is not None and self._end.ends(event):
                self._saw_end = True
        return True

    def _flush(self, state: bytes, ttl: int, end: dict | None = None) -> None:
        self._set(ids.chunk_key(self.key, self._index), encode_chunk(self._chunk, state, end), ttl)

    def _ended(self) -> None:
        """The stream ended: every item of the log gets the window from now."""
        for key in [self.key, *(ids.chunk_key(self.key, i) for i in range(self._index))]:
            self.store.touch(key, self.window_s)

    def _gave_up(self) -> bool:
        """Whether the stream stops here, its caller gone: its owner deleted it (DELETE
        /v1/streams/{id}), or it has been alone for the whole window with nobody resuming.
        The log is deleted and the writer leaves (cancelling the upstream call)."""
        if self.flight.listeners > 1:  # the caller (or a follower) still reads
            self._alone_since = None
            return False
        now = self._clock()
        if self._alone_since is None:
            self._alone_since = now
        if self.store.get(ids.deleted_key(self.key)) is not None:
            self.how = "deleted"
        elif now - self._alone_since < self.window_s:
            return False
        elif self.store.get(ids.resumed_key(self.key)) is not None:
            self._alone_since = now  # someone resumed: give them another window
            return False
        else:
            self.how = "abandoned"
        self._forget()
        return True

    def _forget(self) -> None:
        """Delete what was written, as far as Memcached lets us."""
        for key in [self.key, *(ids.chunk_key(self.key, i) for i in range(self._index + 1))]:
            self.store.delete(key)

    def _set(self, key: str, value: bytes, ttl: int) -> None:
        if not self.store.set(key, value, ttl):
            raise LogFailed(key)


def _usage_after(route: str, raw: bytes, usage: Usage | None) -> Usage | None:
    """The answer's usage once the event ``raw`` passed (as app/edge/finish.py reads it from
    what a caller receives, here for a caller who may have left)."""
    if route == "messages":
        kind = event_type(raw)
        if kind not in ("message_start", "message_delta"):
            return usage
        data = data_of(raw)
        holder = data.get("message") if kind == "message_start" and isinstance(data, dict) else data
        found = Usage.of(holder.get("usage")) if isinstance(holder, dict) else None
        return usage if found is None else found if usage is None else usage.merged(found)
    if route == "responses":
        if event_type(raw) not in TERMINAL_TYPES:
            return usage
        data = data_of(raw)
        response = data.get("response") if isinstance(data, dict) else None
        found = Usage.of(response.get("usage")) if isinstance(response, dict) else None
        return found or usage
    if raw.startswith(b"data: ") and may_carry_usage(raw):
        return usage_in_event(raw) or usage
    return usage
