"""The only module that imports urllib3. It owns the client's one connection pool.

The pool is a single ``HTTPConnectionPool`` for the gateway's origin with ``maxsize`` equal to
the client's ``pool_size`` and ``block=True``: a caller beyond that waits for a free
connection (bounded by its deadline) instead of opening another one, so a process never
holds more sockets to the gateway than ``pool_size``. Connections are HTTP/1.1 keep-alive
and return to the pool when a body has been read to its end.

urllib3's own retries and redirects are off (the client's policy decides). Every urllib3 or
socket exception is translated here, once, into the client's error tree. A response that is
abandoned early is closed, never drained, so the gateway sees the disconnect and stops
generating (DESIGN section 3); its pool slot is then handed back empty.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

import urllib3
from urllib3.exceptions import (
    ClosedPoolError,
    ConnectTimeoutError,
    EmptyPoolError,
    HTTPError,
    NewConnectionError,
    ReadTimeoutError,
    SSLError,
)

from .errors import (
    APIConnectionError,
    APIResponseError,
    APITimeoutError,
    DeadlineExceeded,
    LLMGateError,
)
from .policy import Deadline

_READ_SIZE = 65536
_DEADLINE_MID_BODY = "the total deadline expired while reading the response"


@dataclass(frozen=True)
class AttemptTimeouts:
    """Per-attempt limits, already capped by the call's deadline (``None`` = wait forever)."""

    pool: float | None
    connect: float
    read: float


class Transport:
    """One keep-alive connection pool to ``origin`` (``scheme://host:port``)."""

    def __init__(self, origin: str, *, pool_size: int, ca_certs: str | None = None) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        extra: dict[str, object] = {}
        if origin.startswith("https:") and ca_certs:
            extra["ca_certs"] = ca_certs
        self.pool_size = pool_size
        self._pool = urllib3.connection_from_url(
            origin, maxsize=pool_size, block=True, retries=False, **extra
        )

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        timeouts: AttemptTimeouts,
    ) -> Response:
        """Send one request and return once the status line and headers have arrived."""
        try:
            raw = self._pool.urlopen(
                method,
                url,
                body=body,
                headers=dict(headers),
                retries=False,
                redirect=False,
                assert_same_host=False,
                timeout=urllib3.Timeout(connect=timeouts.connect, read=timeouts.read),
                pool_timeout=timeouts.pool,  # type: ignore[arg-type]  # float is fine
                preload_content=False,
                release_conn=False,
            )
        except EmptyPoolError as exc:
            raise APITimeoutError(
                f"no free connection in the pool of {self.pool_size} within {timeouts.pool:.3g} s",
                request_sent=False,
            ) from exc
        except ClosedPoolError as exc:
            raise LLMGateError("the client is closed") from exc
        except (HTTPError, OSError) as exc:
            raise translate(exc, timeout=timeouts.read) from exc
        return Response(raw)

    def close(self) -> None:
        """Close idle connections; connections still in use close when their response ends."""
        self._pool.close()


class Response:
    """Status, lower-cased headers and an incremental body reader for one HTTP response."""

    def __init__(self, raw: urllib3.BaseHTTPResponse) -> None:
        self._raw = raw
        self.status: int = raw.status
        self.headers: dict[str, str] = {name.lower(): raw.headers[name] for name in raw.headers}
        self.done = False

    def read1(self, wait: float) -> bytes:
        """Return the bytes that have arrived (at least one), or b"" at the end of the body.

        ``wait`` bounds the silence before something arrives: the caller passes its idle
        timeout capped by its deadline, so a trickling server cannot stretch the deadline.
        """
        conn = self._raw.connection
        sock: socket.socket | None = getattr(conn, "sock", None)
        if sock is not None:
            sock.settimeout(wait)
        try:
            data = self._raw.read1(_READ_SIZE)
        except (HTTPError, OSError) as exc:
            self.abort()
            raise translate(exc, timeout=wait) from exc
        if not data:
            self.done = True
            self._raw.release_conn()
        return data

    def read_chunk(self, deadline: Deadline, idle: float) -> bytes:
        """``read1`` waiting at most ``idle`` and never past ``deadline``; a timeout caused by
        the deadline raises ``DeadlineExceeded`` (attempts and request id left to the caller)."""
        now = time.monotonic()
        if not deadline.expired(now):
            try:
                return self.read1(deadline.cap(idle, now))
            except APITimeoutError as exc:
                if not deadline.expired(time.monotonic()):
                    raise
                raise DeadlineExceeded(_DEADLINE_MID_BODY) from exc
        self.abort()
        raise DeadlineExceeded(_DEADLINE_MID_BODY)

    def read_all(self, deadline: Deadline, idle: float) -> bytes:
        """The whole body, each read bounded as in ``read_chunk``."""
        parts = []
        while chunk := self.read_chunk(deadline, idle):
            parts.append(chunk)
        return b"".join(parts)

    def not_an_event_stream(self, attempts: int = 1) -> APIResponseError | None:
        """The error when this response is not the event stream asked for (it is aborted
        then); None when it is."""
        kind = self.headers.get("content-type", "")
        if "text/event-stream" in kind:
            return None
        self.abort()
        return APIResponseError(
            f"expected an event stream, got {kind or 'no content type'!r}",
            status=self.status,
            request_id=self.headers.get("x-request-id"),
            attempts=attempts,
        )

    def abort(self) -> None:
        """Close the socket without draining and give the (now empty) pool slot back."""
        self.done = True
        self._raw.close()
        self._raw.release_conn()


def translate(exc: BaseException, *, timeout: float) -> APIConnectionError:
    """Map a urllib3/socket exception to the tree. Only connect-phase failures are marked
    ``request_sent=False``: after the request left, the server may be working on it."""
    if isinstance(exc, NewConnectionError):  # refused, unreachable, DNS (before ConnectTimeout)
        return APIConnectionError(f"cannot connect: {_reason(exc)}", request_sent=False)
    if isinstance(exc, ConnectTimeoutError):
        return APITimeoutError(f"connect timed out: {_reason(exc)}", request_sent=False)
    if isinstance(exc, (ReadTimeoutError, TimeoutError, socket.timeout)):
        return APITimeoutError(f"no data from the server for {timeout:.3g} s", request_sent=True)
    if isinstance(exc, SSLError):
        return APIConnectionError(f"TLS error: {_reason(exc)}", request_sent=False)
    return APIConnectionError(f"connection broken: {_reason(exc)}", request_sent=True)


def _reason(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    inner = args[-1] if args else exc
    return str(inner) if not isinstance(inner, BaseException) else f"{inner!r}"
