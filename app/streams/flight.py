"""An answer produced once in its own greenlet and read, live, by one or more callers.

A ``Flight`` runs a producer (normally one upstream exchange, app/streams/upstream_call.py) in
a greenlet. The producer publishes the head (status, headers; the whole body for a
non-stream answer), then each SSE event, then the end. Events go into a log any number of
listeners read: the caller who started it, and identical requests that coalesced onto it, a
late joiner reading the events so far and then the live ones.

Memory stays bounded: the whole log is kept only while it can serve a cache entry or a
follower (``keep_log``, up to ``log_limit`` and while the worker's log memory budget has room,
app/streams/log_memory.py); otherwise events every reader has passed are dropped, and a reader more
than ``buffer_limit`` bytes behind holds the producer back (back-pressure onto the upstream
read). The producer is cancelled only when no listener is left, and its ``finally`` closes
the upstream response.

Its life is a table of allowed moves (app/streams/flight_life.py draws it), kept in one field
and moved only by its own methods, each of which looks its move up first: a head after the
end or a second end raises IllegalMove instead of passing. The producer moves it
(``publish_head``, ``publish_all``, then ``finish`` or ``fail``, or an exception); the last
listener to leave an unfinished flight cancels it (``cancel``); the drain ends it for
everyone (``shut_down``, app/streams/drain.py); it settles once the producer is done and
``on_done`` ran (the answer is stored first), and only then do listeners see the end or a
whole body. The moves are per flight, not per event: a batch of events costs one comparison.
Whoever starts a flight says its shape (``stream``), where its answer comes from
(``source``: the upstream, a stored entry, or another process's call it waits for under the
cache lease) and whether it holds that lease; a producer that learns better says so
(``answered_from``, ``took_lease``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import gevent
import gevent.event

from app.core.errors import ClientTooSlow, GatewayError, UpstreamProtocolError
from app.core.moves import after
from app.core.timers import Alarm
from app.observe.tracing import Span
from app.streams import flight_life as life
from app.streams.answer import CACHE, LEASE, UPSTREAM, ClientGone, Finished, Head
from app.streams.event_log import TOO_LARGE, EventLog
from app.streams.flight_life import STREAMING, WAITING
from app.streams.listener import Listener
from app.streams.log_memory import LogBudget
from llmgate_wire import sse

log = logging.getLogger("llmgate.relay")


Producer = Callable[["Flight"], None]
__all__ = ["CACHE", "LEASE", "UPSTREAM", "ClientGone", "Finished", "Flight", "Head", "Producer"]


def producer_failed(request_id: str) -> GatewayError:
    """A bug, or input nothing else caught, while producing an answer (call it in the
    ``except`` block: the log gets the traceback): the callers get this error, never silence."""
    log.exception("answer producer failed (request %s)", request_id or "-")
    return UpstreamProtocolError("The answer could not be relayed; the log says why.")


class Flight:
    """One answer in the making: a head, a log of events, an end; read by many listeners.

    The event log is kept whole only while it can still serve a cache entry or a coalesced
    follower yet to come (``keep_log``). Past ``log_limit`` bytes, or when ``log_budget`` has
    no room for its next events, it is given up: no more logging, no new followers, no entry;
    the listeners already reading still get every event. Without a whole log, events every
    reading listener has passed are dropped: a stream nobody else needs holds only the events
    its caller has yet to read."""

    def __init__(
        self,
        producer: Producer,
        *,
        on_done: Callable[[Flight], None] | None = None,
        keep_log: bool = True,
        log_limit: int | None = None,
        log_budget: LogBudget | None = None,
        buffer_limit: int | None = None,
        send_timeout: float | None = None,
        request_id: str = "",
        stream: bool = False,
        source: str = UPSTREAM,
        lease_held: bool = False,
        span: Span | None = None,
        started: float | None = None,
    ):
        self.head: Head | None = None
        self.log = EventLog(keep=keep_log, limit=log_limit, budget=log_budget)
        # Without a whole log, at most ``buffer_limit`` bytes of events wait for the slowest
        # reader: beyond it the producer stops reading the upstream until the reader catches
        # up, and a reader that takes nothing for ``send_timeout`` seconds is dropped.
        self.buffer_limit = buffer_limit
        self.send_timeout = send_timeout
        self.bytes_published = 0
        self._drained = gevent.event.Event()
        self.end: Finished | GatewayError | None = None
        self.listeners = 0
        self._readers: set[Listener] = set()
        # Its life (app/streams/flight_life.py), moved only by ``_move``, which keeps in plain
        # fields what the listeners see and what their every wait reads: ``settled`` (on_done
        # ran: the end is told) and ``cancelled``.
        self._life = self._seen = WAITING
        self.settled = self.cancelled = False
        # When the call began (monotonic): now, or earlier for a call that began outside a
        # flight and goes on in one (app/streams/alone.py).
        self.started = time.monotonic() if started is None else started
        self.finished_at: float | None = None
        self.head_at: float | None = None
        self.request_id = request_id  # of the caller that started it, for the log
        # Said by whoever starts the flight: the answer's shape, where it comes from, and
        # whether this process holds the cross-process lease for its key.
        self.stream = stream
        self._source = source
        self._lease_held = lease_held
        self.span = span  # the leader's request span (tracing on): followers link to it
        self._changed = gevent.event.Event()
        self._on_done = on_done
        self._greenlet = gevent.spawn(self._run, producer)

    # -- producing (in the flight's greenlet) ----------------------------------------------
    def _run(self, producer: Producer) -> None:
        try:
            producer(self)
        except GatewayError as exc:
            self.fail(exc)
        except Exception:
            self.fail(producer_failed(self.request_id))
        finally:
            self.finished_at = time.monotonic()
            if self._life in life.UNFINISHED:
                self._move(life.CANCEL)  # it stopped with no end
            try:
                if self._on_done is not None:
                    # Before the listeners learn of the end: a caller who repeats its request
                    # the moment it has the whole answer finds the entry stored and the
                    # flight gone, not a finished call to join as a follower.
                    self._on_done(self)
            finally:
                self._settle()

    def _move(self, move: str) -> None:
        """Make ``move``; IllegalMove, and nothing changes, when the table does not allow it."""
        self._life = state = after(life.LIFE, "a flight", self._life, move)
        seen, self.settled, self.cancelled = life.FACTS[state]
        if seen is not None:
            self._seen = seen

    def _settle(self) -> None:
        """The producer is done and on_done ran (or never will): the end is told."""
        self._move(life.SETTLE)
        self._release_log()
        self._notify()

    def answered_from(self, source: str) -> None:
        """The producer found where the answer comes from: a stored entry (CACHE) or its own
        upstream call (UPSTREAM), after waiting under another process's lease."""
        self._source = source

    def took_lease(self) -> None:
        """The producer took over the cache lease of a holder that let it lapse."""
        self._lease_held = True

    def publish_head(self, head: Head, *, at: float | None = None) -> None:
        """The answer's head (a stream's, or a whole body). ``at``: when the upstream's answer
        began (its ``head_at``, on the monotonic clock); None when it is not the answer's
        first byte (a stream that ended with no event, a stored entry replayed)."""
        self._move(life.HEAD if head.body is None else life.BODY)
        self.head = head
        if at is not None:
            self.head_at = at
        if head.body is None:
            self._notify()  # a stream starts; a whole body is announced with the end (_run)

    def publish(self, event: sse.Event) -> None:
        self.publish_all((event,))

    def publish_all(self, events: Sequence[sse.Event]) -> None:
        """Events that arrived together (one upstream read): listeners are woken once."""
        if not events:
            return
        if self._life != STREAMING:
            self._move(life.EVENTS)  # a producer not yet told of a stop; else IllegalMove
        size = sum(len(event.raw) for event in events)
        self.bytes_published += size
        reason = self.log.add(events, size)
        if reason:
            self.give_up_log(reason)
        elif not self.log.keep:
            self._trim()
        self._notify()
        if not self.log.keep and self.buffer_limit is not None:
            self._wait_for_room()

    def _unread(self) -> int:
        """Bytes published that the slowest reading listener has not taken yet."""
        read = min((r.bytes_read for r in self._readers), default=self.bytes_published)
        return self.bytes_published - read

    def _wait_for_room(self) -> None:
        """Back-pressure: hold the producer (so the upstream is not read) while the slowest
        reader is more than ``buffer_limit`` bytes behind. A reader that takes nothing for
        ``send_timeout`` seconds is too slow to keep: the flight ends (ClientTooSlow) and its
        upstream is closed."""
        assert self.buffer_limit is not None
        if self.bytes_published <= self.buffer_limit:
            return  # nobody can be further behind than all there is (most streams, always)
        while self._unread() > self.buffer_limit:
            self._drained.clear()
            if self._drained.wait(self.send_timeout):
                continue
            # The slowest readers took nothing for the whole send timeout: they are dropped,
            # so one stalled caller does not stop the others sharing this answer.
            slowest = min(r.bytes_read for r in self._readers)
            for reader in [r for r in self._readers if r.bytes_read == slowest]:
                reader.left = True
                self._readers.discard(reader)
                self.listeners -= 1
            self._notify()
            if self.listeners <= 0:
                raise ClientTooSlow(
                    f"The caller read nothing for {self.send_timeout:g}s "
                    "(LLMGATE_SEND_TIMEOUT_S); the stream was dropped."
                )

    def give_up_log(self, reason: str = TOO_LARGE) -> None:
        """Stop keeping the whole log: no entry, no new followers; memory follows readers."""
        self.log.give_up(reason, self._low())

    def _release_log(self) -> None:
        """Give the budget back once the log serves nobody: the flight settled (its entry
        stored) and its last listener left."""
        if self.settled and self.listeners <= 0:
            self.log.release()

    def _trim(self) -> None:
        """Drop the events every reading listener has passed."""
        self.log.trim(self._low())

    def _low(self) -> int:
        """The number of the next event the slowest reading listener reads."""
        return min((r.position for r in self._readers), default=self.log.count)

    def finish(self, leftover: bytes = b"", *, usage_estimated: bool = False) -> None:
        """A stream's end; told once the flight settled (_run)."""
        self._move(life.FINISH)
        self.end = Finished(leftover, usage_estimated)

    def fail(self, exc: GatewayError) -> None:
        """The producer failed with ``exc``; told once the flight settled (_run)."""
        self._move(life.FAIL)
        self.end = exc
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, gevent.event.Event()
        changed.set()

    wake = _notify  # a listener's caller left: its waits end (Listener.lost)

    def taken(self) -> None:
        """A listener took events: the producer may have room again, and without a whole
        log what every reader passed can go."""
        self._drained.set()
        if not self.log.keep:
            self._trim()

    def reads_whole(self, listener: Listener) -> None:
        """``listener`` waits for the whole answer and reads no events one by one: it holds
        no log back."""
        self._readers.discard(listener)
        self._drained.set()

    # -- state ---------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """As its listeners see it: waiting, streaming, complete, failed or cancelled."""
        return self._seen

    @property
    def life(self) -> str:
        """Where it is in its table (app/streams/flight_life.py)."""
        return self._life

    @property
    def source(self) -> str:
        return self._source

    @property
    def lease_held(self) -> bool:
        return self._lease_held

    @property
    def open_to_followers(self) -> bool:
        """A follower may still join: nothing went wrong, and the log holds every event."""
        return not self.cancelled and self.failure is None and self.log.whole

    @property
    def complete(self) -> bool:
        """A whole answer is in: a non-stream body, or a stream that reached its end."""
        return self._life in life.WHOLE

    @property
    def failure(self) -> GatewayError | None:
        return self.end if isinstance(self.end, GatewayError) else None

    @property
    def event_count(self) -> int:
        """Events published so far (kept or dropped)."""
        return self.log.count

    @property
    def events(self) -> list[sse.Event]:
        """Every event of the answer; only while the log is whole (see ``log_whole``)."""
        return self.log.events

    @property
    def log_whole(self) -> bool:
        """Every event since the first is in the log: it can serve an entry or a follower."""
        return self.log.whole

    @property
    def keep_log(self) -> bool:
        return self.log.keep

    @property
    def log_given_up(self) -> str:
        """Why the whole log was given up (TOO_LARGE, LOG_MEMORY), or ""."""
        return self.log.given_up

    # -- listening --------------------------------------------------------------------------
    def join(self) -> Listener:
        self.listeners += 1
        listener = Listener(self)
        self._readers.add(listener)
        return listener

    def left(self, listener: Listener) -> None:
        """``listener`` left (its ``leave``): the last one out cancels an unfinished flight."""
        self.listeners -= 1
        self._readers.discard(listener)
        self._drained.set()  # the slowest reader may have been this one
        if self.listeners <= 0 and self._life in life.UNFINISHED:
            self.cancel()
        self._release_log()
        self._notify()

    def wait(self, listener: Listener, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``ready()``, the listener left, or ``timeout``; False on timeout."""
        if ready():
            return True
        if timeout is not None and timeout <= 0:
            if listener.stopped or self.cancelled:
                raise ClientGone()
            return self.settled
        # The listener's own timer, armed again for each wait: a stream waits once per
        # event, and a new timer each time was a measurable part of relaying one.
        timer = None if timeout is None else listener.timer(timeout)
        if timer is not None:
            timer.arm()
        try:
            while not ready():
                if listener.stopped or self.cancelled:
                    raise ClientGone()
                if self.settled:
                    return True
                self._changed.wait()
        except Alarm as exc:
            if exc is not timer:
                raise
            return False
        finally:
            if timer is not None:
                timer.disarm()
        return True

    def shut_down(self, exc: GatewayError) -> None:
        """End the call now with ``exc`` for every listener (never a silent end); the
        producer's ``finally`` closes the upstream response."""
        if self.settled:
            return
        self._move(life.STOP)
        if self.end is None:
            self.end = exc
        if self._greenlet.dead:
            self._settle()  # killed before it ever ran: nothing else will settle it
        else:
            self._greenlet.kill(block=False)

    def cancel(self) -> None:
        """Stop producing now. The kill waits for the greenlet to unwind: it may be inside a
        read on the upstream response, and only it can close that reader (closing it from
        here raises "reentrant call"); its ``finally`` closes the connection."""
        self._move(life.CANCEL)
        self._greenlet.kill(block=True, timeout=2.0)
        self._notify()
