"""The upstream exchange as a flight's producer, and a listener's bytes to the caller.

``upstream_producer`` makes the upstream call and publishes its head and each SSE event as
soon as ``read1`` and the pure decoder have a complete one (app/flight.py keeps them for the
listeners). ``relay`` is a listener's body: each event's own bytes at once and, when nothing
came for ``heartbeat`` seconds, a ``: ping`` comment instead, so heartbeats fall only between
events; a stream never ends silently. ``DisconnectWatcher`` notices a caller leaving (EOF on
the worker's client socket) within a millisecond, even while nothing is being written.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator

import gevent
from gevent.socket import wait_read

from app import sse
from app.errors import (
    GatewayError,
    UpstreamEventTooLarge,
    UpstreamProtocolError,
    UpstreamReset,
    error_cause,
    status_cause,
    wrap_upstream_body,
)
from app.flight import ClientGone, Finished, Flight, Head, Listener, Producer
from app.policy import Deadline
from app.upstream import Upstream, UpstreamRequest, UpstreamResponse

log = logging.getLogger("llmgate.relay")


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
