"""An answer given before its request's body was read closes the connection; nobody reads
the rest.

Why: gunicorn keeps a connection for the next request by first reading and dropping what
the app left of this request's body (``Parser.finish_body``, with no bound). After the 401
to a stranger's 15 MB upload, that is the 15 MB the early 401 was meant to spare. So an
answer that begins with more than ``DRAIN_MAX_BYTES`` of its body unread, or an unread rest
of unknown size (a chunked body), closes the connection instead: the worker
(app/edge/worker.py) tells gunicorn, which then answers with ``Connection: close`` and stops
there. A smaller rest is left to gunicorn: dropping it costs less than a new connection.

Closing a socket whose receive buffer still holds bytes sends a RST, not a FIN, and nginx,
still sending the body, can meet that RST before it has read the answer: it then answers
502. So ``linger`` shuts the writing side first (the FIN follows the answer), reads and
drops what still arrives until the peer closes its end (nginx does once it has the answer)
or ``LINGER_S`` passed, and only then lets the connection close.

Imported by gunicorn's master with the worker class: the standard library and gevent only.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gevent

# An unread rest up to this size is gunicorn's to read and drop (the connection stays open
# for the next request); above it the connection closes. gunicorn's own cap on a drain it
# is allowed to abandon is the same 64 KiB.
DRAIN_MAX_BYTES = 64 * 1024
# At most this long reading and dropping after the answer, waiting for the peer to close.
# nginx closes within milliseconds of reading the answer; a client that neither closes nor
# stops sending is cut after it.
LINGER_S = 2.0

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


class CountedBody:
    """A request's ``wsgi.input`` that knows how much of the body was read."""

    def __init__(self, body: Any, length: int | None) -> None:
        self._body = body
        self._left = length  # None: chunked, whose end shows as a read that returns nothing
        self._ended = length == 0

    def large_rest_unread(self) -> bool:
        """Whether more than DRAIN_MAX_BYTES of the body, or a rest of unknown size, is
        still on the connection."""
        if self._ended:
            return False
        return self._left is None or self._left > DRAIN_MAX_BYTES

    def read(self, size: int | None = None) -> bytes:
        data: bytes = self._body.read(size)
        self._took(data, whole=size is None or size < 0, asked=size != 0)
        return data

    def readline(self, size: int | None = None) -> bytes:
        data: bytes = self._body.readline(size)
        self._took(data, whole=False, asked=size != 0)
        return data

    def readlines(self, hint: int | None = None) -> list[bytes]:
        lines: list[bytes] = self._body.readlines(hint)
        self._took(b"".join(lines), whole=hint is None or hint <= 0, asked=True)
        return lines

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")

    def _took(self, data: bytes, *, whole: bool, asked: bool) -> None:
        if self._left is not None:
            self._left -= len(data)
        if whole or (asked and not data) or (self._left is not None and self._left <= 0):
            self._ended = True


def body_length(environ: Environ) -> int | None:
    """The body's size as the request declares it; None for a chunked body."""
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    try:
        return max(0, int(environ.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return None


def counting_the_body(app: WSGIApp, on_large_rest: Callable[[Environ], None]) -> WSGIApp:
    """``app`` with each request's body counted: when an answer begins with a large rest of
    the body unread, ``on_large_rest(environ)`` runs first (before any byte of it is sent,
    so the worker can still make it say ``Connection: close``)."""

    def counted(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        body = CountedBody(environ["wsgi.input"], body_length(environ))
        environ["wsgi.input"] = body

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            if body.large_rest_unread():
                on_large_rest(environ)
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return counted


def linger(sock: socket.socket, seconds: float = LINGER_S) -> None:
    """Half-close ``sock`` after its last answer and drop what still arrives until the peer
    closes or ``seconds`` passed (see the module doc: no RST before the answer is read)."""
    with contextlib.suppress(OSError), gevent.Timeout(seconds, False):
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
