"""The upstream exchange behind one public entry: ``Upstream.exchange``.

``Upstream.exchange(req, deadline, reading)`` is the call a flight's producer makes
(app/streams/upstream_call.py), run once with ``Exchange.run``: it opens the attempts (retries,
failover, the breakers' order and, for a stream to an upstream that hedges, a backup racing
the primary), reads the answer up to its first event, or whole, and hands it over: its head
at once, a stream's events a batch per read (``events``), the bytes of an unterminated last
event at its end (``leftover``). However it ends (read to its end, an error, the caller gone,
a bug), it ends through ``run``'s one exit: the attempt closed and accounted for, an error
counted by cause, a bug turned into an UpstreamProtocolError a caller can read. Nothing
outside this package reads an upstream's socket or tells a breaker anything.

Beneath it, each with its rule: attempts.py (opening: retries, failover, the retry budget),
transport.py (the pools and the bytes; urllib3's failures translated once), reading.py (reads
under the idle and total timers, whole events), ledger.py (every attempt accounted for once),
race.py and hedge.py (the hedge). One ``Upstream`` per worker, built by the app factory after
gevent patched the process.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator

import gevent

from app.core.causes import error_cause, status_cause
from app.core.config import Settings
from app.core.errors import GatewayError, UpstreamProtocolError
from app.dialects.continuation import OFF
from app.observe.metrics import Metrics
from app.observe.unobserved import UNOBSERVED
from app.request.affinity import Routing
from app.request.routes import CHAT, Route
from app.upstream import catalog, race
from app.upstream.attempts import Attempts
from app.upstream.breaker import BreakerPolicy
from app.upstream.catalog import UpstreamSpec
from app.upstream.continuation import Continuation, Hooks, may_continue
from app.upstream.hedge import TtftWindow
from app.upstream.ledger import Ledger
from app.upstream.reading import Patience, Reader, ReadRules, Start
from app.upstream.retry import Deadline
from app.upstream.retry_budget import RetryBudget
from app.upstream.transport import Transport, UpstreamRequest, UpstreamResponse
from llmgate_wire import sse

# The exchange's failures were the relay's before it moved here: the same logger, so an
# operator's filters still find them.
log = logging.getLogger("llmgate.relay")


class Upstream:
    """The upstreams of one worker: their pools, breakers, retry budget and hedging."""

    def __init__(
        self,
        settings: Settings,
        specs: list[UpstreamSpec] | None = None,
        *,
        metrics: Metrics = UNOBSERVED,
        sleep: Callable[[float], None] = gevent.sleep,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        breaker_policy: BreakerPolicy | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.settings = settings
        self.specs = specs or catalog.from_environment(
            settings.upstream_url, settings.upstream_api_key
        )
        self.metrics = metrics
        # The seam tests swap (as httpx takes its transport): everything above the bytes
        # stays real.
        self.transport = transport or Transport(
            settings, upstreams=len(self.specs), metrics=metrics
        )
        policy = breaker_policy or BreakerPolicy()
        names = [spec.name for spec in self.specs]
        self.ledger = Ledger(names, policy, clock, self.transport, metrics)
        self.outliers = self.ledger.outliers
        self.budget = RetryBudget(settings.retry_budget_percent, settings.retry_budget_min)
        self.attempts = Attempts(
            settings, self.specs, self.transport, self.ledger, self.budget, sleep=sleep, rand=rand
        )
        self.reader = Reader(settings, self.ledger)
        self._ttft = {spec.name: TtftWindow() for spec in self.specs if spec.hedge is not None}
        # The upstreams that may continue a stream cut short (app/upstream/continuation.py).
        self.continuers = [spec for spec in self.specs if spec.continuation != OFF]

    def exchange(
        self,
        req: UpstreamRequest,
        deadline: Deadline,
        reading: ReadRules,
        hooks: Hooks | None = None,
    ) -> Exchange:
        """The call ``req`` under ``deadline``, its answer read as ``reading`` says: made
        when run (``Exchange.run``), once. ``hooks``: its call's, for a stream that may be
        continued on another upstream when it breaks (app/upstream/continuation.py)."""
        return Exchange(self, req, deadline, reading, hooks)

    # -- what the gateway asks before a call -------------------------------------------------
    def serving_id(self, model: str | None) -> str:
        return catalog.serving_id(self.specs, model)

    def serves_for(self, model: str | None, allowed: tuple[str, ...]) -> bool:
        """Whether an upstream among ``allowed`` (names, or "*") serves ``model``."""
        return any(
            spec.serves(model) and ("*" in allowed or spec.name in allowed) for spec in self.specs
        )

    def check_serves(self, model: str | None, route: Route = CHAT, path: str = "") -> None:
        """ModelNotServed (404) when no configured upstream serves ``model`` at ``path``
        (below /v1) of ``route``."""
        self.attempts.check_serves(model, route, path)

    def states(self) -> dict[str, str]:
        """Each upstream's breaker state now, by name."""
        return self.outliers.states()

    # -- hedging -----------------------------------------------------------------------------
    def _hedge_delay(self, spec: UpstreamSpec) -> float | None:
        """Seconds a stream sent to ``spec`` waits for its first event before a backup is
        sent, or None when ``spec`` does not hedge."""
        if spec.hedge is None:
            return None
        return spec.hedge.delay(self._ttft[spec.name])

    def _first_event_after(self, name: str, seconds: float) -> None:
        """A stream from upstream ``name`` produced its first event ``seconds`` after the
        call began: what a percentile hedge delay is made of."""
        window = self._ttft.get(name)
        if window is not None:
            window.add(seconds)


class Exchange:
    """One call to the upstreams, made once: see the module's docstring. The head and the
    events are there while ``run``'s block runs."""

    def __init__(
        self,
        upstream: Upstream,
        req: UpstreamRequest,
        deadline: Deadline,
        reading: ReadRules,
        hooks: Hooks | None = None,
    ) -> None:
        self._upstream = upstream
        # The request (the caller's prompt in its body) is held only until the answer has
        # started: retries and a hedge's backup come before that, and a stream that lasts
        # minutes should not keep a copy of a long prompt alive for nothing. But for a
        # stream that may be continued: a continuation sends it again.
        self._req: UpstreamRequest | None = req
        self._hooks = hooks if hooks is not None and may_continue(upstream, req) else None
        self._kept: UpstreamRequest | None = None
        self._continuation: Continuation | None = None
        self._deadline = deadline
        self._reading = reading
        self._start: Start | None = None
        self.started_at: float | None = None  # the answer's start: its first event, or whole
        self.routing: Routing | None = None  # how its upstreams were ordered, once planned

    @contextlib.contextmanager
    def run(self, *, began: float, request_id: str = "") -> Iterator[Exchange]:
        """Make the call and hand its answer over (``began``: when the call began, for its
        time to first event; ``request_id``: for the log). The one exit of an exchange:
        the attempt is closed and accounted for however the block ends."""
        metrics = self._upstream.metrics
        try:
            req, self._req = self._req, None
            if req is None:
                raise RuntimeError("an upstream exchange is made once")
            self._start = self._open(req)
            if self._hooks is not None and self._start.body is None:
                self._kept = req
            del req
            self._answered(began)
            yield self
        except GatewayError as exc:
            metrics.upstream_errors.labels(error_cause(exc)).inc()
            raise
        except Exception:
            # Not an error we know (a bug, or input we did not expect): the caller must still
            # hear of it, as a 502 before the first byte or the final error event after it.
            log.exception("upstream exchange failed (request %s)", request_id or "-")
            metrics.upstream_errors.labels("protocol").inc()
            # The class of a bug means nothing to a caller: the log above has the traceback.
            raise UpstreamProtocolError(
                "The upstream's answer could not be relayed; the gateway's log says why."
            ) from None
        finally:
            if self._continuation is not None:
                self._continuation.current.close()  # a continuation's stream, if one is read
                self._continuation = None
            self._kept = None
            if self._start is not None:
                self._start.close()
                self._start = None  # nor is the answer kept once it was handed over

    # -- the answer --------------------------------------------------------------------------
    @property
    def status(self) -> int:
        return self._started().resp.status

    @property
    def headers(self) -> list[tuple[str, str]]:
        return list(self._started().resp.headers.items())

    @property
    def attempts(self) -> int:
        return self._started().resp.attempts

    @property
    def upstream(self) -> str:
        """The configured name of the upstream that answered."""
        return self._started().resp.upstream

    @property
    def connect_s(self) -> float:
        """Seconds the answering attempt spent opening a connection (0.0: reused)."""
        return self._started().resp.attempt.connect_s

    @property
    def body(self) -> bytes | None:
        """The whole body of an answer that is not an event stream; None for a stream."""
        return self._started().body

    def events(self, patience: Patience | None = None) -> Iterator[list[sse.Event]]:
        """A stream's events, a batch per read, its first events first (reading.py's
        ``Reader.events``: an event too large or a failed read is raised after the events
        before it; with ``patience``, an empty batch when none came in its time)."""
        reading = self._reading
        if self._kept is not None and self._hooks is not None:
            self._continuation = Continuation(
                self._upstream, self._kept, self._deadline, reading, self._hooks, self._started()
            )
            self._kept = None  # the continuation holds it now: one per exchange
            return self._continuation.events(patience)
        return self._upstream.reader.events(self._started(), self._deadline, reading.end, patience)

    def waitable(self) -> bool:
        """Whether a stream's reads can wait with patience (transport.py's ``can_wait``)."""
        return self._start is not None and self._start.resp.can_wait()

    def leftover(self) -> bytes:
        """At a stream's end: the bytes of an unterminated last event (not an event)."""
        decoder = self._started().decoder
        return decoder.close() if decoder is not None else b""

    @property
    def usage_estimated(self) -> bool:
        """Whether the usage the answer carries is an estimate a translation wrote because
        the upstream reported none (translation.py's ``usage_reported``: known for a whole
        body once read, for a stream at its end). Billing then keeps the call's reservation
        (app/tenancy/access.py): an estimate never stands for what the provider billed."""
        if self._continuation is not None and self._continuation.estimated:
            return True  # a cut call's usage in the sum is an estimate
        return getattr(self._started().resp.raw, "usage_reported", None) is False

    # -- inside ------------------------------------------------------------------------------
    def _started(self) -> Start:
        if self._continuation is not None:
            return self._continuation.current  # the stream being read now
        if self._start is None:
            raise RuntimeError("the exchange has not started (Exchange.run)")
        return self._start

    def _open(self, req: UpstreamRequest) -> Start:
        """The answer to relay: the plain call's, or the winner of a hedged one."""
        up, deadline = self._upstream, self._deadline
        attempts = up.attempts
        plan, self.routing = attempts.route(req)
        delay = up._hedge_delay(plan[0]) if req.stream and plan else None
        if delay is None:
            return self._begin(attempts.open(req, deadline, plan=plan))
        tried: list[UpstreamSpec] = []

        def backup() -> Start | None:
            spare = [spec for spec in plan if spec not in tried]
            if not spare:
                return None
            resp = attempts.open_backup(req, deadline, spare[0])
            return self._begin(resp) if resp is not None else None

        started, verdict = race.first_to_start(
            lambda: self._begin(attempts.open(req, deadline, plan=plan, tried=tried)),
            backup,
            min(delay, deadline.remaining()),
        )
        if verdict != race.NOT_SENT:
            up.metrics.hedges.labels(plan[0].name, verdict).inc()
        return started

    def _begin(self, resp: UpstreamResponse) -> Start:
        return self._upstream.reader.start(resp, self._deadline, self._reading)

    def _answered(self, began: float) -> None:
        """Count an error answer by its cause; note when the answer started (whole, or with
        its first event): the upstream's time to first byte, a hedge's window, the attempt
        span's ``first_event``."""
        start, metrics = self._started(), self._upstream.metrics
        cause = status_cause(start.resp.status)
        if cause is not None:
            metrics.upstream_errors.labels(cause).inc()
        if start.body is None and not start.events:
            return  # a stream that has not started: it ended or broke before any event
        self.started_at = time.monotonic()
        seconds = self.started_at - began
        metrics.upstream_ttft.labels(self._reading.route.name).observe(seconds)
        if start.body is None:
            self._upstream._first_event_after(start.resp.upstream, seconds)
            if start.resp.span is not None:
                # The upstream's own time to first event, beside the caller's (edge/finish.py).
                start.resp.span.event("first_event", at=self.started_at)


__all__ = ["Exchange", "GatewayError", "ReadRules", "Upstream", "UpstreamRequest"]
