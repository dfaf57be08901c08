"""The wire to the upstreams: the only owner of the worker's urllib3 PoolManager.

A request goes out as its upstream wants it (``_prepare``: the upstream's URL, key, headers,
an aliased model) on that upstream's pool, and ``send`` returns at the answer's headers; the
body is then read through ``UpstreamResponse.read1``. Every urllib3 and socket failure,
sending or reading, is translated here, once, into the GatewayError tree. Nothing here
decides: which upstream, when to retry and how long to wait are app/upstream/attempts.py's,
what an answer means app/upstream/reading.py's, how an attempt is accounted for
app/upstream/ledger.py's.

Timeouts: connect is urllib3's; first byte is a ``gevent.Timeout`` (``_phase``), exact and
naming its phase; the idle and total timers of the body's reads are reading.py's. A
connection interrupted by one of them is closed by urllib3 (it is never put back half-read),
see ``HTTPConnectionPool.urlopen``'s clean-exit rule.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import gevent
import urllib3
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from app.core.config import Settings
from app.core.errors import (
    BadRequest,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamTLSError,
    UpstreamUnreachable,
)
from app.core.reasons import reason
from app.core.timers import Alarm
from app.observe.metrics import Metrics
from app.observe.tracing import Span
from app.observe.unobserved import UNOBSERVED
from app.patches import chunked_reads
from app.request import jsonedit
from app.request.affinity import Affinity
from app.request.headers import with_upstream_key
from app.request.routes import PASSTHROUGH, Route
from app.upstream import pools, prompt_cache
from app.upstream.attempt import Attempt
from app.upstream.catalog import UpstreamSpec
from app.upstream.retry import Deadline
from app.upstream.translation import Outgoing, Translation, translation_for

Raw = pools.Raw  # an answer, body still on the socket


@dataclass(frozen=True)
class UpstreamRequest:
    method: str
    path: str  # below the upstream base URL, e.g. "/chat/completions"
    query: str
    headers: Mapping[str, str]
    body: bytes | None
    stream: bool
    model: str | None = None  # routes the call to the upstreams that serve it
    upstreams: tuple[str, ...] | None = None  # the names it may use (a gateway key's); "*": any
    route: Route = PASSTHROUGH  # the call's route (app/request/routes.py)
    # Tracing on: the caller's request span, each attempt's child of it; an attempt is sent
    # with its own span in place (its traceparent goes upstream). None: tracing is off.
    span: Span | None = None
    # The conversation it belongs to (app/request/affinity.py): which upstream's prompt cache
    # holds its prefix; None: a call with no prompt to keep warm.
    affinity: Affinity | None = None
    # A continuation's request (app/upstream/continuation.py): its last turn is the answer so
    # far, which a translation to an OpenAI-kind server marks as the partial turn to go on.
    continuing: bool = False


@dataclass
class UpstreamResponse:
    """The upstream's answer once its headers are in; the body is still on the socket."""

    raw: Raw
    attempts: int
    # Its attempt's life (app/upstream/attempt.py): whether the body was read to its end,
    # broke, was judged and released, and what its breaker heard; app/upstream/ledger.py
    # accounts for it.
    attempt: Attempt
    span: Span | None = None  # the attempt's span, ended when the exchange is done
    idle_timer: Alarm | None = None  # armed again for each read (app/upstream/reading.py)
    patience_timer: Alarm | None = None  # the same for each wait for data (wait_readable)
    # The body's reader, chosen at its first read (chunked_reads.body_reader): not an argument.
    _read: Callable[[int], bytes] | None = field(default=None, init=False, repr=False)
    # The http.client response a stream's waits look into, once looked up (``_looked``).
    _chunked: http.client.HTTPResponse | None = field(default=None, init=False, repr=False)
    _looked: bool = field(default=False, init=False, repr=False)

    def can_wait(self) -> bool:
        """Whether its reads can wait for data without taking any (``wait_readable``)."""
        return self._beneath() is not None

    def _beneath(self) -> http.client.HTTPResponse | None:
        """``chunked_reads.chunked_beneath``, looked up once: it is asked before every read."""
        if not self._looked:
            self._chunked, self._looked = chunked_reads.chunked_beneath(self.raw), True
        return self._chunked

    def wait_readable(self, timeout: float | None) -> int:
        """Wait at most ``timeout`` seconds (None: not at all) for data the next read can
        take without waiting: ``chunked_reads.wait_readable``'s NOT_YET when none came, BUFFERED
        when the read cannot wait at all. A body that cannot be waited on (``can_wait``) is
        always ready (ARRIVED): its reads wait as they would."""
        if timeout is None:
            return chunked_reads.ARRIVED
        fp = self._chunked if self._looked else self._beneath()
        if fp is None:
            return chunked_reads.ARRIVED
        if self.patience_timer is None or self.patience_timer.seconds != timeout:
            if self.patience_timer is not None:
                self.patience_timer.close()
            self.patience_timer = Alarm(max(timeout, 0.001))
        return chunked_reads.wait_readable(fp, self.patience_timer)

    def read1(self, size: int) -> bytes:
        """What has arrived of the body, up to ``size`` bytes (b"" at its end); a failed
        read is UpstreamReset. A timer's exception passes through untouched."""
        if self._read is None:
            self._read = chunked_reads.body_reader(self.raw)
        try:
            return self._read(size)
        except (
            ProtocolError,
            ReadTimeoutError,
            OSError,
            HTTPError,
            http.client.HTTPException,
        ) as exc:
            raise UpstreamReset(f"Upstream broke off the response: {reason(exc)}.") from None

    @property
    def upstream(self) -> str:
        """The configured name of the upstream that answered."""
        return self.attempt.upstream

    @property
    def status(self) -> int:
        return self.raw.status

    @property
    def headers(self) -> urllib3.HTTPHeaderDict:
        return self.raw.headers

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def release(self) -> None:
        """Read to its end: its connection goes back to the pool."""
        self.raw.release_conn()

    def close(self) -> None:
        """Drop the connection: never drain a generation nobody will read."""
        self.raw.close()
        self.raw.release_conn()
        for timer in (self.idle_timer, self.patience_timer):
            if timer is not None:
                timer.close()
        self.idle_timer = self.patience_timer = None


class Transport:
    """The worker's connections to its upstreams: one PoolManager, each upstream's pool
    found once, and the figures of its connections in use and idle."""

    def __init__(
        self, settings: Settings, *, upstreams: int = 1, metrics: Metrics = UNOBSERVED
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.in_use = 0
        self._idle_sampled = 0.0
        self._pools: dict[str, HTTPConnectionPool] = {}  # by spec name (_pool_for)
        self.pool = urllib3.PoolManager(
            num_pools=max(4, 2 * upstreams),
            maxsize=settings.pool_size,
            block=False,
            retries=False,
            # No socket read timeout: every read is bounded by one of our gevent timers (first
            # byte, idle, deadline), exact and named. A socket timeout as well would make gevent
            # build a Timeout for every wait on the socket, once per event of every stream.
            timeout=urllib3.Timeout(connect=settings.connect_timeout_s, read=None),
            **_tls_options(settings),
        )
        opened = metrics.connections_opened.inc
        self.pool.pool_classes_by_scheme = pools.pool_classes(
            opened,
            spare_ratio=settings.pool_spare_ratio,
            on_spare=metrics.connections_spare.inc,
        )

    def send(self, spec: UpstreamSpec, req: UpstreamRequest, deadline: Deadline) -> Raw:
        """``req`` sent to ``spec`` as it wants it; the answer at its headers, within the
        connect and first-byte timeouts and what is left of ``deadline``."""
        s = self.settings
        translation = translation_for(spec.kind, req.route)
        sent = None
        if translation is None:
            url, headers, body = _prepare(spec, req)
        else:
            url, headers, body, sent = _translated(spec, req, translation)
        if req.span is not None:
            headers = req.span.inject(headers)
        pool, target = self._pool_for(spec, url)
        with self._phase("first_byte", s.first_byte_timeout_s, deadline) as remaining:
            try:
                raw = pool.urlopen(
                    req.method,
                    target,
                    body=body,
                    headers=headers,
                    preload_content=False,
                    decode_content=True,
                    redirect=False,
                    retries=False,
                    timeout=urllib3.Timeout(connect=min(s.connect_timeout_s, remaining), read=None),
                )
            except NewConnectionError as exc:
                raise UpstreamUnreachable(f"Upstream unreachable: {reason(exc)}.") from None
            except SSLError as exc:
                # A certificate or handshake failure does not heal by retrying.
                raise UpstreamTLSError(f"TLS with the upstream failed: {reason(exc)}.") from None
            except ConnectTimeoutError:
                raise UpstreamTimeout(
                    "connect", s.connect_timeout_s, retryable=True, before_send=True
                ) from None
            except (ProtocolError, ReadTimeoutError, OSError, HTTPError) as exc:
                raise UpstreamReset(f"Upstream closed the connection: {reason(exc)}.") from None
        if translation is None or sent is None:
            return raw
        prompt = len(req.body or b"")
        return translation.answer(
            raw, sent, limit=s.max_body_bytes, max_event=s.max_event_bytes, prompt_bytes=prompt
        )

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

    def _pool_for(self, spec: UpstreamSpec, url: str) -> tuple[HTTPConnectionPool, str]:
        """The connection pool for ``url`` from the worker's PoolManager and the request
        target (origin-form) to send on it. A spec's pool is looked up once, not per request
        as PoolManager.urlopen does (it parses the URL and builds a pool key every time).
        urllib3 does not close a pool its manager evicts, so the one held here stays usable;
        one closed all the same is looked up again."""
        origin = pools.origin(spec.base_url)
        pool = self._pools.get(spec.name)
        if pool is None or pool.pool is None or not url.startswith(origin):
            kwargs = {"maxsize": spec.max_connections} if spec.max_connections else None
            pool = self.pool.connection_from_url(url, pool_kwargs=kwargs)
            if not url.startswith(origin):  # {model} in the host: a pool per model's host
                return pool, pools.target(url)
            self._pools[spec.name] = pool
        return pool, url[len(origin) :] or "/"

    def count_in_use(self, delta: int) -> None:
        """An answer's connection handed to an exchange (+1) or given back (-1)."""
        self.in_use += delta
        if not self.metrics.watched:
            return  # the idle connections are not counted for nobody
        self.metrics.pool.labels("in_use").set(self.in_use)
        now = time.monotonic()
        if delta > 0 or now - self._idle_sampled < 1.0:
            # Counting idle connections scans every pool: sampled at most once a second,
            # just after a connection went back (what "idle" means between requests).
            return
        self._idle_sampled = now
        # The manager's pools, and ours it may have evicted since (_pool_for).
        known = {id(pool): pool for pool in self._pools.values()}
        for key in list(self.pool.pools.keys()):
            pool = self.pool.pools.get(key)
            if pool is not None:
                known[id(pool)] = pool
        idle = 0
        for pool in known.values():
            if pool.pool is not None:
                idle += sum(1 for conn in list(pool.pool.queue) if conn is not None)
        self.metrics.pool.labels("idle").set(idle)


def _prepare(spec: UpstreamSpec, req: UpstreamRequest) -> tuple[str, dict[str, str], bytes | None]:
    """The URL, headers and body of ``req`` as ``spec`` wants them: its base URL (with an
    aliased model in place of {model}), its query and headers, its key, its model name."""
    model = spec.model_for(req.model) if req.model else ""
    base = spec.base_url.replace("{model}", quote(model, safe=""))
    query = "&".join(filter(None, [req.query, urlencode(spec.query)]))
    url = base + req.path + (f"?{query}" if query else "")
    headers = with_upstream_key(
        dict(req.headers), spec.key, auth=spec.auth, fallback_only=spec.key_fallback
    )
    headers.update(spec.headers)
    body = req.body
    if req.model and model != req.model and body:
        body = _renamed(body, model)
    return url, headers, prompt_cache.edited(spec, req.route, req.affinity, body)


def _translated(
    spec: UpstreamSpec, req: UpstreamRequest, translation: Translation
) -> tuple[str, dict[str, str], bytes, Outgoing]:
    """The URL, headers and body of ``req`` in ``spec``'s dialect (app/upstream/translation.py),
    and what was sent, for the answer's translation."""
    if req.body is None:
        raise BadRequest("A translated call needs a JSON body.", code="invalid_body")
    sent = translation.request(spec, req.body, req.headers, req.affinity, req.continuing)
    model = quote(sent.model, safe="")
    base = spec.base_url.replace("{model}", model)
    query = "&".join(filter(None, [sent.query, urlencode(spec.query)]))
    url = base + sent.path + (f"?{query}" if query else "")
    headers = with_upstream_key(
        sent.headers, spec.key, auth=spec.auth, fallback_only=spec.key_fallback
    )
    headers.update(spec.headers)
    return url, headers, sent.body, sent


def _renamed(body: bytes, model: str) -> bytes:
    """An alias: only the bytes of the model's value change (app/request/jsonedit.py); the rest
    stays as the caller wrote it, for the provider's prompt cache."""
    value = json.dumps(model, ensure_ascii=False).encode()
    try:
        return jsonedit.with_value(body, "model", value)
    except ValueError:
        # JSON that is not UTF-8 (json.loads also reads UTF-16 and UTF-32): re-encoded.
        doc = json.loads(body)
        doc["model"] = model
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _tls_options(settings: Settings) -> dict[str, Any]:
    """Certificates are always verified; a private CA can be trusted explicitly."""
    return {"ca_certs": settings.upstream_ca_bundle} if settings.upstream_ca_bundle else {}
