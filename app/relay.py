"""One upstream exchange in its own greenlet, and the loop that relays it to the caller.

The exchange greenlet sends the request, publishes the upstream's headers, then reads the body
with ``read1`` (what has arrived, never "fill 64 KB"), cuts it into whole SSE events with the
pure decoder and puts them on a bounded queue. The caller's generator takes events off the
queue and yields each one at once; when nothing came for ``heartbeat`` seconds it yields a
``: ping`` comment instead, so heartbeats fall only between events.

A watcher greenlet notices the caller leaving (EOF on the worker's client socket) within a
millisecond, even while nothing is being written, and cancels the exchange: the upstream
connection is closed, not drained, and never returns to the pool half-read.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gevent
import gevent.event
import gevent.queue
from gevent.socket import wait_read

from app import sse
from app.errors import GatewayError, UpstreamReset, wrap_upstream_body
from app.policy import Deadline
from app.upstream import Upstream, UpstreamRequest, UpstreamResponse

_QUEUE_EVENTS = 256


class ClientGone(Exception):
    """The caller closed its connection; nobody is left to answer."""


@dataclass(frozen=True)
class Head:
    status: int
    headers: list[tuple[str, str]]
    attempts: int
    body: bytes | None  # None: an event stream follows on the queue


@dataclass(frozen=True)
class _Finished:
    leftover: bytes


class Exchange:
    """The upstream side of one request, running in its own greenlet."""

    def __init__(
        self, upstream: Upstream, req: UpstreamRequest, deadline: Deadline, *, max_body: int
    ) -> None:
        self.upstream = upstream
        self.req = req
        self.deadline = deadline
        self.max_body = max_body
        self.head: gevent.event.AsyncResult = gevent.event.AsyncResult()
        self.queue: gevent.queue.Queue = gevent.queue.Queue(maxsize=_QUEUE_EVENTS)
        self._resp: UpstreamResponse | None = None
        self.cancelled = False
        self._greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        try:
            resp = self._resp = self.upstream.open(self.req, self.deadline)
            ctype = resp.headers.get("content-type", "")
            if resp.status >= 300 or not ctype.startswith("text/event-stream"):
                body = self.upstream.read_all(resp, self.deadline, self.max_body)
                self.head.set(Head(resp.status, _header_list(resp), resp.attempts, body))
                return
            self.head.set(Head(resp.status, _header_list(resp), resp.attempts, None))
        except GatewayError as exc:
            self.head.set_exception(exc)
            return
        self._pump(resp)

    def _pump(self, resp: UpstreamResponse) -> None:
        decoder = sse.Decoder()
        try:
            while chunk := self.upstream.read_chunk(resp, self.deadline):
                for event in decoder.feed(chunk):
                    self.queue.put(event)
            self.queue.put(_Finished(decoder.close()))
            resp.raw.release_conn()
        except GatewayError as exc:
            self.queue.put(exc)
        finally:
            if not resp.raw.closed:
                resp.close()

    def cancel(self) -> None:
        """Stop the upstream call now: kill the greenlet, close the connection.

        The kill waits for the greenlet to unwind: it may be inside a read on the response,
        and only it can close that reader (closing it from here raises "reentrant call").
        Its own ``finally`` closes the connection; urllib3 discards one interrupted mid-call.
        """
        self._greenlet.kill(block=True, timeout=2.0)
        if self._resp is not None and not self._resp.raw.closed:
            self._resp.close()
        self.cancelled = True
        if not self.head.ready():
            self.head.set_exception(ClientGone())
        # Wake a waiting relay loop; when the queue is full the loop is not waiting and
        # sees `cancelled` before its next get.
        with contextlib.suppress(gevent.queue.Full):
            self.queue.put_nowait(ClientGone())


def relay(
    exchange: Exchange,
    *,
    heartbeat: float,
    expect_done: bool,
    on_ping: Callable[[], None] = lambda: None,
) -> Iterator[bytes]:
    """The caller's body: events as they arrive, pings between them, one error event at worst.

    Used only after the 200 is decided, so the head may still be pending (we are already
    sending pings while the upstream has not answered). A stream that ends without [DONE]
    and without an error event gets an error event: a stream never ends silently.
    """
    timeout = heartbeat if heartbeat > 0 else None
    while True:
        try:
            head = exchange.head.get(timeout=timeout)
            break
        except gevent.Timeout:
            on_ping()
            yield sse.comment()
        except ClientGone:
            return
        except GatewayError as exc:
            yield error_event(exc)
            return
    if head.body is not None:
        # The upstream answered after we had committed to a stream: carry its answer over
        # as one event (an error becomes the final error event).
        if head.status >= 300:
            yield b"data: " + wrap_upstream_body(head.status, head.body) + b"\n\n"
        else:
            yield head.body
        return
    saw_done = saw_error = False
    while not exchange.cancelled:
        try:
            item = exchange.queue.get(timeout=timeout)
        except gevent.queue.Empty:
            on_ping()
            yield sse.comment()
            continue
        if isinstance(item, sse.Event):
            saw_done = saw_done or item.is_done
            saw_error = saw_error or _is_error(item)
            yield item.raw
        elif isinstance(item, _Finished):
            if expect_done and not (saw_done or saw_error):
                yield error_event(UpstreamReset("Upstream ended the stream before [DONE]."))
            elif item.leftover:
                yield item.leftover
            return
        elif isinstance(item, ClientGone):
            return
        else:
            yield error_event(item)
            return


def error_event(exc: GatewayError) -> bytes:
    """The final event of a broken stream: the OpenAI SDK raises APIError on it."""
    return sse.encode_json(exc.to_body())


def _is_error(event: sse.Event) -> bool:
    if event.event == "error":
        return True
    if not event.data or '"error"' not in event.data[:32]:
        return False
    try:
        return isinstance(event.json().get("error"), dict)
    except (ValueError, AttributeError):
        return False


def _header_list(resp: UpstreamResponse) -> list[tuple[str, str]]:
    return list(resp.headers.items())


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
