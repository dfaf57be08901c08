"""An answer produced once in its own greenlet and relayed, live, to one or more callers.

A ``Flight`` runs a producer (normally one upstream exchange) in a greenlet. The producer
publishes the head (status, headers; the whole body for a non-stream answer), then each SSE
event as soon as ``read1`` and the pure decoder have a complete one, then the end. Events go
into an append-only log, so any number of listeners can read it: the caller who started it,
and identical requests that coalesced onto it, a late joiner reading the events so far and
then the live ones. A listener's generator yields each event at once and, when nothing came
for ``heartbeat`` seconds, a ``: ping`` comment instead: heartbeats fall only between events.

The upstream call is cancelled only when no listener is left: a watcher greenlet notices a
caller leaving (EOF on the worker's client socket) within a millisecond, even while nothing is
being written; the flight is killed when its last listener leaves, and the upstream response
is closed, not drained, and never returns to the pool half-read.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gevent
import gevent.event
from gevent.socket import wait_read

from app import sse
from app.errors import (
    ClientTooSlow,
    GatewayError,
    UpstreamEventTooLarge,
    UpstreamProtocolError,
    UpstreamReset,
    error_cause,
    status_cause,
    wrap_upstream_body,
)
from app.policy import Deadline
from app.upstream import Upstream, UpstreamRequest, UpstreamResponse

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


class Flight:
    """One answer in the making: a head, a log of events, an end; read by many listeners.

    The event log is kept whole only while it can still serve something beyond the listeners
    reading it now: a cache entry or a coalesced follower yet to come (``keep_log``). Past
    ``log_limit`` bytes it is given up: the flight stops logging, takes no new followers and
    is not stored. Without a whole log, events every reading listener has passed are dropped,
    so a stream nobody else needs holds only the events its caller has yet to read.
    """

    def __init__(
        self,
        producer: Producer,
        *,
        on_done: Callable[[Flight], None] | None = None,
        keep_log: bool = True,
        log_limit: int | None = None,
        buffer_limit: int | None = None,
        send_timeout: float | None = None,
        request_id: str = "",
    ):
        self.head: Head | None = None
        self._log: list[sse.Event] = []  # events from number ``_dropped`` on
        self._dropped = 0
        self.log_bytes = 0
        self.keep_log = keep_log
        self.log_whole = keep_log  # every event since the first is in the log
        self.log_limit = log_limit
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
        # Set by whoever starts the flight: the answer's shape, where it came from, and
        # whether this process holds the cross-process lease for its key.
        self.stream = False
        self.source = "upstream"
        self.lease_held = False
        self._changed = gevent.event.Event()
        self._on_done = on_done
        self._greenlet = gevent.spawn(self._run, producer)

    # -- producing (in the flight's greenlet) ----------------------------------------------
    def _run(self, producer: Producer) -> None:
        try:
            producer(self)
        except GatewayError as exc:
            self.fail(exc)
        except Exception as exc:
            # A bug, or input nothing else caught: the callers get an error, never silence.
            log.exception("answer producer failed (request %s)", self.request_id or "-")
            self.fail(
                UpstreamProtocolError(f"The answer could not be relayed: {type(exc).__name__}.")
            )
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
                self._notify()

    def publish_head(self, head: Head) -> None:
        self.head = head
        if head.body is None:
            self._notify()  # a stream starts; a whole body is announced with the end (_run)

    def publish(self, event: sse.Event) -> None:
        self._log.append(event)
        self.bytes_published += len(event.raw)
        if self.keep_log:
            self.log_bytes += len(event.raw)
            if self.log_limit is not None and self.log_bytes > self.log_limit:
                self.give_up_log()
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
        while self._unread() > self.buffer_limit:
            self._drained.clear()
            if not self._drained.wait(self.send_timeout):
                raise ClientTooSlow(
                    f"The caller read nothing for {self.send_timeout:g}s "
                    "(LLMGATE_SEND_TIMEOUT_S); the stream was dropped."
                )

    def give_up_log(self) -> None:
        """Stop keeping the whole log: no entry, no new followers; memory follows readers."""
        self.keep_log = self.log_whole = False
        self._trim()

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

    def event(self, number: int) -> sse.Event:
        return self._log[number - self._dropped]

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
        self._notify()

    def wait(self, listener: Listener, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``ready()``, the listener left, or ``timeout``; False on timeout."""
        until = None if timeout is None else time.monotonic() + timeout
        while not ready():
            if listener.left or self.cancelled:
                raise ClientGone()
            if self.settled:
                return True
            remaining = None if until is None else until - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._changed.wait(remaining)
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

    def leave(self) -> None:
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
        ready = lambda: self.position < flight.event_count or flight.settled  # noqa: E731
        if not flight.wait(self, ready, timeout):
            return None
        if self.position < flight.event_count:
            event = flight.event(self.position)
            self.position += 1
            self.bytes_read += len(event.raw)
            flight._drained.set()
            if not flight.keep_log:
                flight._trim()
            return event
        if flight.end is None:
            raise ClientGone()
        return flight.end

    def wait_complete(self, timeout: float | None = None) -> None:
        """Until the whole answer is in; raises the failure or ClientGone. A listener that
        waits for the whole answer reads no events one by one: it holds no log back."""
        flight = self.flight
        flight._readers.discard(self)
        flight._drained.set()
        flight.wait(self, lambda: flight.settled, timeout)
        if not flight.complete:
            raise flight.failure or ClientGone()


def upstream_producer(
    upstream: Upstream,
    req: UpstreamRequest,
    deadline: Deadline,
    *,
    max_body: int,
    max_event_bytes: int | None = None,
    route: str = "passthrough",
) -> Producer:
    """A producer that makes the upstream call and publishes what it answers."""
    metrics = upstream.metrics

    def produce(flight: Flight) -> None:
        resp: UpstreamResponse | None = None
        try:
            resp = upstream.open(req, deadline)
            headers = list(resp.headers.items())
            ctype = resp.headers.get("content-type", "")
            cause = status_cause(resp.status)
            if metrics is not None and cause is not None:
                metrics.upstream_errors.labels(cause).inc()
            if resp.status >= 300 or not ctype.startswith("text/event-stream"):
                body = upstream.read_all(resp, deadline, max_body)
                flight.publish_head(Head(resp.status, headers, resp.attempts, body, resp.upstream))
                _observe_ttfb(flight, route)
                return
            head = Head(resp.status, headers, resp.attempts, None, resp.upstream)
            decoder = sse.Decoder(max_event_bytes)
            while chunk := upstream.read_chunk(resp, deadline):
                try:
                    events = decoder.feed(chunk)
                except sse.EventTooLarge as exc:
                    _publish(flight, head, exc.events)
                    raise UpstreamEventTooLarge(
                        f"The upstream sent an event larger than {exc.limit} bytes "
                        "(LLMGATE_MAX_EVENT_BYTES)."
                    ) from None
                _publish(flight, head, events)
            if flight.head is None:
                flight.publish_head(head)
            resp.raw.release_conn()
            flight.finish(decoder.close())
        except GatewayError as exc:
            if metrics is not None:
                metrics.upstream_errors.labels(error_cause(exc)).inc()
            raise
        except Exception as exc:
            # Not an error we know (a bug, or input we did not expect): the caller must still
            # hear of it, as a 502 before the first byte or the final error event after it.
            log.exception("upstream exchange failed (request %s)", flight.request_id or "-")
            if metrics is not None:
                metrics.upstream_errors.labels("protocol").inc()
            raise UpstreamProtocolError(
                f"The upstream's answer could not be relayed: {type(exc).__name__}."
            ) from None
        finally:
            if resp is not None:
                if not resp.raw.closed:
                    resp.close()
                upstream.done_with(resp)

    def _publish(flight: Flight, head: Head, events: list[sse.Event]) -> None:
        if events and flight.head is None:
            # Head and first event together: a listener learns the status only when the
            # stream is known to have started.
            flight.publish_head(head)
            _observe_ttfb(flight, route)
        for event in events:
            flight.publish(event)

    def _observe_ttfb(flight: Flight, route: str) -> None:
        flight.head_at = time.monotonic()
        if metrics is not None:
            metrics.upstream_ttft.labels(route).observe(flight.head_at - flight.started)

    return produce


def relay(
    listener: Listener,
    *,
    heartbeat: float,
    expect_done: bool,
    on_ping: Callable[[], None] = lambda: None,
) -> Iterator[bytes]:
    """A listener's body: events as they arrive, pings between them, one error event at worst.

    Used only after the 200 is decided, so the head may still be pending (we are already
    sending pings while the upstream has not answered). A stream that ends without [DONE]
    and without an error event gets an error event: a stream never ends silently.
    """
    timeout = heartbeat if heartbeat > 0 else None
    while True:
        try:
            head = listener.wait_head(timeout)
        except ClientGone:
            return
        except GatewayError as exc:
            yield error_event(exc)
            return
        if head is not None:
            break
        on_ping()
        yield sse.comment()
    if head.body is not None:
        # The upstream answered with a whole body after we had committed to a stream:
        # carry it over (an error becomes the final error event).
        if head.status >= 300:
            yield b"data: " + wrap_upstream_body(head.status, head.body) + b"\n\n"
        else:
            yield head.body
        return
    saw_done = saw_error = False
    while True:
        try:
            item = listener.next_item(timeout)
        except ClientGone:
            return
        if item is None:
            on_ping()
            yield sse.comment()
        elif isinstance(item, sse.Event):
            saw_done = saw_done or item.is_done
            saw_error = saw_error or is_error_event(item)
            yield item.raw
        elif isinstance(item, Finished):
            if expect_done and not (saw_done or saw_error):
                yield error_event(UpstreamReset("Upstream ended the stream before [DONE]."))
            elif item.leftover:
                yield item.leftover
            return
        else:
            yield error_event(item)
            return


def error_event(exc: GatewayError) -> bytes:
    """The final event of a broken stream: the OpenAI SDK raises APIError on it."""
    return sse.encode_json(exc.to_body())


def is_error_event(event: sse.Event) -> bool:
    if event.event == "error":
        return True
    if not event.data or '"error"' not in event.data[:32]:
        return False
    try:
        return isinstance(event.json().get("error"), dict)
    except (ValueError, AttributeError):
        return False


class DisconnectWatcher:
    """Calls ``on_gone`` when the caller's socket reads EOF; stops when told or on data."""

    def __init__(self, sock: socket.socket | None, on_gone: Callable[[], None]) -> None:
        self._greenlet = gevent.spawn(self._watch, sock, on_gone) if sock is not None else None

    @staticmethod
    def _watch(sock: socket.socket, on_gone: Callable[[], None]) -> None:
        try:
            wait_read(sock.fileno())
            if sock.recv(1, socket.MSG_PEEK):
                return  # the caller is sending more (pipelining): we cannot tell, stop
        except OSError:
            pass
        on_gone()

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None
