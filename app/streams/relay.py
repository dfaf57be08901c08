"""The upstream exchange as a flight's producer, and a listener's bytes to the caller.

``upstream_producer`` makes the upstream call and publishes its head and each SSE event as
soon as ``read1`` and the pure decoder have a complete one (app/streams/flight.py keeps them for the
listeners). What the upstream breaks after its headers (an event over the size limit, a
stream that ends before its route's end) fails the attempt for its breaker
(``Upstream.broken``); a read that fails does so in ``Upstream.read_chunk``.

``relay`` is a listener's body: each event's own bytes at once and, when nothing came for
``heartbeat`` seconds, a ``: ping`` comment instead, so heartbeats fall only between
events; a stream never ends silently. ``DisconnectWatcher`` notices a caller leaving (EOF on
the worker's client socket) within a millisecond, even while nothing is being written.
"""

from __future__ import annotations

import _socket
import dataclasses
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import gevent

from app.core.errors import (
    GatewayError,
    UpstreamEventTooLarge,
    UpstreamProtocolError,
    UpstreamRedirect,
    UpstreamReset,
    error_cause,
    status_cause,
    wrap_upstream_body,
)
from app.observe import tracing
from app.request.events import END_OF_STREAM, StreamEnd, is_error_event, typed
from app.streams.flight import ClientGone, Finished, Flight, Head, Listener, Producer
from app.upstream import race
from app.upstream.catalog import UpstreamSpec
from app.upstream.exchange import Upstream, UpstreamRequest, UpstreamResponse
from app.upstream.retry import Deadline
from llmgate_wire import sse

log = logging.getLogger("llmgate.relay")

# Redirects (RFC 9110 section 15.4); 304 is an answer to a conditional request, not one.
# A generation call is never legitimately redirected: a caller's SDK following one would send
# the prompt where the operator never configured, past the gateway's keys, limits and cache,
# so it is a 502. Other paths pass a redirect on as the upstream's answer (a provider may
# send a file download to signed storage); the gateway itself follows none.
_REDIRECTS = frozenset({300, 301, 302, 303, 305, 307, 308})


@dataclass
class _Start:
    """An exchange up to its first event, or its whole answer when it is not a stream."""

    resp: UpstreamResponse
    done_with: Callable[[UpstreamResponse], None]  # counts the connection free
    head: Head  # with the body when the answer is not an event stream
    decoder: sse.Decoder | None = None
    events: list[sse.Event] = field(default_factory=list)
    ended: bool = False  # the stream ended before an event
    too_large: int | None = None  # the event size limit an event broke

    @property
    def ok(self) -> bool:
        return self.head.status < 300

    def close(self) -> None:
        """Done with the exchange: a connection not read to its end is dropped."""
        if not self.resp.raw.closed:
            self.resp.close()
        self.done_with(self.resp)


def upstream_producer(
    upstream: Upstream,
    req: UpstreamRequest,
    deadline: Deadline,
    *,
    max_body: int,
    max_event_bytes: int | None = None,
    route: str = "passthrough",
) -> Producer:
    """A producer that makes the upstream call and publishes what it answers, once.

    The request (the caller's prompt in its body) is held only until the answer has started:
    retries and a hedge's backup come before that, and a stream that lasts minutes should
    not keep a copy of a long prompt alive for nothing."""
    metrics = upstream.metrics
    pending = [req]
    end = END_OF_STREAM.get(route)

    def begin(resp: UpstreamResponse) -> _Start:
        """Read ``resp`` up to its first event (or its whole body); close it on failure."""
        done = upstream.done_with
        try:
            if resp.status in _REDIRECTS and route != "passthrough":
                raise UpstreamRedirect(
                    f"The upstream answered with a redirect (HTTP {resp.status}); the gateway "
                    "follows none. Its configured URL needs correcting."
                )
            head = Head(resp.status, list(resp.headers.items()), resp.attempts, None, resp.upstream)
            ctype = resp.headers.get("content-type", "")
            if resp.status >= 300 or not ctype.startswith("text/event-stream"):
                body = upstream.read_all(resp, deadline, max_body)
                return _Start(resp, done, dataclasses.replace(head, body=body))
            decoder = sse.Decoder(max_event_bytes)
            while chunk := upstream.read_chunk(resp, deadline):
                try:
                    events = decoder.feed(chunk)
                except sse.EventTooLarge as exc:
                    return _Start(resp, done, head, decoder, exc.events, too_large=exc.limit)
                if events:
                    return _Start(resp, done, head, decoder, events)
            return _Start(resp, done, head, decoder, ended=True)
        except BaseException:
            if not resp.raw.closed:
                resp.close()
            upstream.done_with(resp)
            raise

    def start(req: UpstreamRequest) -> _Start:
        """The exchange to relay: the plain call, or the winner of a hedged one."""
        plan = upstream.plan(req)
        delay = upstream.hedge_delay(plan[0]) if req.stream and plan else None
        if delay is None:
            return begin(upstream.open(req, deadline, plan=plan))
        tried: list[UpstreamSpec] = []

        def backup() -> _Start | None:
            spare = [spec for spec in plan if spec not in tried]
            if not spare:
                return None
            resp = upstream.open_backup(req, deadline, spare[0])
            return begin(resp) if resp is not None else None

        hedged = plan[0].name
        started, verdict = race.first_to_start(
            lambda: begin(upstream.open(req, deadline, plan=plan, tried=tried)),
            backup,
            min(delay, deadline.remaining()),
        )
        if metrics is not None and verdict != race.NOT_SENT:
            metrics.hedges.labels(hedged, verdict).inc()
        return started

    def produce(flight: Flight) -> None:
        started: _Start | None = None
        try:
            if not pending:
                raise RuntimeError("an upstream producer makes its call once")
            started = start(pending.pop())
            resp, head, decoder = started.resp, started.head, started.decoder
            cause = status_cause(head.status)
            if metrics is not None and cause is not None:
                metrics.upstream_errors.labels(cause).inc()
            if decoder is None:
                flight.publish_head(head)
                _observe_ttfb(flight, route)
                return
            _publish(flight, head, started.events)
            if resp.span is not None and flight.head_at is not None:
                # The upstream's own time to first event, beside the caller's (edge/finish.py).
                resp.span.event("first_event", at=flight.head_at)
            limit, ended = started.too_large, started.ended
            last = _last_event(started.events, None)
            while limit is None and not ended:
                chunk = upstream.read_chunk(resp, deadline)
                try:
                    events = decoder.feed(chunk) if chunk else []
                except sse.EventTooLarge as exc:
                    events, limit = exc.events, exc.limit  # the events before it still go
                _publish(flight, head, events)
                last, ended = _last_event(events, last), not chunk
            if limit is not None:
                too_large = _too_large(limit)
                upstream.broken(resp, too_large)  # a malformed stream: the attempt failed
                raise too_large
            if end is not None and not _ends(end, last):
                # Cut short with a clean close (a body delimited by the connection's end):
                # relay() tells each caller; the upstream's attempt failed.
                cut = UpstreamReset(f"Upstream ended the stream before {end.expected}.")
                upstream.broken(resp, cut)
            if flight.head is None:
                flight.publish_head(head, first_byte=False)  # a stream with no event
            resp.raw.release_conn()
            flight.finish(decoder.close())
        except GatewayError as exc:
            if metrics is not None:
                metrics.upstream_errors.labels(error_cause(exc)).inc()
            raise
        except Exception:
            # Not an error we know (a bug, or input we did not expect): the caller must still
            # hear of it, as a 502 before the first byte or the final error event after it.
            log.exception("upstream exchange failed (request %s)", flight.request_id or "-")
            if metrics is not None:
                metrics.upstream_errors.labels("protocol").inc()
            # The class of a bug means nothing to a caller: the log above has the traceback.
            raise UpstreamProtocolError(
                "The upstream's answer could not be relayed; the gateway's log says why."
            ) from None
        finally:
            if started is not None:
                started.close()

    def _publish(flight: Flight, head: Head, events: list[sse.Event]) -> None:
        if events and flight.head is None:
            # Head and first event together: a listener learns the status only when the
            # stream is known to have started.
            flight.publish_head(head)
            upstream.first_event_after(head.upstream, _observe_ttfb(flight, route))
        flight.publish_all(events)

    def _observe_ttfb(flight: Flight, route: str) -> float:
        """The seconds from the call's start to its answer's (the head just published)."""
        assert flight.head_at is not None
        seconds = flight.head_at - flight.started
        if metrics is not None:
            metrics.upstream_ttft.labels(route).observe(seconds)
        return seconds

    return produce


def _last_event(events: list[sse.Event], before: sse.Event | None) -> sse.Event | None:
    """The last event that is not a comment: ``events``' own, else ``before``."""
    for event in reversed(events):
        if not event.is_comment:
            return event
    return before


def _ends(end: StreamEnd, last: sse.Event | None) -> bool:
    """Whether a stream whose last event is ``last`` ended as its route's streams end: with
    its end, or with the upstream's own error event (an answer, not a cut)."""
    return last is not None and (end.ends(last) or is_error_event(last))


def _too_large(limit: int) -> UpstreamEventTooLarge:
    return UpstreamEventTooLarge(
        f"The upstream sent an event larger than {limit} bytes (LLMGATE_MAX_EVENT_BYTES)."
    )


def relay(
    listener: Listener,
    *,
    heartbeat: float,
    end: StreamEnd | None,
    on_ping: Callable[[], None] = lambda: None,
    on_error: Callable[[str], None] = lambda _: None,
    ping_first: bool = False,
) -> Iterator[list[bytes]]:
    """A listener's body: events as they arrive, pings between them, one error event at worst.

    Each item is a batch (app/request/call.py, Reply): the events in when the caller's turn came,
    written together. Alone a stream's events go one by one, as they arrive; when several
    arrived in one upstream read, or piled up while the worker was busy, they leave in one
    write instead of one each, so a loaded worker spends less per event, not more.

    Used only after the 200 is decided, so the head may still be pending (we are already
    sending pings while the upstream has not answered). A stream that ends without its
    route's end (``end``: [DONE], or a Responses terminal event; app/request/events.py) and without
    an error event gets an error event: a stream never ends silently. ``on_error`` hears the
    error type of a stream that ends in an error event (its own or the upstream's) or in a
    Responses ``response.failed``, once. ``ping_first``: the 200 was committed because a
    heartbeat interval passed with nothing to send, so a ping leaves with the headers: the
    caller's line is never silent for more than one interval.
    """
    timeout = heartbeat if heartbeat > 0 else None
    if ping_first:
        on_ping()
        yield [sse.comment()]
    while True:
        try:
            head = listener.wait_head(timeout)
        except ClientGone:
            return
        except GatewayError as exc:
            on_error(tracing.error_type(exc))
            yield [error_event(exc)]
            return
        if head is not None:
            break
        on_ping()
        yield [sse.comment()]
    if head.body is not None:
        # The upstream answered with a whole body after we had committed to a stream:
        # carry it over (an error becomes the final error event).
        if head.status >= 300:
            on_error(str(head.status))
            yield [b"data: " + wrap_upstream_body(head.status, head.body) + b"\n\n"]
        else:
            yield [head.body]
        return
    saw_end = saw_error = False
    while True:
        try:
            item = listener.next_item(timeout)
        except ClientGone:
            return
        if item is None:
            on_ping()
            yield [sse.comment()]
        elif isinstance(item, sse.Event):
            batch = [item, *listener.ready_events()]
            for event in batch:
                if not saw_error and is_error_event(event):
                    saw_error = True
                    on_error("upstream_error")  # the upstream's own error event, relayed
                if not saw_end and end is not None and end.ends(event):
                    saw_end = True
                    if not saw_error and typed(event) == "response.failed":
                        on_error("upstream_error")  # a Responses stream that ended failed
            yield [event.raw for event in batch]
        elif isinstance(item, Finished):
            if end is not None and not (saw_end or saw_error):
                cut = UpstreamReset(f"Upstream ended the stream before {end.expected}.")
                on_error(tracing.error_type(cut))
                yield [error_event(cut)]
            elif item.leftover:
                yield [item.leftover]
            return
        else:
            on_error(tracing.error_type(item))
            yield [error_event(item)]
            return


def error_event(exc: GatewayError) -> bytes:
    """The final event of a broken stream: the OpenAI SDK raises APIError on it."""
    return sse.encode_json(exc.to_body())


class DisconnectWatcher:
    """Calls ``on_gone`` when the caller's socket reads EOF; stops when told or on data.

    An io watcher on the socket rather than a greenlet waiting on it: no greenlet to spawn,
    keep (its stack, for the whole call) and kill per call. ``on_gone`` runs in the hub's
    loop, so it must not block: it marks the caller gone and wakes whoever waits for it.
    """

    def __init__(self, sock: socket.socket | None, on_gone: Callable[[], None]) -> None:
        self._io = None
        if sock is not None:
            self._io = gevent.get_hub().loop.io(sock.fileno(), 1)  # 1: readable
            self._io.start(self._readable, sock.fileno(), on_gone)

    def _readable(self, fd: int, on_gone: Callable[[], None]) -> None:
        self.stop()
        if _at_eof(fd):
            on_gone()
        # else the caller is sending more (pipelining): we cannot tell, so stop watching

    def stop(self) -> None:
        if self._io is not None:
            self._io.stop()
            self._io.close()
            self._io = None


def _at_eof(fd: int) -> bool:
    """Whether the connection on ``fd`` has ended (EOF or reset), without taking a byte.
    Through the C socket: gevent's would wait for data, and this runs in the hub."""
    try:
        probe = _socket.socket(fileno=os.dup(fd))
    except OSError:
        return True  # the descriptor is closed already
    try:
        return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # woken with nothing to read
    except OSError:
        return True  # reset
    finally:
        probe.close()
