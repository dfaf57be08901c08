"""Opening a call: its attempts in order, until one upstream's headers are in.

The rule: retry and fail over only what cannot have billed. A failure that cannot have
(no connection, a 429/502/503/504/529 answer, for a stream a timeout before its headers) moves
to the next upstream at once when one is left untried; otherwise the same upstream is tried
again after its backoff or retry-after. Every attempt counts against LLMGATE_RETRIES (less
the caller's own retries) and the deadline, and every attempt beyond the first needs room in
the worker's retry budget: without it, what the last attempt got goes back as it is. A
hedge's backup (app/upstream/race.py) is one more attempt, never retried, and needs that room
as a retry would.

Each attempt tells its upstream's breaker it started and, unless it is a 2xx answer (judged
at its end), how it went (app/upstream/ledger.py); each is a CLIENT span of its own, sent
with its own traceparent. The bytes are app/upstream/transport.py's.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import gevent

from app.core.config import Settings
from app.core.errors import (
    BadRequest,
    GatewayError,
    ModelNotServed,
    UpstreamTimeout,
    UpstreamTLSError,
)
from app.dialects.chat import Untranslatable
from app.observe import tracing
from app.observe.tracing import Span
from app.request.affinity import WEIGHTED, Routing
from app.request.routes import CHAT, Route
from app.upstream import affinity, catalog, pools, spans
from app.upstream.attempt import Attempt
from app.upstream.catalog import UpstreamSpec
from app.upstream.ledger import Ledger, status_error
from app.upstream.retry import RETRYABLE_STATUSES, Deadline, RetryPolicy
from app.upstream.retry_budget import RetryBudget, caller_retry_count, gateway_retries
from app.upstream.transport import Raw, Transport, UpstreamRequest, UpstreamResponse

Step = tuple[UpstreamSpec, float | None]  # the next upstream, and the delay before it (None: now)


class Attempts:
    """The attempt loop of one worker's upstreams."""

    def __init__(
        self,
        settings: Settings,
        specs: list[UpstreamSpec],
        transport: Transport,
        ledger: Ledger,
        budget: RetryBudget,
        *,
        sleep: Callable[[float], None] = gevent.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.specs = specs
        self.transport = transport
        self.ledger = ledger
        self.budget = budget
        self._sleep = sleep
        self._rand = rand

    def check_serves(self, model: str | None, route: Route = CHAT, path: str = "") -> None:
        """ModelNotServed (404) when no configured upstream serves ``model``, or none that
        serves it speaks the call's API (an Anthropic or Gemini upstream answers chat and
        messages only)."""
        serving = [spec for spec in self.specs if spec.serves(model)]
        if not serving:
            raise ModelNotServed(f"No upstream serves the model {model!r}.", param="model")
        if not any(spec.speaks(route, path) for spec in serving):
            kinds = ", ".join(sorted({spec.kind for spec in serving}))
            which = "The upstreams" if model is None else f"The upstreams that serve {model!r}"
            raise ModelNotServed(
                f"{which} ({kinds}) do not serve /v1{path}: {catalog.served_by(route, path)}.",
                param=None if model is None else "model",
            )

    def plan(self, req: UpstreamRequest) -> list[UpstreamSpec]:
        """The upstreams to try for ``req``, in order (``route``)."""
        return self.route(req)[0]

    def route(self, req: UpstreamRequest) -> tuple[list[UpstreamSpec], Routing | None]:
        """The upstreams to try for ``req``, in order, by breaker state now (an open breaker
        whose cooldown ended shows as half-open): in its affinity key's order within a
        bounded load (app/upstream/affinity.py) when routing is affine and the call has a
        key, else at random by weight; and how the first was chosen (None: no upstream)."""
        allowed = self.ledger.outliers.refresh()
        specs = [spec for spec in self.specs if spec.speaks(req.route, req.path)]
        if req.upstreams is not None and "*" not in req.upstreams:
            specs = [spec for spec in specs if spec.name in req.upstreams]
        key = req.affinity if self.settings.routing == "affine" else None
        if key is None:
            order = catalog.candidates(specs, req.model, allowed=allowed, rand=self._rand)
            reason = WEIGHTED
        else:
            epsilon, load = self.settings.routing_epsilon, self.ledger.in_flight
            order, reason = affinity.ordered(
                specs, req.model, key.key, allowed=allowed, load=load, epsilon=epsilon
            )
        if not order:
            return order, None
        return order, Routing(order[0].name, reason, None if key is None else key.source)

    def policy(self, req: UpstreamRequest | None = None) -> RetryPolicy:
        """LLMGATE_RETRIES and the backoff settings; for a caller that is itself retrying
        (``x-stainless-retry-count``), that many fewer retries."""
        s = self.settings
        count = caller_retry_count(req.headers) if req is not None else None
        retries = gateway_retries(s.retries, count)
        return RetryPolicy(retries, s.retry_backoff_s, s.retry_backoff_max_s, s.retry_after_max_s)

    def open(
        self,
        req: UpstreamRequest,
        deadline: Deadline,
        *,
        plan: list[UpstreamSpec] | None = None,
        tried: list[UpstreamSpec] | None = None,
    ) -> UpstreamResponse:
        """Send ``req`` by the module's rule; return at the answering upstream's headers.
        ``plan`` is the order from ``plan()`` when the caller already made it; ``tried``
        receives each upstream as its attempt starts (a hedge avoids them)."""
        order = plan if plan is not None else self.plan(req)
        if not order:  # none serves it (the gateway refuses such calls before they get here)
            self.check_serves(req.model, req.route, req.path)
            raise ModelNotServed("No upstream the call may use serves it.", param="model")
        policy = self.policy(req)
        tried = [] if tried is None else tried
        spec = order[0]
        # The ticket is given back however this ends: an answer, an error, or the greenlet
        # killed in an attempt or a backoff sleep (GreenletExit passes through the with).
        with self.budget.request() as ticket:
            while True:
                policy = policy.increment()
                tried.append(spec)
                raw: Raw | None = None
                error: GatewayError | None = None
                span = _attempt_span(req, spec, policy.attempt)
                try:
                    raw, attempt = self._attempt_counted(spec, _under(req, span), deadline)
                except GatewayError as exc:
                    error = exc
                finally:
                    if span is not None:
                        _attempt_answered(span, raw, error)
                step = self._next_step(spec, order, tried, policy, req, deadline, error, raw)
                if step is not None and not ticket.retry():
                    # The budget is spent: no retry, no failover.
                    self.ledger.budget_exhausted()
                    step = None
                if step is None:
                    if error is not None and policy.attempt > 1:
                        # Retried already (its retries ran out, or the budget did): the
                        # caller must not multiply the calls again. A copy: the error is
                        # the transport's, as it raised it.
                        raise error.with_retryable(False) from error
                    if error is not None:
                        raise error
                    assert raw is not None
                    return self.ledger.answered(raw, policy.attempt, attempt, span)
                if raw is not None:
                    pools.discard(raw)
                    if span is not None:
                        span.end(error=status_error(raw.status))
                spec, delay = step
                if delay is None:
                    self.ledger.failed_over()
                else:
                    self.ledger.retried()
                    self._sleep(delay)

    def open_backup(
        self, req: UpstreamRequest, deadline: Deadline, spec: UpstreamSpec
    ) -> UpstreamResponse | None:
        """One attempt at ``spec`` as a hedge, never retried. It needs room in the retry
        budget, as a retry would: None when the budget is spent."""
        with self.budget.request() as ticket:
            if not ticket.retry():
                self.ledger.budget_exhausted()
                return None
            return self.once(req, deadline, spec, hedge=True)

    def once(
        self, req: UpstreamRequest, deadline: Deadline, spec: UpstreamSpec, *, hedge: bool = False
    ) -> UpstreamResponse:
        """One attempt at ``spec``, never retried, its room in the retry budget taken by the
        caller (a hedge's backup, a continuation: app/upstream/continuation.py)."""
        span = _attempt_span(req, spec, 1, hedge=hedge)
        raw: Raw | None = None
        error: GatewayError | None = None
        try:
            raw, attempt = self._attempt_counted(spec, _under(req, span), deadline)
        except GatewayError as exc:
            error = exc
            raise
        finally:
            if span is not None:
                _attempt_answered(span, raw, error)
        return self.ledger.answered(raw, 1, attempt, span)

    def _next_step(
        self,
        spec: UpstreamSpec,
        order: list[UpstreamSpec],
        tried: list[UpstreamSpec],
        policy: RetryPolicy,
        req: UpstreamRequest,
        deadline: Deadline,
        error: GatewayError | None,
        raw: Raw | None,
    ) -> Step | None:
        """What follows an attempt: (the next upstream, None) to fail over at once, (the same
        upstream, its delay) to retry, or None: the attempt's answer or error is final."""
        following = [other for other in order if other not in tried]
        if isinstance(error, Untranslatable):
            # This upstream's dialect cannot carry the request; another kind may.
            return (following[0], None) if following else None
        if error is not None:
            if following and not policy.exhausted and _can_fail_over(error, req.stream):
                return following[0], None
            if not error.before_send:
                return None
            delay = policy.delay_for_connect_error(self._rand)
            if delay is None or delay >= deadline.remaining():
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
    ) -> tuple[Raw, Attempt]:
        """One attempt (app/upstream/attempt.py), with the breaker told of its start and,
        unless it is a 2xx answer (judged at its end), of its result."""
        attempt = self.ledger.start(spec.name)
        try:
            raw = self.transport.send(spec, req, deadline)
        except BadRequest:
            # Refused before anything was sent (a request this upstream's dialect cannot
            # carry, or one no dialect can): no verdict on the upstream.
            self.ledger.cancelled(attempt)
            raise
        except GatewayError:
            self.ledger.failed(attempt)
            raise
        except BaseException:
            # Killed (the caller left, a hedge lost): no verdict on the upstream, but a
            # half-open probe must not stay "in flight" forever.
            self.ledger.cancelled(attempt)
            raise
        attempt.connected(pools.connect_seconds(raw))
        self.ledger.at_headers(attempt, raw.status)
        return raw, attempt


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


def _attempt_answered(span: Span, raw: Raw | None, error: GatewayError | None) -> None:
    """An attempt with an answer keeps its span open until the exchange is done (the
    ledger's close ends it); one that failed, or was cancelled (a lost hedge, a caller
    gone), ends here."""
    if raw is not None:
        span.set({"http.response.status_code": raw.status})
    else:
        span.end(error="cancelled" if error is None else tracing.error_type(error))


def _can_fail_over(exc: GatewayError, stream: bool) -> bool:
    """Whether another upstream may take the call: only when this one cannot have started
    (billable) work. A stream's headers come when generation starts, so a stream that timed
    out before them had not started; a non-stream call's headers come at the end."""
    if exc.before_send or isinstance(exc, UpstreamTLSError):
        return True
    return stream and isinstance(exc, UpstreamTimeout) and exc.phase == "first_byte"
