"""The gunicorn worker class: gevent's, with gunicorn's own error answers in OpenAI JSON.

Why it exists: requests that gunicorn's HTTP parser refuses (a duplicated Content-Type,
too many headers, a request line over ``limit_request_line``, a malformed line) never
reach Flask. gunicorn answers them itself from ``Worker.handle_error`` through
``gunicorn.util.write_error``, which writes an HTML page, and nginx passes that page on
to the caller. This worker swaps that one function, in its own process, for one writing
the same status as ``{"error": {"message", "type", "param", "code"}}``; gunicorn's
classification of the error, its logging and its access log line stay as they are.

The master imports this module to find the class, so it imports only gunicorn, gevent
(which gunicorn's own gevent worker imports there too) and the pure ``app.core.errors``:
nothing that opens sockets or must come after gevent's patching.

On SIGTERM it also starts the gateway's drain (app/streams/drain.py): unready at once, and
no stream cut silently when gunicorn's graceful timeout runs out. Idle keep-alive
connections, which gunicorn counts as calls in progress, are closed so that they do not
hold a stopping worker for that whole timeout — but only once idle for IDLE_CLOSE_AFTER_S
since the drain began or since their last answer, whichever is later: an answer that was
under way when the drain began promised nginx a next request on its connection. Until then a
request on one is answered (with ``Connection: close``), and nginx, whose idle connections to
gunicorn last less than that, closes its own first: a connection the server closes while
nginx sends on it fails that call with a 502 (a POST is never retried). A connection is idle
from the end of an answer until the first byte of the next request arrives, not until its
parsing ends.

An answer that begins with a large part of its request's body unread (the 401 to a stranger's
upload, say) closes its connection after it, rather than gunicorn reading that rest to keep
the connection; the worker first lingers so that nginx reads the answer (app/edge/unread_body.py).

gunicorn logs a request it could not parse as it was received (``Invalid request from
ip=...: Invalid HTTP request line: 'GET /v1/models?api-key=sk-... HTTP/1.1'``), and a request
that failed in the app with its whole URI: either may carry a caller's key. A filter on
gunicorn's error logger keeps what kind of error it was and drops what the caller sent.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Any

import gevent
import gevent.socket
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from app.core.errors import GatewayError
from app.edge.unread_body import Environ, counting_the_body, linger

# Seconds a keep-alive connection of a draining worker stays idle (counted from the start of
# the drain or from its last answer, whichever is later) before the worker closes it: longer
# than nginx's keepalive_timeout toward gunicorn (15 s, nginx/llmgate.conf.template), so nginx
# has closed its end by then (tests/unit/runner/test_nginx_render.py holds them apart). A worker
# with idle connections open stops up to this long after SIGTERM or after its last answer.
IDLE_CLOSE_AFTER_S = 16.0

# gunicorn's statuses -> (OpenAI error type, code); see Worker.handle_error.
_KINDS = {
    400: ("invalid_request_error", "bad_request"),
    403: ("permission_error", "forbidden"),
    414: ("invalid_request_error", "uri_too_long"),
    417: ("invalid_request_error", "expectation_failed"),
    431: ("invalid_request_error", "headers_too_large"),
    500: ("api_error", "internal_error"),
    501: ("invalid_request_error", "not_implemented"),
}


def error_answer(status: int, reason: str, mesg: str) -> bytes:
    """A complete HTTP response for gunicorn's error ``status``, with an OpenAI JSON body."""
    default = ("api_error", None) if status >= 500 else ("invalid_request_error", None)
    kind, code = _KINDS.get(status, default)
    if status >= 500:
        message = "Internal gateway error."  # details are in the log, not for the caller
    else:
        message = f"{reason}: {mesg}"[:500] if mesg else reason
    body = GatewayError(message, status=status, type=kind, code=code).to_json()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class WithoutRequestContent(logging.Filter):
    """Redacts gunicorn's log lines that quote what a caller sent (see the module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Invalid request from ip="):
            # gunicorn's parser errors quote the offending bytes with %r: cut at the quote.
            cut = min((i for i in (message.find("'"), message.find('"')) if i >= 0), default=-1)
            if cut >= 0:
                record.msg, record.args = message[:cut] + "(request content not logged)", ()
        elif message.startswith("Error handling request ") and isinstance(record.args, tuple):
            # ("Error handling request %s %s", method, uri): the path, never the query.
            record.args = tuple(
                a.partition("?")[0] if isinstance(a, str) else a for a in record.args
            )
        return True


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """Drop-in for gunicorn.util.write_error (same signature, same non-blocking write)."""
    util.write_nonblock(sock, error_answer(status_int, reason, mesg))


class _OneSendSocket(gevent.socket.socket):
    """A client connection whose writes that fit the socket's buffer (nearly all: a stream
    writes an event or a few at a time) go out in one send. gevent's sendall first asks
    the buffer's size, a getsockopt system call for every write of every stream.

    It also leaves the worker's idle connections (``idle``) as soon as a byte of a request
    arrives: gunicorn reads and parses a request before the worker hears of it."""

    __slots__ = ("idle",)
    idle: dict[socket.socket, float]

    def sendall(self, data: bytes, flags: int = 0) -> None:
        sent = self.send(data, flags)
        if sent < len(data):
            super().sendall(memoryview(data)[sent:], flags)

    def recv(self, *args: int) -> bytes:
        data = super().recv(*args)
        if data:
            self.idle.pop(self, None)
        return data


class JSONErrorGeventWorker(GeventWorker):
    # Connections between two requests (keep-alive), with when each became idle: gunicorn
    # counts each as a call in progress, so one idle caller would hold a stopping worker for
    # the whole graceful timeout. While stopping they are closed once idle long enough (see
    # the module doc); an answer begun while stopping says "Connection: close" (gunicorn's).
    _idle: dict[socket.socket, float]
    _drain_began: float | None
    # gunicorn's request in progress on each connection, and the connections whose answer
    # left a large rest of the body unread: they close after it (app/edge/unread_body.py).
    _answering: dict[socket.socket, Any]
    _closing: set[socket.socket]
    wsgi: Any  # gunicorn's: what serves each request (load_wsgi)
    _application: object  # the WSGI app itself (self.wsgi counts the bodies around it)

    def handle(self, listener: socket.socket, client: socket.socket, addr: object) -> None:
        if type(client) is gevent.socket.socket:  # plain TCP or unix (TLS is nginx's)
            timeout = client.gettimeout()
            client = _OneSendSocket(client.family, client.type, client.proto, client.detach())
            client.settimeout(timeout)
            client.idle = self._idle
        self._idle[client] = time.monotonic()
        try:
            super().handle(listener, client, addr)
        finally:
            self._idle.pop(client, None)

    def handle_request(
        self, listener_name: object, req: object, sock: socket.socket, addr: object
    ) -> None:
        self._idle.pop(sock, None)
        self._answering[sock] = req
        try:
            super().handle_request(listener_name, req, sock, addr)
        finally:
            del self._answering[sock]
            if sock in self._closing:
                self._closing.discard(sock)
                linger(sock)
            # Idle again, stopping or not: an answer begun before the drain promised nginx a
            # next request here, which may be on its way; it is closed with the others.
            self._idle[sock] = time.monotonic()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self._application = self.wsgi
        self.wsgi = counting_the_body(self.wsgi, self._close_after_answer)

    def _close_after_answer(self, environ: Environ) -> None:
        """The answer now beginning leaves a large rest of its body unread: gunicorn says
        ``Connection: close`` and closes after it instead of reading that rest."""
        sock = environ.get("gunicorn.socket")
        req = self._answering.get(sock)  # type: ignore[arg-type]
        if req is not None:
            req.force_close()
            self._closing.add(sock)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: object) -> None:
        """SIGTERM: gunicorn stops accepting and waits its graceful timeout; the gateway
        turns unready and ends what is still running before that cut (app/streams/drain.py),
        and idle keep-alive connections are closed so they do not hold the worker."""
        super().handle_exit(sig, frame)
        if self._drain_began is None:
            self._drain_began = time.monotonic()
            gevent.spawn(self._close_idle_while_stopping)
        extensions = getattr(self._application, "extensions", {})
        gateway = extensions.get("llmgate") if isinstance(extensions, dict) else None
        if gateway is not None:
            gevent.spawn(gateway.lifecycle.drain, self.cfg.graceful_timeout)

    def _close_idle_while_stopping(self) -> None:
        """Close each idle connection once idle for IDLE_CLOSE_AFTER_S since the drain
        began or since its last answer, whichever is later; until the worker exits."""
        assert self._drain_began is not None
        while True:
            now = time.monotonic()
            due = [
                (max(since, self._drain_began) + IDLE_CLOSE_AFTER_S, sock)
                for sock, since in self._idle.items()
            ]
            for at, sock in due:
                if at <= now:
                    del self._idle[sock]
                    _stop_reading(sock)
            later = [at for at, _ in due if at > now]
            gevent.sleep(min(later, default=now + IDLE_CLOSE_AFTER_S) - now)

    def init_process(self) -> None:
        self._idle = {}
        self._drain_began = None
        self._answering = {}
        self._closing = set()
        self._application = None  # until load_wsgi (a SIGTERM may come first)
        # In the forked worker only (the master never writes error pages); handle_error
        # looks the function up on gunicorn.util at each call.
        util.write_error = write_json_error
        logging.getLogger("gunicorn.error").addFilter(WithoutRequestContent())
        super().init_process()


def _stop_reading(sock: socket.socket) -> None:
    """The connection's handler, waiting for a next request, reads EOF and closes it (what
    was written still goes out: only the reading side is shut)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
