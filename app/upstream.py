"""The upstream adapter: the only owner of the urllib3 PoolManager.

One ``Upstream`` per worker, built by the app factory after gevent patched the process.
``open()`` sends one request with the retry policy and returns once the upstream's headers
are in; the body is then read with ``read_chunk()``, a bounded read that returns what has
arrived. Every urllib3/socket failure is translated here, once, into the GatewayError tree.

Timeouts: connect is urllib3's; first byte, idle and the total deadline are ``gevent.Timeout``
so each is exact and names its phase. A connection interrupted by one of them is closed by
urllib3 (it is never put back half-read), see ``HTTPConnectionPool.urlopen``'s clean-exit rule.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import gevent
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from app.config import Settings
from app.errors import (
    GatewayError,
    UpstreamError,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamTLSError,
    UpstreamUnreachable,
)
from app.metrics import Metrics
from app.policy import Deadline, RetryPolicy

_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class UpstreamRequest:
    method: str
    path: str  # below the upstream base URL, e.g. "/chat/completions"
    query: str
    headers: Mapping[str, str]
    body: bytes | None
    stream: bool


@dataclass
class UpstreamResponse:
    """The upstream's answer once its headers are in; the body is still on the socket."""

    raw: urllib3.BaseHTTPResponse
    attempts: int
    released: bool = False  # counted back as free in the pool's in-use figure

    @property
    def status(self) -> int:
        return self.raw.status

    @property
    def headers(self) -> urllib3.HTTPHeaderDict:
        return self.raw.headers

    def close(self) -> None:
        """Drop the connection: never drain a generation nobody will read."""
        self.raw.close()
        self.raw.release_conn()


class Upstream:
    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics | None = None,
        sleep=gevent.sleep,
        rand=random.random,
    ) -> None:
        self.settings = settings
        self.base = settings.upstream_url.rstrip("/")
        self.metrics = metrics
        self._sleep = sleep
        self._rand = rand
        self.in_use = 0
        self._idle_sampled = 0.0
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=settings.pool_size,
            block=False,
            retries=False,
            # The read timeout is only a backstop: idle and first-byte are enforced exactly
            # with gevent.Timeout, so a socket can never wait past the request's deadline.
            timeout=urllib3.Timeout(connect=settings.connect_timeout_s, read=settings.deadline_s),
            **_tls_options(settings),
        )
        if metrics is not None:
            self.pool.pool_classes_by_scheme = _counting_pools(metrics.connections_opened.inc)

    def _pool_changed(self, delta: int) -> None:
        self.in_use += delta
        if self.metrics is None:
            return
        self.metrics.pool.labels("in_use").set(self.in_use)
        now = time.monotonic()
        if delta > 0 or now - self._idle_sampled < 1.0:
            # Counting idle connections scans every pool: sampled at most once a second,
            # just after a connection went back (what "idle" means between requests).
            return
        self._idle_sampled = now
        idle = 0
        for key in list(self.pool.pools.keys()):
            pool = self.pool.pools.get(key)
            if pool is not None and pool.pool is not None:
                idle += sum(1 for conn in list(pool.pool.queue) if conn is not None)
        self.metrics.pool.labels("idle").set(idle)

    def done_with(self, resp: UpstreamResponse) -> None:
        """The response's connection went back to the pool or was closed: count it free."""
        if not resp.released:
            resp.released = True
            self._pool_changed(-1)

    def policy(self) -> RetryPolicy:
        s = self.settings
        return RetryPolicy(s.retries, s.retry_backoff_s, s.retry_backoff_max_s, s.retry_after_max_s)

    def open(self, req: UpstreamRequest, deadline: Deadline) -> UpstreamResponse:
        """Send ``req``, retrying what cannot have billed; return at the upstream's headers."""
        policy = self.policy()
        while True:
            policy = policy.increment()
            try:
                raw = self._attempt(req, deadline)
            except GatewayError as exc:
                if not exc.before_send:
                    raise
                delay = policy.delay_for_connect_error(self._rand)
                if delay is None or delay >= deadline.remaining():
                    # Retried already: tell the SDK not to multiply the calls again.
                    exc.retryable = policy.attempt == 1
                    raise
                self._retrying()
                self._sleep(delay)
                continue
            delay = policy.delay_for_status(raw.status, raw.headers, self._rand)
            if delay is None or delay >= deadline.remaining():
                self._pool_changed(+1)
                return UpstreamResponse(raw, policy.attempt)
            _discard(raw)
            self._retrying()
            self._sleep(delay)

    @contextlib.contextmanager
    def _phase(self, phase: str, limit: float, deadline: Deadline) -> Iterator[float]:
        """Bound the block by ``limit`` seconds or what is left of the deadline, whichever is
        shorter, and turn its expiry into the UpstreamTimeout naming that phase. Yields the
        seconds left of the deadline."""
        remaining = deadline.remaining()
        if remaining <= 0:
            raise UpstreamTimeout("deadline", self.settings.deadline_s)
        if remaining < limit:
            phase, limit, reported = "deadline", remaining, self.settings.deadline_s
        else:
            reported = limit
        timer = gevent.Timeout(limit)
        timer.start()
        try:
            yield remaining
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            raise UpstreamTimeout(phase, reported) from None
        finally:
            timer.close()

    def _retrying(self) -> None:
        if self.metrics is not None:
            self.metrics.retries.inc()

    def _attempt(self, req: UpstreamRequest, deadline: Deadline) -> urllib3.BaseHTTPResponse:
        s = self.settings
        url = self.base + req.path + (f"?{req.query}" if req.query else "")
        with self._phase("first_byte", s.first_byte_timeout_s, deadline) as remaining:
            try:
                return self.pool.urlopen(
                    req.method,
                    url,
                    body=req.body,
                    headers=dict(req.headers),
                    preload_content=False,
                    decode_content=True,
                    redirect=False,
                    retries=False,
                    timeout=urllib3.Timeout(
                        connect=min(s.connect_timeout_s, remaining), read=s.deadline_s
                    ),
                )
            except NewConnectionError as exc:
                raise UpstreamUnreachable(f"Upstream unreachable: {_reason(exc)}.") from None
            except SSLError as exc:
                # A certificate or handshake failure does not heal by retrying.
                raise UpstreamTLSError(f"TLS with the upstream failed: {_reason(exc)}.") from None
            except ConnectTimeoutError:
                error = UpstreamTimeout("connect", s.connect_timeout_s, retryable=True)
                error.before_send = True
                raise error from None
            except (ProtocolError, ReadTimeoutError, OSError, HTTPError) as exc:
                raise UpstreamReset(f"Upstream closed the connection: {_reason(exc)}.") from None

    def read_chunk(self, resp: UpstreamResponse, deadline: Deadline) -> bytes:
        """What has arrived of the body (b"" at its end), within the idle and total budgets.
        On any failure the response is closed: a half-read connection is never reused."""
        try:
            with self._phase("idle", self.settings.idle_timeout_s, deadline):
                return resp.raw.read1(_READ_SIZE)
        except GatewayError:
            resp.close()
            raise
        except (ProtocolError, ReadTimeoutError, OSError, HTTPError) as exc:
            resp.close()
            raise UpstreamReset(f"Upstream broke off the response: {_reason(exc)}.") from None

    def read_all(self, resp: UpstreamResponse, deadline: Deadline, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while chunk := self.read_chunk(resp, deadline):
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                resp.close()
                raise UpstreamError(f"Upstream response exceeds {limit} bytes.")
        resp.raw.release_conn()
        return b"".join(parts)


def _tls_options(settings: Settings) -> dict[str, Any]:
    """Certificates are always verified; a private CA can be trusted explicitly."""
    return {"ca_certs": settings.upstream_ca_bundle} if settings.upstream_ca_bundle else {}


def _counting_pools(on_connect: Callable[[], None]) -> dict[str, type]:
    """Pool classes whose connections report each new TCP connection (reuse shows as a flat
    count)."""

    class CountingHTTPConnection(HTTPConnection):
        def connect(self) -> None:
            super().connect()
            on_connect()

    class CountingHTTPSConnection(HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            on_connect()

    class CountingHTTPPool(HTTPConnectionPool):
        ConnectionCls = CountingHTTPConnection

    class CountingHTTPSPool(HTTPSConnectionPool):
        ConnectionCls = CountingHTTPSConnection

    return {"http": CountingHTTPPool, "https": CountingHTTPSPool}


def _discard(raw: urllib3.BaseHTTPResponse) -> None:
    """Throw away an answer we will retry. A short error body with a length is read so its
    connection goes back to the pool (a 429 storm then reconnects nothing); anything else
    is closed: reading a body of unknown size could cost more than a reconnect."""
    length = raw.headers.get("content-length", "")
    if length.isdigit() and int(length) <= _READ_SIZE:
        try:
            with gevent.Timeout(1.0):
                raw.read()
            raw.release_conn()
            return
        except (gevent.Timeout, HTTPError, OSError):
            pass
    raw.close()
    raw.release_conn()


def _reason(exc: BaseException) -> str:
    """urllib3's message without the connection object's repr in front."""
    message = str(exc)
    return message.split(">: ", 1)[1] if ">: " in message else message


__all__ = ["GatewayError", "Upstream", "UpstreamRequest", "UpstreamResponse"]
