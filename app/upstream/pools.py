"""The upstream connections beneath app/upstream/transport.py: urllib3's pools as the gateway
uses them.

What is here moves bytes and nothing else: the pool classes (each connection reads its
answers through a small buffer and reports every new TCP connection), the reader chosen for
an answer's body, how an answer that will be retried is given up, and the origin and
request target of an upstream URL. Which upstream, when to retry and how long to wait are
app/upstream/attempts.py's.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import queue
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import gevent
import urllib3
from gevent.socket import wait_read
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError

# The most read at once from an answer, and the largest error body read (not dropped) to
# keep its connection when the call is retried.
READ_SIZE = 64 * 1024
# http.client reads an answer through a buffered file of 8 KiB, allocated while the answer is
# open: for a held stream, its largest single allocation. An event with its chunk framing fits
# in far less, and a larger read goes past the buffer to the socket anyway.
READ_BUFFER = 2048


class _SmallBufferResponse(http.client.HTTPResponse):
    def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
        # http.client.HTTPResponse only asks its socket for a file.
        super().__init__(cast(socket.socket, _BufferedBy(sock, READ_BUFFER)), *args, **kwargs)


class _BufferedBy:
    """A socket as http.client.HTTPResponse uses it: a file to read, with this buffer."""

    def __init__(self, sock: Any, size: int) -> None:
        self._sock, self._size = sock, size

    def makefile(self, mode: str) -> Any:
        return self._sock.makefile(mode, buffering=self._size)


class _GrowsAhead(HTTPConnectionPool):
    """A pool that, when a call finds no idle connection and must open one on its way, tops
    itself up behind it in a greenlet to ``spare_ratio`` more connections than that moment
    had in use: opened, connected (TCP and TLS) and put in the pool. Such a moment is the
    busiest the pool has met (every connection it holds is in use), so the next busier one
    finds connections ready instead of paying a handshake on a call's way, and a load that
    wavers around its level opens nothing more once its peak plus the spares is reached.
    The spares are counted over that moment, not over the calls still under way when they
    are opened: calls that end meanwhile leave their connections idle, and those are not
    headroom over the peak. The pool's maxsize still bounds everything (a spare takes one of
    its free places)."""

    spare_ratio = 0.0
    on_spare: Callable[[], None] | None = None  # told of each spare opened
    _growing = False
    _opening = 0  # the free place a spare being connected has taken (one at a time)
    _wanted = 0  # connections to hold, in use or idle: the busiest moment's and its spares

    def _new_conn(self) -> Any:
        conn = super()._new_conn()
        if self.spare_ratio > 0 and (slots := self.pool) is not None:
            # A call found no idle connection on top and took a free place: the busiest
            # moment yet. Its calls' connections are the places out of the queue, this new
            # one's among them, but for a spare's being connected.
            in_use = slots.maxsize - slots.qsize() - self._opening
            wanted = in_use + int(in_use * self.spare_ratio)
            self._wanted = max(self._wanted, wanted) if self._growing else wanted
            if not self._growing:
                self._growing = True
                gevent.spawn(self._open_spares)
        return conn

    def _open_spares(self) -> None:
        try:
            while (slots := self.pool) is not None:
                held = slots.maxsize - slots.queue.count(None)
                if held >= self._wanted or not _take_free_place(slots):
                    return
                self._opening = 1
                try:
                    opened = self._open_spare()
                finally:
                    self._opening = 0
                if not opened:
                    return
                if self.on_spare is not None:
                    self.on_spare()
        finally:
            self._growing = False

    def _open_spare(self) -> bool:
        """A spare in the free place taken for it: connected (TCP and TLS) and pooled, True;
        or, when it fails, the place given back, False. Not worth a retry here: the next
        call that needs one connects itself and reports what fails."""
        conn = super()._new_conn()
        try:
            started = time.monotonic()
            conn.connect()
            _read_session_tickets(getattr(conn, "sock", None), time.monotonic() - started)
        except (OSError, HTTPError):
            conn.close()
            self._put_conn(None)
            return False
        conn.connect_s = 0.0  # type: ignore[attr-defined]  # on no call's way
        self._put_conn(conn)
        return True


def _read_session_tickets(sock: Any, handshake_s: float) -> None:
    """Take in what a TLS 1.3 server sends just after the handshake: its session tickets.
    Left unread on a connection nobody has used yet, they make it readable, which urllib3
    takes for a connection the server closed when a call picks it: it would be thrown away
    and a new one opened on the call's way. They come about a round trip after the
    handshake ends; more may follow at once. OSError when the server closed instead."""
    if getattr(sock, "version", lambda: None)() != "TLSv1.3":
        return
    wait = max(0.05, 2 * handshake_s)
    timeout = sock.gettimeout()
    sock.settimeout(0.0)  # reads that take in what is there and never wait
    try:
        while True:
            try:
                wait_read(sock.fileno(), timeout=wait)
            except TimeoutError:
                return
            try:
                if not sock.recv(READ_SIZE):
                    raise ConnectionResetError("the upstream closed a new connection")
                raise OSError("the upstream sent data nobody asked for")
            except ssl.SSLWantReadError:
                pass  # the tickets were read; no data
            wait = min(wait, 0.05)  # a ticket sent apart from the first
    finally:
        sock.settimeout(timeout)


def _take_free_place(slots: queue.LifoQueue) -> bool:
    """Take a free place (a None) from a pool's queue, under the idle connections that a
    `get` would return first; False when there is none (every place in use). The queue is
    gevent's in a worker (greenlets do not preempt: no lock), the standard one elsewhere."""
    with getattr(slots, "mutex", contextlib.nullcontext()):
        try:
            slots.queue.remove(None)
        except ValueError:
            return False
    return True


def pool_classes(
    on_connect: Callable[[], None] | None,
    *,
    spare_ratio: float = 0.0,
    on_spare: Callable[[], None] | None = None,
) -> dict[str, type]:
    """Pool classes whose connections read answers through a small buffer (READ_BUFFER) and
    report each new TCP connection to ``on_connect`` (reuse shows as a flat count), opening
    spares ahead of need (_GrowsAhead) when ``spare_ratio`` is above 0, each also reported to
    ``on_spare``."""

    class CountingHTTPConnection(HTTPConnection):
        response_class = _SmallBufferResponse
        connect_s = 0.0  # the last connect's seconds, until a call takes them (connect_seconds)

        def connect(self) -> None:
            started = time.monotonic()
            super().connect()
            self.connect_s = time.monotonic() - started
            if on_connect is not None:
                on_connect()

    class CountingHTTPSConnection(HTTPSConnection):
        response_class = _SmallBufferResponse
        connect_s = 0.0

        def connect(self) -> None:
            started = time.monotonic()
            super().connect()
            self.connect_s = time.monotonic() - started
            if on_connect is not None:
                on_connect()

    class CountingHTTPPool(_GrowsAhead):
        ConnectionCls = CountingHTTPConnection

    class CountingHTTPSPool(_GrowsAhead, HTTPSConnectionPool):
        ConnectionCls = CountingHTTPSConnection

    for pool in (CountingHTTPPool, CountingHTTPSPool):
        pool.spare_ratio = spare_ratio
        pool.on_spare = staticmethod(on_spare) if on_spare is not None else None
    return {"http": CountingHTTPPool, "https": CountingHTTPSPool}


class Raw(Protocol):
    """An answer with its body still on the socket: urllib3's response, or one translated
    from another provider's dialect as it is read (app/upstream/translation.py)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> urllib3.HTTPHeaderDict: ...

    @property
    def closed(self) -> bool: ...

    def read1(self, amt: int | None = None) -> bytes: ...

    def read(self) -> bytes: ...

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


def connect_seconds(raw: object) -> float:
    """The seconds the connection ``raw`` came on spent connecting on this call's way (TCP,
    and TLS for https), taken once: 0.0 for a reused connection, or an answer with no
    connection of ours beneath it. Read at the answer's headers, while it holds the
    connection; a translated answer (app/upstream/translation.py) says its own's."""
    conn = getattr(raw, "connection", None)
    seconds = getattr(conn, "connect_s", 0.0)
    if seconds:
        conn.connect_s = 0.0  # type: ignore[union-attr]
    return seconds if isinstance(seconds, float) else 0.0


def discard(raw: Raw) -> None:
    """Throw away an answer we will retry. A short error body with a length is read so its
    connection goes back to the pool (a 429 storm then reconnects nothing); anything else
    is closed: reading a body of unknown size could cost more than a reconnect."""
    length = raw.headers.get("content-length", "")
    if length.isdigit() and int(length) <= READ_SIZE:
        try:
            with gevent.Timeout(1.0):
                raw.read()
            raw.release_conn()
            return
        except (gevent.Timeout, HTTPError, OSError):
            pass
    raw.close()
    raw.release_conn()


@functools.cache
def origin(base_url: str) -> str:
    """``scheme://host[:port]`` of a base URL, as it begins every URL made from it."""
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}"


def target(url: str) -> str:
    """The origin-form request target of an absolute URL: its path and query."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
