"""The socket side of one connection: writes, waits that notice hang-ups, framing, resets.

Every wait here ends early when the client goes away: a stalled or slow stream must not keep
a greenlet and a socket busy for an hour after the gateway gave up. While a response is
produced the socket is watched for readability; a readable socket whose
``recv(1, MSG_PEEK)`` returns b"" means the peer closed (a client sends nothing while it
waits for our response). Failures surface as ``ClientGone`` so callers can count them.
"""

from __future__ import annotations

import contextlib
import gzip as gzip_module
import select
import socket
import struct
import zlib
from collections.abc import Iterable
from typing import Any

from gevent.hub import Waiter, get_hub

from .http11 import LAST_CHUNK, chunk, response_head

SERVER = "llmgate-simulator"


class ClientGone(Exception):
    """The client closed or reset the connection before we were done."""


class Peer:
    """One accepted connection, seen from the code that answers on it.

    While a response is being produced, an io watcher stays armed on the socket (one
    ``epoll_ctl`` per response, not two per token); its callback runs in the hub, confirms a
    hang-up with a non-blocking peek and wakes the greenlet if it is parked in ``pause``.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._io: Any = None  # a gevent io watcher; gevent does not export its type
        self._waiter: Waiter[bool] | None = None
        self._gone = False

    def begin(self) -> None:
        """A response starts: watch for the client hanging up until ``end()``."""
        self._gone = False
        if self._io is None:
            self._io = get_hub().loop.io(self.sock.fileno(), 1)
        self._io.start(self._on_readable)

    def end(self) -> None:
        """The response is done: the next readable byte is the next request, not a hang-up."""
        if self._io is not None:
            self._io.stop()

    def send(self, data: bytes) -> None:
        if self._gone:
            raise ClientGone("client closed the connection")
        try:
            # One send() almost always takes a whole event; gevent's sendall() would first
            # query SO_SNDBUF with a getsockopt() call on every write.
            sent = self.sock.send(data)
            if sent < len(data):
                self.sock.sendall(memoryview(data)[sent:])
        except OSError as exc:
            raise ClientGone(str(exc)) from exc

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``; raise ClientGone as soon as the client hangs up."""
        if self._gone:
            raise ClientGone("client closed the connection")
        if seconds <= 0:
            return
        hub = get_hub()
        timer = hub.loop.timer(seconds)
        waiter: Waiter[bool] = Waiter(hub)
        timer.start(waiter.switch, False)
        self._waiter = waiter
        try:
            if waiter.get():
                raise ClientGone("client closed the connection")
        finally:
            self._waiter = None
            timer.close()

    def _on_readable(self) -> None:
        # Runs in the hub: it must not block, so recv() only after poll() said it won't.
        # poll(), not select(): descriptors above FD_SETSIZE (1024) are normal here.
        self._io.stop()  # level-triggered: either way, one look is enough
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        if not poller.poll(0):
            self._io.start(self._on_readable)
            return
        try:
            hung_up = self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            hung_up = True
        # Data instead of EOF: the client pipelined its next request. Stop watching and let
        # a failed write tell us if it leaves later.
        if hung_up:
            self._gone = True
            if self._waiter is not None:
                self._waiter.switch(True)

    def release(self) -> None:
        """Drop the wait watcher; must happen before the descriptor is closed."""
        if self._io is not None:
            self._io.close()
            self._io = None

    def reset(self) -> None:
        """Abort with a TCP RST: SO_LINGER on with a zero timeout, then close."""
        self.release()
        with contextlib.suppress(OSError):  # already dead: nothing left to reset
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def nodelay(self) -> bool:
        return bool(self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def base_headers(request_id: str, close: bool) -> list[tuple[str, str]]:
    headers = [("server", SERVER), ("x-request-id", request_id)]
    if close:
        headers.append(("connection", "close"))
    return headers


def send_full(
    peer: Peer,
    status: int,
    body: bytes,
    headers: Iterable[tuple[str, str]],
    *,
    content_type: str = "application/json",
    gzip: bool = False,
    close_delimited: bool = False,
) -> None:
    """A complete response in one write; header block and body never split (no Nagle wait)."""
    head = [*headers, ("content-type", content_type)]
    if gzip:
        body = gzip_module.compress(body, mtime=0)
        head.append(("content-encoding", "gzip"))
    if not close_delimited:
        head.append(("content-length", str(len(body))))
    peer.send(response_head(status, head) + body)


class StreamBody:
    """Writes one streamed body: chunked or close-delimited, optionally gzip-encoded.

    With gzip each write ends in a zlib sync flush, so every event the client receives is
    decodable on its own, before the next one is even produced.
    """

    def __init__(self, peer: Peer, *, chunked: bool, gzip: bool) -> None:
        self.peer = peer
        self.chunked = chunked
        self._zip = zlib.compressobj(wbits=31) if gzip else None

    def headers(self) -> list[tuple[str, str]]:
        headers = [("content-type", "text/event-stream; charset=utf-8")]
        headers.append(("cache-control", "no-cache"))
        if self._zip is not None:
            headers.append(("content-encoding", "gzip"))
        if self.chunked:
            headers.append(("transfer-encoding", "chunked"))
        return headers

    def start(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        self.peer.send(response_head(status, [*headers, *self.headers()]))

    def write(self, data: bytes) -> None:
        self.peer.send(self._frame(data))

    def _frame(self, data: bytes) -> bytes:
        if self._zip is not None:
            data = self._zip.compress(data) + self._zip.flush(zlib.Z_SYNC_FLUSH)
        return chunk(data) if self.chunked else data

    def finish(self, events: Iterable[bytes] = ()) -> None:
        """Write the last ``events`` and end the body, in one send: they are all due now."""
        out = [self._frame(event) for event in events]
        tail = self._zip.flush() if self._zip is not None else b""
        if self.chunked:
            out.append((chunk(tail) if tail else b"") + LAST_CHUNK)
        else:
            out.append(tail)
        self.peer.send(b"".join(out))
