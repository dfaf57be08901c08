"""Patch: a chunked body read beneath urllib3's response, through http.client's own.

urllib3's ``read1`` (content decoding, length accounting, an error-catching context manager
per call) cost about as much as the read itself, once per event of every stream
(bench/HISTORY.md, "A token a read"). For a body sent in chunks and not compressed (an
event stream, as providers send one) it does nothing that the chunked framing does not: the
reads here go to the ``http.client.HTTPResponse`` urllib3 keeps in its private ``_fp``, and a
stream's waits for data (``wait_readable``) look into that response's buffered reader and
its socket (``fp.fp.raw._sock``) and take the CRLF that ends a chunk as http.client's
``_get_chunk_left`` would, setting its ``chunk_left``.

It fits (``fits``) urllib3 2.x, whose response keeps the http.client one in ``_fp``, and
CPython 3.11 to 3.13, whose chunked ``read1`` reads through ``_get_chunk_left`` and whose
``SocketIO`` keeps its socket in ``_sock``. Where it does not, every body is read through
urllib3's own ``read1`` and no stream's read can wait without taking bytes (such reads run
in a greenlet of their own: app/streams/alone.py), said once.
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
from collections.abc import Callable
from typing import Any

import urllib3.response
from gevent.socket import wait_read

from app.core.timers import Alarm
from app.patches import refuse


def _names(function: Any) -> set[str]:
    code = getattr(function, "__code__", None)
    return set(code.co_names) if code is not None else set()


def fits() -> str | None:
    """None when urllib3's and http.client's internals are those these reads rely on."""
    if "_fp" not in _names(urllib3.response.HTTPResponse.__init__):
        return "urllib3's response keeps no _fp"
    chunked = getattr(http.client.HTTPResponse, "_read1_chunked", None)
    if not {"_get_chunk_left", "chunk_left", "fp"} <= _names(chunked):
        return "http.client's chunked read1 reads otherwise"
    left = getattr(http.client.HTTPResponse, "_get_chunk_left", None)
    if not {"chunk_left", "_safe_read", "_read_next_chunk_size"} <= _names(left):
        return "http.client ends a chunk otherwise"
    if "_sock" not in _names(socket.SocketIO.__init__):
        return "socket.SocketIO keeps no _sock"
    return None


@functools.cache
def usable() -> bool:
    """Whether it fits, looked at once per process (and said once when it does not)."""
    reason = fits()
    if reason is not None:
        refuse("chunked_reads", reason)
    return reason is None


def body_reader(raw: Any) -> Callable[[int], bytes]:
    """urllib3's read1; for a body sent in chunks and not compressed (an event stream, as
    providers send one), http.client's read1 beneath it. urllib3's layer (content decoding,
    length accounting, an error-catching context manager per call) cost about as much as
    the read itself, once per event of every stream, and does nothing for such a body: the
    chunked framing already tells a cut from an end (http.client raises IncompleteRead).
    A body with a Content-Length keeps urllib3's read, which checks that it came whole."""
    fp = getattr(raw, "_fp", None) if usable() else None
    if (
        isinstance(fp, http.client.HTTPResponse)
        and fp.chunked
        and not raw.headers.get("content-encoding")
    ):
        return fp.read1
    return raw.read1


def chunked_beneath(raw: Any) -> http.client.HTTPResponse | None:
    """The http.client response under urllib3's when its body is read through it
    (``body_reader``'s fast path: chunked, not compressed), else None."""
    fp = getattr(raw, "_fp", None) if usable() else None
    if (
        isinstance(fp, http.client.HTTPResponse)
        and fp.chunked
        and not raw.headers.get("content-encoding")
        and isinstance(fp.fp, io.BufferedReader)
        and hasattr(fp.fp.raw, "_sock")  # socket.SocketIO's socket: its readiness is waited on
    ):
        return fp
    return None


# What ``wait_readable`` found (falsy: nothing came in the alarm's time).
NOT_YET = 0
ARRIVED = 1  # the socket has data: ``read1`` goes on, and may still wait for a line's rest
BUFFERED = 2  # what ``read1`` needs is in the buffer: it returns without waiting at all


def wait_readable(fp: http.client.HTTPResponse, alarm: Alarm) -> int:
    """Whether ``fp.read1`` can go on without waiting on the upstream, once data came or
    ``alarm`` rang (NOT_YET); BUFFERED when it cannot wait at all, so its reader need not
    arm a timer around it. Nothing is lost while it waits: ``peek`` of an empty buffer
    waits for the socket before it reads anything (the alarm ends that wait, where no byte
    has been taken yet); the CRLF that ends a chunk is taken as http.client would take it
    (its ``chunk_left`` says so); and a buffer holding only part of what ``read1`` needs
    waits on the socket itself, or on nothing when TLS already holds decrypted bytes
    (ARRIVED: the read may still wait for the rest of a line that came in parts)."""
    buffered = fp.fp
    if buffered is None:
        return BUFFERED  # the body ended: the read says so at once
    alarm.arm()
    try:
        seen = buffered.peek(1)
        if fp.chunk_left == 0 and seen.startswith(b"\r\n"):
            # The CRLF that ends the last chunk, which read1 would take next: taken now
            # (from the buffer, no wait), so an empty buffer waits on the socket as a read
            # does, through the socket's own watcher, not a new one per event.
            buffered.read(2)
            fp.chunk_left = None
            seen = buffered.peek(1)
        if enough_buffered(seen, fp.chunk_left):
            return BUFFERED
        sock = fp.fp.raw._sock  # type: ignore[attr-defined]
        pending = getattr(sock, "pending", None)  # an SSLSocket's decrypted bytes
        if pending is None or not pending():
            wait_read(sock.fileno())
        return ARRIVED
    except Alarm as exc:
        if exc is not alarm:
            raise
        return NOT_YET
    except OSError:
        return ARRIVED  # a reset: the read meets it too, and reports it as the upstream's
    finally:
        alarm.disarm()


def enough_buffered(seen: bytes, chunk_left: int | None) -> bool:
    """Whether http.client's ``read1`` of a chunked body can return without waiting on the
    socket, given the bytes its buffer holds (``seen``) and its ``chunk_left``. Inside a
    chunk's data any byte will do; between chunks it first reads the CRLF that ends the
    last one (when ``chunk_left`` is 0) and the next size line, then one read of data, so
    the line must be whole with something after it. The last chunk's "0" line is followed
    by the CRLF that ends the body."""
    if chunk_left:
        return bool(seen)
    start = 2 if chunk_left == 0 else 0
    line_end = seen.find(b"\n", start)
    return line_end != -1 and line_end + 1 < len(seen)
