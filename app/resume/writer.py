"""A resumable stream's log, written to Memcached as the answer passes (docs/streams.md).

The writer is one more listener of the stream's flight (app/streams/flight.py), in its own
greenlet. Being a listener is what keeps the answer going when the caller leaves: a flight
is cancelled only when its last listener leaves, so the upstream is read to the end and the
answer billed once, complete for a resume. The writer leaves early in one case: its caller
has been gone for the whole window and nobody resumed (the stream's ``resumed_key`` is not
there), so the rest would be pure cost; or its owner deleted the stream (``deleted_key``,
looked at once a second). It then deletes the log (a late resume gets the 404) and, when it
is the last listener, cancels the upstream call.

What it writes (app/resume/record.py): the meta item first, by ``open`` in the caller's
greenlet before the stream is promised resumable (a Memcached that does not take it means
the stream is not resumable, said in its headers); then events into the current chunk,
rewritten at most every ``FLUSH_S`` (and at once when it seals, at ``SEAL_BYTES``, and at
the end). While the stream runs its items live as long as the stream may (its deadline)
plus the window; at the end each is given the window, so the log is gone from Memcached
``window`` seconds after the stream's end. A log past ``cap`` bytes stops: its last chunk
says so (overflow) and the writer leaves.

A log Memcached loses while the stream runs (a node restarted or replaced, a write refused)
is written again whole: the writer keeps the sealed chunks it wrote (charged to the
stream's share of the kept-log memory, app/streams/log_memory.py), renews the meta item at
each write (a ``touch``, which also says whether it is still there) and, when it is gone or
a write failed, writes the meta and every chunk again, at each later write until Memcached
takes them all. The answer is read on meanwhile: a stream promised resumable is never
abandoned because of Memcached. Only a log the worker had no memory to keep is given up
(``withdrawn``: the caller is told in-stream, app/streams/relay.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import gevent

from app.request.events import TERMINAL_TYPES, data_of, event_type, is_error_event
from app.request.routes import NAMED, TYPED, Route
from app.request.usage import Usage, may_carry_usage, usage_in_event
from app.resume import ids
from app.resume.record import ENDED, OPEN, SEAL_BYTES, SEALED, Meta, encode_chunk, end_record
from app.streams.answer import ClientGone, Finished
from app.streams.flight import Flight
from app.streams.log_memory import LogShare
from llmgate_wire import sse

log = logging.getLogger("llmgate.resume")

FLUSH_S = 0.1  # the longest an event waits before a resume on another worker can read it
CHECK_S = 1.0  # how often a writer with nothing to write looks whether its caller is back


class Store(Protocol):
    """What a log needs of Memcached (app/store/memcached.py; app/store/memory.py without
    one)."""

    def get(self, key: str) -> bytes | None: ...

    def lookup(self, key: str) -> bytes | None:
        """``get``, raising when the store could not answer (not a miss)."""

    def set(self, key: str, value: bytes, ttl: int) -> bool: ...

    def delete(self, key: str, *, force: bool = False) -> None: ...

    def touch(self, key: str, ttl: int) -> bool: ...


class Deleted(Exception):
    """The stream's owner deleted it while it was being written (DELETE /v1/streams/{id})."""


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
        share: LogShare | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.key, self.flight, self.meta = store, key, flight, meta
        self.window_s, self.cap = window_s, cap
        self.lifetime_s = lifetime_s  # how long the stream may still run (its deadline)
        # While it runs each item lives as long as the stream may, plus the window.
        self._live_ttl = int(lifetime_s) + window_s + 1
        self.usage: Usage | None = None  # the answer's usage as it passed (the settlement's)
        self._end = meta.route.end
        self._saw_end = self._saw_error = False
        self._whole = False  # the answer reached its end as the caller's relay would bill it
        # How the log ended: complete, abandoned, deleted, overflow, withdrawn, failed.
        self.how = "failed"
        self.finished = False
        self.withdrawn: str | None = None  # why the log was given up while the stream ran
        self._waiting: list[Callable[[], None]] = []
        self._on_end = on_end
        self._share = share  # what the sealed chunks kept for a rewrite are charged to
        self._clock = clock
        # Joined now, before the flight's greenlet runs: the log starts at the first event.
        self.listener = flight.join()
        self._chunk: list[bytes] = []
        self._chunk_bytes = 0
        self._index = 0
        self._sealed: list[bytes] | None = []  # the sealed chunks as written; None: not kept
        self._current = encode_chunk([], OPEN)  # the chunk being written, as last encoded
        self._lost = False  # Memcached lost (or refused) part of the log: write it all again
        self._written = 0
        self._alone_since: float | None = None

    def open(self) -> bool:
        """Write the meta item (in the caller's greenlet, before anything promises a
        resume) and start writing the events; False when Memcached did not take it: the
        stream is not resumable, and the writer leaves the flight."""
        if not self.store.set(self.key, self.meta.encode(), self._live_ttl):
            self.listener.leave()
            return False
        gevent.spawn(self._run)
        return True

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
        except ClientGone:
            self._forget()  # dropped as too slow: no log to resume
        except Deleted:
            self.how = "deleted"
            self._forget()  # what this writer wrote since the owner's DELETE
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
        live_ttl = self._live_ttl
        started = self._clock()
        last_flush, last_check, pending = started, started, False
        while True:
            wait = max(0.0, FLUSH_S - (self._clock() - last_flush)) if pending else CHECK_S
            item = self.listener.next_batch(wait)
            if self._clock() - last_check >= CHECK_S:
                last_check = self._clock()
                if self._gave_up():
                    return
                if not pending and not self._lost:
                    self._lost = not self.store.touch(self.key, live_ttl)
                if self._lost and not self._rewrite(live_ttl):
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
                    if not self._keep_sealed():
                        return
                    self._index, self._chunk, self._chunk_bytes = self._index + 1, [], 0
                    self._current = encode_chunk([], OPEN)
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
        """The current chunk written; the meta item renewed, which says it is still there.
        A log found lost is written again whole (``_rewrite``)."""
        data = encode_chunk(self._chunk, state, end)
        self._current = data
        if self._lost:
            self._rewrite(ttl)
            return
        written = self.store.set(ids.chunk_key(self.key, self._index), data, ttl)
        self._lost = not (written and self.store.touch(self.key, ttl))
        if self._lost:
            self._rewrite(ttl)

    def _keep_sealed(self) -> bool:
        """The chunk just sealed kept for a rewrite, charged to the stream's share of the
        kept-log memory; without room the log is kept no more, and if Memcached has lost it
        meanwhile it is given up (False: the writer leaves)."""
        data = self._current
        if self._sealed is not None:
            if self._share is None or self._share.take(len(data)):
                self._sealed.append(data)
            else:
                self._drop_sealed()
        return not self._lost or self._rewrite(self._live_ttl)

    def _drop_sealed(self) -> None:
        if self._sealed is not None and self._share is not None:
            self._share.keep_only(self._share.held - sum(map(len, self._sealed)))
        self._sealed = None

    def _rewrite(self, ttl: int) -> bool:
        """Write the whole log again, the meta item first: True once Memcached took all of
        it (or will be asked again at the next write), False when it cannot be (the sealed
        chunks were not kept): the log is withdrawn and deleted."""
        if self.store.get(ids.deleted_key(self.key)) is not None:
            raise Deleted()  # its owner deleted it, the meta with it: nothing is written again
        if self._sealed is None and self._index:
            self.withdrawn = self.how = "withdrawn"
            log.warning(
                "resumable stream log lost by memcached and not kept here (request %s); "
                "the stream is no longer resumable",
                self.flight.request_id or "-",
            )
            self._forget()
            return False
        items = [(self.key, self.meta.encode())]
        items += [(ids.chunk_key(self.key, i), data) for i, data in enumerate(self._sealed or [])]
        items.append((ids.chunk_key(self.key, self._index), self._current))
        if all(self.store.set(key, value, ttl) for key, value in items):
            if self._lost:
                log.warning(
                    "resumable stream log written again after memcached lost it (request %s)",
                    self.flight.request_id or "-",
                )
            self._lost = False
        else:
            self._lost = True
        return True

    def _ended(self) -> None:
        """The stream ended: every item of the log gets the window from now (written again
        with it, when Memcached lost any; and again every ``CHECK_S`` until Memcached takes
        it, within the window: no event will come to try again at)."""
        if not self._lost:
            for key in [self.key, *(ids.chunk_key(self.key, i) for i in range(self._index))]:
                if not self.store.touch(key, self.window_s):
                    self._lost = True
                    break
        until = self._clock() + self.window_s
        while self._lost:
            self._rewrite(self.window_s)
            if not self._lost or self._clock() >= until:
                return
            gevent.sleep(CHECK_S)

    def _gave_up(self) -> bool:
        """Whether the stream stops here: its owner deleted it (DELETE /v1/streams/{id}),
        or its caller has been gone for the whole window with nobody resuming. The log is
        deleted and the writer leaves (cancelling the upstream call when it was the last
        listener)."""
        if self.store.get(ids.deleted_key(self.key)) is not None:
            self.how = "deleted"
            self._forget()
            return True
        if self.flight.listeners > 1:  # the caller (or a follower) still reads
            self._alone_since = None
            return False
        now = self._clock()
        if self._alone_since is None:
            self._alone_since = now
        if now - self._alone_since < self.window_s:
            return False
        if self.store.get(ids.resumed_key(self.key)) is not None:
            self._alone_since = now  # someone resumed: give them another window
            return False
        self.how = "abandoned"
        self._forget()
        return True

    def _forget(self) -> None:
        """Delete what was written, as far as Memcached lets us."""
        for key in [self.key, *(ids.chunk_key(self.key, i) for i in range(self._index + 1))]:
            self.store.delete(key)


def _usage_after(route: Route, raw: bytes, usage: Usage | None) -> Usage | None:
    """The answer's usage once the event ``raw`` passed (as app/edge/finish.py reads it from
    what a caller receives, here for a caller who may have left)."""
    if route.events == NAMED:
        kind = event_type(raw)
        if kind not in ("message_start", "message_delta"):
            return usage
        data = data_of(raw)
        holder = data.get("message") if kind == "message_start" and isinstance(data, dict) else data
        found = Usage.of(holder.get("usage")) if isinstance(holder, dict) else None
        return usage if found is None else found if usage is None else usage.merged(found)
    if route.events == TYPED:
        if event_type(raw) not in TERMINAL_TYPES:
            return usage
        data = data_of(raw)
        response = data.get("response") if isinstance(data, dict) else None
        found = Usage.of(response.get("usage")) if isinstance(response, dict) else None
        return found or usage
    if raw.startswith(b"data: ") and may_carry_usage(raw):
        return usage_in_event(raw) or usage
    return usage
