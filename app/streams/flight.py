"""An answer produced once in its own greenlet and read, live, by one or more callers.

A ``Flight`` runs a producer (normally one upstream exchange, app/streams/relay.py) in a greenlet.
The producer publishes the head (status, headers; the whole body for a non-stream answer),
then each SSE event, then the end. Events go into a log any number of listeners read: the
caller who started it, and identical requests that coalesced onto it, a late joiner reading
the events so far and then the live ones.

Memory stays bounded: the whole log is kept only while it can serve a cache entry or a
follower (``keep_log``, up to ``log_limit`` and while the worker's log memory budget has room,
app/streams/log_memory.py); otherwise events every reader has passed are dropped, and a reader more
than ``buffer_limit`` bytes behind holds the producer back (back-pressure onto the upstream
read). The end, or a whole body, reaches listeners only once the flight settled (``on_done``
ran: the answer is stored first). The producer is cancelled only when no listener is left,
and its ``finally`` closes the upstream response.

A flight's life, in one place (``Flight.state``), moved only by its own methods:

    waiting ──publish_head(a stream's head)──▶ streaming
       │                                          │
       └──────────── the producer ends ───────────┴──▶ complete | failed | cancelled

- the producer moves it: ``publish_head``, ``publish_all``, then ``finish`` or ``fail`` (or
  an exception); the end is seen by listeners once the flight settled (``on_done`` ran);
- the last listener to leave an unfinished flight cancels it (``cancel``);
- the drain ends it for everyone (``shut_down``, app/streams/drain.py).
Whoever starts a flight says its shape (``stream``), where its answer comes from
(``source``: the upstream, a stored entry, or another process's call it waits for under the
cache lease) and whether it holds that lease; a producer that learns better says so
(``answered_from``, ``took_lease``).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gevent
import gevent.event

from app.core.errors import ClientTooSlow, GatewayError, UpstreamProtocolError
from app.core.timers import Alarm
from app.observe.tracing import Span
from app.streams.log_memory import LogBudget, LogShare, event_cost
from llmgate_wire import sse

log = logging.getLogger("llmgate.relay")


class ClientGone(Exception):
    """The caller closed its connection; nobody is left to answer."""


@dataclass(frozen=True)
class Head:
    status: int
    headers: list[tuple[str, str]]
    attempts: int
    body: bytes | None  # None: an event stream follows
    upstream: str = ""  # the configured name of the upstream that answered


@dataclass(frozen=True)
class Finished:
    leftover: bytes  # bytes of an unterminated last event, if any


Producer = Callable[["Flight"], None]

# The states of a flight's life (Flight.state).
WAITING, STREAMING, COMPLETE, FAILED, CANCELLED = (
    "waiting",
    "streaming",
    "complete",
    "failed",
    "cancelled",
)
# Where its answer comes from (Flight.source).
UPSTREAM, CACHE, LEASE = "upstream", "cache", "lease"


class Flight:
    """One answer in the making: a head, a log of events, an end; read by many listeners.

    The event log is kept whole only while it can still serve something beyond the listeners
    reading it now: a cache entry or a coalesced follower yet to come (``keep_log``). Past
    ``log_limit`` bytes, or when ``log_budget`` has no room for its next events, it is given
    up: the flight stops logging, takes no new followers and is not stored; the listeners
    already reading still get every event. Without a whole log, events every reading listener
    has passed are dropped, so a stream nobody else needs holds only the events its caller
    has yet to read.
    """

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
    ):
        self.head: Head | None = None
        self._log: list[sse.Event] = []  # events from number ``_dropped`` on
        self._dropped = 0
        self.log_bytes = 0
        self.keep_log = keep_log
        self.log_whole = keep_log  # every event since the first is in the log
        self.log_limit = log_limit
        self.log_given_up = ""  # why the log was given up: "too_large" or "log_memory"
        # The log's share of the worker's budget, given back when the log is given up or
        # nobody reads it any more (_release_log); and, should a flight ever be dropped with
        # a listener that never left, when it is collected.
        self._share = LogShare(log_budget) if log_budget is not None and keep_log else None
        if self._share is not None:
            weakref.finalize(self, self._share.release).atexit = False
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
        self.cancelled = False
        self.started = time.monotonic()
        self.finished_at: float | None = None
        # The producer ended and on_done ran: only now do listeners see the end (or a whole
        # body), so the answer is stored before any caller has all of it.
        self.settled = False
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
            # A bug, or input nothing else caught: the callers get an error, never silence.
            log.exception("answer producer failed (request %s)", self.request_id or "-")
            self.fail(UpstreamProtocolError("The answer could not be relayed; the log says why."))
        finally:
            self.finished_at = time.monotonic()
            if self.end is None and not self.complete:
                self.cancelled = True
            try:
                if self._on_done is not None:
                    # Before the listeners learn of the end: a caller who repeats its request
                    # the moment it has the whole answer finds the entry stored and the
                    # flight gone, not a finished call to join as a follower.
                    self._on_done(self)
            finally:
                self.settled = True
                self._release_log()
                self._notify()

    def answered_from(self, source: str) -> None:
        """The producer found where the answer comes from: a stored entry (CACHE) or its own
        upstream call (UPSTREAM), after waiting under another process's lease."""
        self._source = source

    def took_lease(self) -> None:
        """The producer took over the cache lease of a holder that let it lapse."""
        self._lease_held = True

    def publish_head(self, head: Head, *, first_byte: bool = True) -> None:
        """The answer's head (a stream's, or a whole body). ``first_byte``: the answer began
        now (its time is ``head_at``); False for a stream that ended with no event."""
        self.head = head
        if first_byte:
            self.head_at = time.monotonic()
        if head.body is None:
            self._notify()  # a stream starts; a whole body is announced with the end (_run)

    def publish(self, event: sse.Event) -> None:
        self.publish_all((event,))

    def publish_all(self, events: Sequence[sse.Event]) -> None:
        """Events that arrived together (one upstream read): listeners are woken once."""
        if not events:
            return
        self._log.extend(events)
        size = sum(len(event.raw) for event in events)
        self.bytes_published += size
        if self.keep_log:
            self.log_bytes += size
            if self.log_limit is not None and self.log_bytes > self.log_limit:
                self.give_up_log("too_large")
            elif self._share is not None and not self._share.take(sum(map(event_cost, events))):
                self.give_up_log("log_memory")
        else:
            self._trim()
        self._notify()
        if not self.keep_log and self.buffer_limit is not None:
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

    def give_up_log(self, reason: str = "too_large") -> None:
        """Stop keeping the whole log: no entry, no new followers; memory follows readers."""
        self.keep_log = self.log_whole = False
        self.log_given_up = reason
        self._trim()
        if self._share is not None:
            # What is left is what a reader has yet to read: held until the flight is done.
            self._share.keep_only(sum(map(event_cost, self._log)))

    def _release_log(self) -> None:
        """Give the budget back once the log serves nobody: the flight settled (its entry
        stored) and its last listener left."""
        if self._share is not None and self.settled and self.listeners <= 0:
            self._share.release()

    def _trim(self) -> None:
        """Drop the events every reading listener has passed (in batches: amortised O(1))."""
        low = min((r.position for r in self._readers), default=self.event_count)
        passed = low - self._dropped
        if passed >= 64 or (passed > 0 and passed * 2 >= len(self._log)):
            del self._log[:passed]
            self._dropped = low

    def finish(self, leftover: bytes = b"") -> None:
        self.end = Finished(leftover)  # announced once the flight is done (_run)

    def fail(self, exc: GatewayError) -> None:
        self.end = exc
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, gevent.event.Event()
        changed.set()

    # -- state ---------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """Where the flight is in its life (the module's docstring draws it)."""
        if self.cancelled:
            return CANCELLED
        if self.settled:
            return COMPLETE if self.complete else FAILED if self.failure is not None else CANCELLED
        return STREAMING if self.head is not None and self.head.body is None else WAITING

    @property
    def source(self) -> str:
        return self._source

    @property
    def lease_held(self) -> bool:
        return self._lease_held

    @property
    def open_to_followers(self) -> bool:
        """A follower may still join: nothing went wrong, and the log holds every event."""
        return not self.cancelled and self.failure is None and self.log_whole

    @property
    def complete(self) -> bool:
        """A whole answer is in: a non-stream body, or a stream that reached its end."""
        if self.head is not None and self.head.body is not None:
            return True
        return isinstance(self.end, Finished)

    @property
    def failure(self) -> GatewayError | None:
        return self.end if isinstance(self.end, GatewayError) else None

    @property
    def event_count(self) -> int:
        """Events published so far (kept or dropped)."""
        return self._dropped + len(self._log)

    @property
    def events(self) -> list[sse.Event]:
        """Every event of the answer; only while the log is whole (see ``log_whole``)."""
        if not self.log_whole:
            raise RuntimeError("the event log was given up")
        return self._log

    # -- listening --------------------------------------------------------------------------
    def join(self) -> Listener:
        self.listeners += 1
        listener = Listener(self)
        self._readers.add(listener)
        return listener

    def _left(self, listener: Listener) -> None:
        self.listeners -= 1
        self._readers.discard(listener)
        self._drained.set()  # the slowest reader may have been this one
        if self.listeners <= 0 and not self.complete and self.end is None:
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
        if self.end is None:
            self.end = exc
        if self._greenlet.dead:
            self.settled = True  # killed before it ever ran: nothing else will settle it
            self._release_log()
            self._notify()
        else:
            self._greenlet.kill(block=False)

    def cancel(self) -> None:
        """Stop producing now. The kill waits for the greenlet to unwind: it may be inside a
        read on the upstream response, and only it can close that reader (closing it from
        here raises "reentrant call"); its ``finally`` closes the connection."""
        self.cancelled = True
        self._greenlet.kill(block=True, timeout=2.0)
        self._notify()


class Listener:
    """One caller reading a flight. ``leave()`` when the caller is done or gone."""

    def __init__(self, flight: Flight) -> None:
        self.flight = flight
        self.left = False
        self.position = 0  # number of the next event this listener reads
        self.bytes_read = 0  # raw bytes of the events it took
        self.gone = False  # the caller left; it still has to leave() (from its own greenlet)
        self._timer: Alarm | None = None

    def timer(self, seconds: float) -> Alarm:
        """A timer of ``seconds`` for this listener's waits, made once and armed again."""
        if self._timer is None or self._timer.seconds != seconds:
            if self._timer is not None:
                self._timer.close()
            self._timer = Alarm(seconds)
        return self._timer

    @property
    def stopped(self) -> bool:
        """It reads nothing more: it left (or was dropped), or its caller is gone."""
        return self.left or self.gone

    def lost(self) -> None:
        """The caller's connection ended: its waits end with ClientGone. Never blocks (it is
        called from the hub's loop); leaving, which may stop the producer, is the caller's."""
        self.gone = True
        self.flight._notify()

    def leave(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        if not self.left:
            self.left = True
            self.flight._left(self)

    def wait_head(self, timeout: float | None) -> Head | None:
        """The head, None on timeout; raises the flight's failure or ClientGone."""
        flight = self.flight

        def ready() -> bool:
            # A stream's head at once; a whole body once the flight settled (stored).
            head = flight.head
            return (head is not None and head.body is None) or flight.settled

        if not flight.wait(self, ready, timeout):
            return None
        if flight.head is None:
            raise flight.failure or ClientGone()
        return flight.head

    def wait_first_event(self, timeout: float | None) -> bool:
        """True once a first event or the end is in (raises the failure if that came first)."""
        flight = self.flight
        ready = lambda: flight.event_count > 0 or flight.settled  # noqa: E731
        if not flight.wait(self, ready, timeout):
            return False
        if flight.event_count == 0 and flight.failure is not None:
            raise flight.failure
        return True

    def next_item(self, timeout: float | None) -> sse.Event | Finished | GatewayError | None:
        """The next event, or the end once every event is read; None on timeout."""
        flight = self.flight
        if self.stopped:
            raise ClientGone()  # dropped (or gone): its unread events may be trimmed already
        ready = lambda: self.position < flight.event_count or flight.settled  # noqa: E731
        if not flight.wait(self, ready, timeout):
            return None
        if self.position < flight.event_count:
            return self._take(self.position + 1)[0]
        if flight.end is None:
            raise ClientGone()
        return flight.end

    def ready_events(self) -> list[sse.Event]:
        """The events already in that this listener has not read, without waiting."""
        if self.stopped or self.position >= self.flight.event_count:
            return []
        return self._take(self.flight.event_count)

    def _take(self, until: int) -> list[sse.Event]:
        """Read the events numbered from ``position`` up to ``until`` (exclusive)."""
        flight = self.flight
        start = self.position - flight._dropped
        events = flight._log[start : start + until - self.position]
        self.position = until
        self.bytes_read += sum(len(event.raw) for event in events)
        flight._drained.set()
        if not flight.keep_log:
            flight._trim()
        return events

    def wait_complete(self, timeout: float | None = None) -> None:
        """Until the whole answer is in; raises the failure or ClientGone. A listener that
        waits for the whole answer reads no events one by one: it holds no log back."""
        flight = self.flight
        flight._readers.discard(self)
        flight._drained.set()
        flight.wait(self, lambda: flight.settled, timeout)
        if not flight.complete:
            raise flight.failure or ClientGone()
