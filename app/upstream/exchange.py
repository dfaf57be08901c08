"""The upstream adapter: the only owner of the urllib3 PoolManager.

One ``Upstream`` per worker, built by the app factory after gevent patched the process.
``open()`` sends one request with the retry policy and returns once the upstream's headers
are in; the body is then read with ``read_chunk()``, a bounded read that returns what has
arrived. Every urllib3/socket failure is translated here, once, into the GatewayError tree.

Every attempt's result goes to its upstream's breaker once (app/upstream/outliers.py): an error
answer's at its headers, a 2xx answer's when its exchange ends, so a stream the upstream
breaks off mid-way is a failure (``read_chunk``, or ``broken()`` from the relay) and one its
caller leaves is none (``done_with`` before the end).

Timeouts: connect is urllib3's; first byte, idle and the total deadline are gevent timers
(``gevent.Timeout``, and app/core/timers.py's ``Alarm`` for the timer armed again for each read)
so each is exact and names its phase. A connection interrupted by one of them is closed by
urllib3 (it is never put back half-read), see ``HTTPConnectionPool.urlopen``'s clean-exit rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import random
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
    GatewayError,
    ModelNotServed,
    UpstreamError,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamTLSError,
    UpstreamUnreachable,
)
from app.core.reasons import reason
from app.core.timers import Alarm
from app.observe import tracing
from app.observe.metrics import Metrics
from app.observe.tracing import Span
from app.request import jsonedit
from app.request.headers import with_upstream_key
from app.upstream import catalog as upstreams
from app.upstream import pools, spans
from app.upstream.breaker import BreakerPolicy
from app.upstream.catalog import UpstreamSpec
from app.upstream.hedge import TtftWindow
from app.upstream.outliers import CANCELLED, FAILED, OK, Outliers, result_at_status
from app.upstream.retry import RETRYABLE_STATUSES, Deadline, RetryPolicy
from app.upstream.retry_budget import RetryBudget, caller_retry_count, gateway_retries


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
    route: str = "passthrough"  # app/edge/routes.py's name for the call: chat, embeddings, ...
    # Tracing on: the caller's request span, each attempt's child of it; an attempt is sent
    # with its own span in place (its traceparent goes upstream). None: tracing is off.
    span: Span | None = None


@dataclass
class UpstreamResponse:
    """The upstream's answer once its headers are in; the body is still on the socket."""

    raw: urllib3.BaseHTTPResponse
    attempts: int
    upstream: str = ""  # the name of the upstream that answered
    released: bool = False  # counted back as free in the pool's in-use figure
    # A 2xx answer's result is known only at its end (app/upstream/outliers.py): until Upstream
    # records it, the attempt is pending; ``ended``: the body was read to its end.
    pending: bool = False
    probe: bool = False  # the attempt is its upstream's half-open probe (app/upstream/breaker.py)
    failure: str | None = None  # the error type when it broke after its headers (its span's)
    ended: bool = False
    span: Span | None = None  # the attempt's span, ended when the exchange is done
    idle_timer: Alarm | None = None  # armed again for each read (Upstream.read_chunk)
    # The body's reader, chosen at the first read (pools.body_reader): not a constructor argument.
    _read: Callable[[int], bytes] | None = field(default=None, init=False, repr=False)

    def read1(self, size: int) -> bytes:
        """What has arrived of the body, up to ``size`` bytes (b"" at its end)."""
        if self._read is None:
            self._read = pools.body_reader(self.raw)
        return self._read(size)

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
        if self.idle_timer is not None:
            self.idle_timer.close()
            self.idle_timer = None


class Upstream:
    """The upstreams of this worker: their pools, breakers, and the attempt loop."""

    def __init__(
        self,
        settings: Settings,
        specs: list[UpstreamSpec] | None = None,
        *,
        metrics: Metrics | None = None,
        sleep=gevent.sleep,
        rand=random.random,
        clock=time.monotonic,
        breaker_policy: BreakerPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.specs = specs or upstreams.from_environment(
            settings.upstream_url, settings.upstream_api_key
        )
        self.metrics = metrics
        self._sleep = sleep
        self._rand = rand
        self._clock = clock
        self.outliers = Outliers(
            [spec.name for spec in self.specs],
            breaker_policy or BreakerPolicy(),
            clock,
            on_state=self._state_changed,
        )
        self.budget = RetryBudget(settings.retry_budget_percent, settings.retry_budget_min)
        self._ttft = {spec.name: TtftWindow() for spec in self.specs if spec.hedge is not None}
        self.in_use = 0
        self._idle_sampled = 0.0
        self._pools: dict[str, HTTPConnectionPool] = {}  # by spec name (_pool_for)
        self.pool = urllib3.PoolManager(
            num_pools=max(4, 2 * len(self.specs)),
            maxsize=settings.pool_size,
            block=False,
            retries=False,
            # No socket read timeout: every read is bounded by one of our gevent timers (first
            # byte, idle, deadline), exact and named. A socket timeout as well would make gevent
            # build a Timeout for every wait on the socket, once per event of every stream.
            timeout=urllib3.Timeout(connect=settings.connect_timeout_s, read=None),
            **_tls_options(settings),
        )
        opened = metrics.connections_opened.inc if metrics is not None else None
        self.pool.pool_classes_by_scheme = pools.pool_classes(
            opened,
            spare_ratio=settings.pool_spare_ratio,
            on_spare=metrics.connections_spare.inc if metrics is not None else None,
        )
        if metrics is not None:
            for spec in self.specs:
                metrics.upstream_state.labels(spec.name).set(0)

    def route_id(self, model: str | None) -> str:
        return upstreams.route_id(self.specs, model)

    def serves_for(self, model: str | None, allowed: tuple[str, ...]) -> bool:
        """Whether an upstream among ``allowed`` (names, or "*") serves ``model``."""
        return any(
            spec.serves(model) and ("*" in allowed or spec.name in allowed) for spec in self.specs
        )

    def check_serves(self, model: str | None) -> None:
        """ModelNotServed (404) when no configured upstream serves ``model``."""
        if not any(spec.serves(model) for spec in self.specs):
            raise ModelNotServed(f"No upstream serves the model {model!r}.", param="model")

    def states(self) -> dict[str, str]:
        """Each upstream's breaker state now, by name."""
        return self.outliers.states()

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

    def done_with(self, resp: UpstreamResponse) -> None:
        """The response's connection went back to the pool or was closed: count it free.
        A 2xx answer not judged yet is judged now: ok when read to its end, else given up
        by the gateway's side (its caller left, a hedge it lost): cancelled, no verdict."""
        if not resp.released:
            resp.released = True
            self._judge(resp, OK if resp.ended else CANCELLED)
            self._pool_changed(-1)
            if resp.span is not None:
                resp.span.end(error=resp.failure or _status_error(resp.status))

    def policy(self, req: UpstreamRequest | None = None) -> RetryPolicy:
        """LLMGATE_RETRIES and the backoff settings; for a caller that is itself retrying
        (``x-stainless-retry-count``), that many fewer retries."""
        s = self.settings
        count = caller_retry_count(req.headers) if req is not None else None
        retries = gateway_retries(s.retries, count)
        return RetryPolicy(retries, s.retry_backoff_s, s.retry_backoff_max_s, s.retry_after_max_s)

    def plan(self, req: UpstreamRequest) -> list[UpstreamSpec]:
        """The upstreams to try for ``req``, in order, by breaker state now (an open breaker
        whose cooldown ended shows as half-open)."""
        allowed = self.outliers.refresh()
        specs = self.specs
        if req.upstreams is not None and "*" not in req.upstreams:
            specs = [spec for spec in specs if spec.name in req.upstreams]
        return upstreams.candidates(specs, req.model, allowed=allowed, rand=self._rand)

    def open(
        self,
        req: UpstreamRequest,
        deadline: Deadline,
        *,
        plan: list[UpstreamSpec] | None = None,
        tried: list[UpstreamSpec] | None = None,
    ) -> UpstreamResponse:
        """Send ``req``, retrying and failing over only what cannot have billed; return at
        the answering upstream's headers.

        A failure that cannot have billed (no connection, a 429/502/503/504 answer, for a
        stream a timeout before its headers) moves to the next upstream at once when one is
        left untried; otherwise the same upstream is tried again after its backoff or
        retry-after. Every attempt counts against LLMGATE_RETRIES (less the caller's own
        retries) and the deadline, and every attempt beyond the first needs room in the
        worker's retry budget: without it, what the last attempt got goes back as it is.
        ``plan`` is the order from ``plan()`` when the caller already made it; ``tried``
        receives each upstream as its attempt starts (a hedge avoids them).
        """
        order = plan if plan is not None else self.plan(req)
        if not order:  # none serves it (the gateway refuses such calls before they get here)
            self.check_serves(req.model)
        policy = self.policy(req)
        tried = [] if tried is None else tried
        spec = order[0]
        # The ticket is given back however this ends: an answer, an error, or the greenlet
        # killed in an attempt or a backoff sleep (GreenletExit passes through the with).
        with self.budget.request() as ticket:
            while True:
                policy = policy.increment()
                tried.append(spec)
                raw: urllib3.BaseHTTPResponse | None = None
                error: GatewayError | None = None
                span = _attempt_span(req, spec, policy.attempt)
                try:
                    raw, probe = self._attempt_counted(spec, _under(req, span), deadline)
                except GatewayError as exc:
                    error = exc
                finally:
                    if span is not None:
                        _attempt_answered(span, raw, error)
                step = self._next_step(spec, order, tried, policy, req, deadline, error, raw)
                if step is not None and not ticket.retry():
                    # The budget is spent: no retry, no failover. Only a gateway that
                    # retried tells the caller not to (as when its retries ran out).
                    self._budget_exhausted()
                    if error is not None and policy.attempt > 1:
                        error.retryable = False
                    step = None
                if step is None:
                    if error is not None:
                        raise error
                    assert raw is not None
                    return self._answer(raw, policy.attempt, spec, span, probe)
                if raw is not None:
                    pools.discard(raw)
                    if span is not None:
                        span.end(error=_status_error(raw.status))
                spec, delay = step
                if delay is None:
                    self._fail_over()
                else:
                    self._retrying()
                    self._sleep(delay)

    def open_backup(
        self, req: UpstreamRequest, deadline: Deadline, spec: UpstreamSpec
    ) -> UpstreamResponse | None:
        """One attempt at ``spec`` as a hedge (app/upstream/race.py), never retried. It needs room
        in the retry budget, as a retry would: None when the budget is spent."""
        with self.budget.request() as ticket:
            if not ticket.retry():
                self._budget_exhausted()
                return None
            span = _attempt_span(req, spec, 1, hedge=True)
            raw: urllib3.BaseHTTPResponse | None = None
            error: GatewayError | None = None
            try:
                raw, probe = self._attempt_counted(spec, _under(req, span), deadline)
            except GatewayError as exc:
                error = exc
                raise
            finally:
                if span is not None:
                    _attempt_answered(span, raw, error)
            return self._answer(raw, 1, spec, span, probe)

    def _answer(
        self,
        raw: urllib3.BaseHTTPResponse,
        attempts: int,
        spec: UpstreamSpec,
        span: Span | None,
        probe: bool,
    ) -> UpstreamResponse:
        """The answer ``open`` or ``open_backup`` returns: its connection counted in use."""
        self._pool_changed(+1)
        pending = result_at_status(raw.status) is None
        return UpstreamResponse(
            raw, attempts, upstream=spec.name, span=span, pending=pending, probe=probe
        )

    def broken(self, resp: UpstreamResponse, error: GatewayError) -> None:
        """What the upstream sent after its headers cannot be relayed (a malformed stream,
        one cut short): its attempt failed, and its span says with what. Once: a pending
        attempt only."""
        if resp.pending:
            resp.failure = tracing.error_type(error)
        self._judge(resp, FAILED)

    def hedge_delay(self, spec: UpstreamSpec) -> float | None:
        """Seconds a stream sent to ``spec`` waits for its first event before a backup is
        sent, or None when ``spec`` does not hedge."""
        if spec.hedge is None:
            return None
        return spec.hedge.delay(self._ttft[spec.name])

    def first_event_after(self, name: str, seconds: float) -> None:
        """A stream from upstream ``name`` produced its first event ``seconds`` after the
        call began: what a percentile hedge delay is made of."""
        window = self._ttft.get(name)
        if window is not None:
            window.add(seconds)

    def _next_step(
        self,
        spec: UpstreamSpec,
        order: list[UpstreamSpec],
        tried: list[UpstreamSpec],
        policy: RetryPolicy,
        req: UpstreamRequest,
        deadline: Deadline,
        error: GatewayError | None,
        raw: urllib3.BaseHTTPResponse | None,
    ) -> tuple[UpstreamSpec, float | None] | None:
        """What follows an attempt: (the next upstream, None) to fail over at once, (the same
        upstream, its delay) to retry, or None: the attempt's answer or error is final."""
        following = _untried(order, tried)
        if error is not None:
            if following and not policy.exhausted and _can_fail_over(error, req.stream):
                return following[0], None
            if not error.before_send:
                return None
            delay = policy.delay_for_connect_error(self._rand)
            if delay is None or delay >= deadline.remaining():
                # Retried already: tell the SDK not to multiply the calls again.
                error.retryable = policy.attempt == 1
                return None
            return spec, delay
        assert raw is not None
        if raw.status in RETRYABLE_STATUSES and following and not policy.exhausted:
            return following[0], None
        delay = policy.delay_for_status(raw.status, raw.headers, self._rand)
        if delay is None or delay >= deadline.remaining():
            return None
        return spec, delay

    def _attempt_counted(
        self, spec: UpstreamSpec, req: UpstreamRequest, deadline: Deadline
    ) -> tuple[urllib3.BaseHTTPResponse, bool]:
        """One attempt, with the breaker told of its start and, unless it is a 2xx answer
        (judged at its end: ``_judge``), of its result; and whether it is the probe."""
        probe = self.outliers.start(spec.name)
        try:
            raw = self._attempt(spec, req, deadline)
        except GatewayError:
            self._record(spec.name, FAILED, probe)
            raise
        except BaseException:
            # Killed (the caller left, a hedge lost): no verdict on the upstream, but a
            # half-open probe must not stay "in flight" forever.
            self._record(spec.name, CANCELLED, probe)
            raise
        result = result_at_status(raw.status)
        if result is not None:
            self._record(spec.name, result, probe)
        return raw, probe

    def _judge(self, resp: UpstreamResponse, result: str) -> None:
        """The result of a 2xx answer's attempt, recorded once."""
        if resp.pending:
            resp.pending = False
            self._record(resp.upstream, result, resp.probe)

    def _record(self, name: str, result: str, probe: bool) -> None:
        self.outliers.record(name, result, probe=probe)
        if self.metrics is not None:
            self.metrics.upstream_attempts.labels(name, result).inc()

    def _state_changed(self, name: str, state: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_state.labels(name).set(_STATE_CODES[state])

    def _fail_over(self) -> None:
        if self.metrics is not None:
            self.metrics.failovers.inc()

    def _budget_exhausted(self) -> None:
        if self.metrics is not None:
            self.metrics.retry_budget_exhausted.inc()

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

    def _retrying(self) -> None:
        if self.metrics is not None:
            self.metrics.retries.inc()

    def _attempt(
        self, spec: UpstreamSpec, req: UpstreamRequest, deadline: Deadline
    ) -> urllib3.BaseHTTPResponse:
        s = self.settings
        url, headers, body = _prepare(spec, req)
        if req.span is not None:
            headers = req.span.inject(headers)
        pool, target = self._pool_for(spec, url)
        with self._phase("first_byte", s.first_byte_timeout_s, deadline) as remaining:
            try:
                return pool.urlopen(
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
                error = UpstreamTimeout("connect", s.connect_timeout_s, retryable=True)
                error.before_send = True
                raise error from None
            except (ProtocolError, ReadTimeoutError, OSError, HTTPError) as exc:
                raise UpstreamReset(f"Upstream closed the connection: {reason(exc)}.") from None

    def read_chunk(self, resp: UpstreamResponse, deadline: Deadline) -> bytes:
        """What has arrived of the body (b"" at its end), within the idle and total budgets.
        On any failure the response is closed: a half-read connection is never reused."""
        s = self.settings
        remaining = deadline.remaining()
        if remaining >= s.idle_timeout_s:
            # The response's one idle timer, armed again for each read: a timer per
            # exchange, not one per event (this runs for every read of every stream).
            phase, reported = "idle", s.idle_timeout_s
            if resp.idle_timer is None:
                resp.idle_timer = Alarm(s.idle_timeout_s)
            timer = resp.idle_timer
        elif remaining > 0:  # the deadline comes first
            phase, reported = "deadline", s.deadline_s
            timer = Alarm(remaining)
        else:
            raise self._broke_off(resp, UpstreamTimeout("deadline", s.deadline_s))
        timer.arm()
        try:
            chunk = resp.read1(pools.READ_SIZE)
        except Alarm as exc:
            if exc is not timer:
                raise
            raise self._broke_off(resp, UpstreamTimeout(phase, reported)) from None
        except (
            ProtocolError,
            ReadTimeoutError,
            OSError,
            HTTPError,
            http.client.HTTPException,
        ) as exc:
            reset = UpstreamReset(f"Upstream broke off the response: {reason(exc)}.")
            raise self._broke_off(resp, reset) from None
        finally:
            timer.disarm()
            if timer is not resp.idle_timer:
                timer.close()
        resp.ended = not chunk
        return chunk

    def _broke_off(self, resp: UpstreamResponse, error: GatewayError) -> GatewayError:
        """A read failed (a reset, a timeout): the attempt failed, its connection is dropped.
        The error, for the caller to raise."""
        resp.close()
        self.broken(resp, error)
        return error

    def read_all(self, resp: UpstreamResponse, deadline: Deadline, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while chunk := self.read_chunk(resp, deadline):
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise self._broke_off(
                    resp, UpstreamError(f"Upstream response exceeds {limit} bytes.")
                )
        resp.raw.release_conn()
        return b"".join(parts)


_STATE_CODES = {"closed": 0, "half_open": 1, "open": 2}


def _attempt_span(
    req: UpstreamRequest, spec: UpstreamSpec, attempt: int, *, hedge: bool = False
) -> Span | None:
    """An attempt's CLIENT span, a child of the request's; None when tracing is off."""
    if req.span is None:
        return None
    return req.span.child(
        tracing.attempt_name(req.route, req.method, req.model),
        kind=tracing.CLIENT,
        attributes=spans.attempt_attributes(spec, req.method, req.model, attempt, hedge),
    )


def _under(req: UpstreamRequest, span: Span | None) -> UpstreamRequest:
    """``req`` as one attempt sends it: under the attempt's own span."""
    return req if span is None else dataclasses.replace(req, span=span)


def _attempt_answered(
    span: Span, raw: urllib3.BaseHTTPResponse | None, error: GatewayError | None
) -> None:
    """An attempt with an answer keeps its span open until the exchange is done (done_with
    ends it); one that failed, or was cancelled (a lost hedge, a caller gone), ends here."""
    if raw is not None:
        span.set({"http.response.status_code": raw.status})
    else:
        span.end(error="cancelled" if error is None else tracing.error_type(error))


def _status_error(status: int) -> str | None:
    """A client span's error.type by status: any 4xx or 5xx (the HTTP conventions)."""
    return str(status) if status >= 400 else None


def _untried(order: list[UpstreamSpec], tried: list[UpstreamSpec]) -> list[UpstreamSpec]:
    return [spec for spec in order if spec not in tried]


def _can_fail_over(exc: GatewayError, stream: bool) -> bool:
    """Whether another upstream may take the call: only when this one cannot have started
    (billable) work. A stream's headers come when generation starts, so a stream that timed
    out before them had not started; a non-stream call's headers come at the end."""
    if exc.before_send or isinstance(exc, UpstreamTLSError):
        return True
    return stream and isinstance(exc, UpstreamTimeout) and exc.phase == "first_byte"


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
    return url, headers, body


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


__all__ = ["GatewayError", "Upstream", "UpstreamRequest", "UpstreamResponse"]
