"""Every attempt accounted for once: the one way out of an upstream attempt.

An attempt's result goes to its upstream's breaker (app/upstream/outliers.py) and to
``llmgate_upstream_attempts_total`` exactly once: the attempt's life (app/upstream/attempt.py,
a table of allowed moves) says at which move and what, and the ledger tells it. No answer,
or an error answer: at once (``failed``, ``cancelled``, ``at_headers``, from
app/upstream/attempts.py). A 2xx answer's when its exchange ends, because a generation is in
its body: ``broken`` when the upstream broke it off or sent what cannot be relayed (a reset, a
timeout, an event too large, a stream cut short: failed); else ``close`` judges it, ok when
read to its end, cancelled when the gateway's side gave it up first (its caller left, a hedge
it lost, the worker shutting down). ``close`` is also where the answer's connection is
dropped unless it was read to its end, counted free in the pool's in-use figure, and its
span ended: however an exchange ends, it ends through here, and a second ``close`` does
nothing.

The same ledger counts what the attempt loop does (retries, failovers, a spent retry budget)
and turns each breaker's change of state into ``llmgate_upstream_state``, and keeps the calls
in flight at each upstream in this worker (``in_flight``: an attempt from its start until it
leaves attempt.py's ``BUSY`` states), which a bounded load reads (app/upstream/affinity.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from app.core.errors import GatewayError
from app.observe import tracing
from app.observe.metrics import Metrics
from app.observe.tracing import Span
from app.observe.unobserved import UNOBSERVED
from app.upstream.attempt import Attempt
from app.upstream.breaker import BreakerPolicy
from app.upstream.outliers import Outliers
from app.upstream.transport import Raw, Transport, UpstreamResponse

_STATE_CODES = {"closed": 0, "half_open": 1, "open": 2}


class Ledger:
    """The breakers of one worker's upstreams and the metrics of their attempts."""

    def __init__(
        self,
        names: Iterable[str],
        policy: BreakerPolicy,
        clock: Callable[[], float],
        transport: Transport,
        metrics: Metrics = UNOBSERVED,
    ) -> None:
        names = list(names)
        self.metrics = metrics
        self.transport = transport
        self.in_flight: dict[str, int] = dict.fromkeys(names, 0)
        self.outliers = Outliers(names, policy, clock, on_state=self._state_changed)
        for name in names:
            metrics.upstream_state.labels(name).set(0)

    # -- an attempt's life -------------------------------------------------------------------
    def start(self, name: str) -> Attempt:
        """An attempt at ``name`` goes out (its breaker knows whether it is the probe)."""
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        return Attempt(name, self.outliers.start(name))

    def failed(self, attempt: Attempt) -> None:
        """No answer: it could not connect, timed out or was reset before its headers."""
        self._tell(attempt, attempt.fail)

    def cancelled(self, attempt: Attempt) -> None:
        """No answer and no verdict: killed, or refused before anything was sent."""
        self._tell(attempt, attempt.cancel)

    def at_headers(self, attempt: Attempt, status: int) -> None:
        """Its answer's headers are in: any status but a 2xx is judged now."""
        self._tell(attempt, lambda: attempt.answered(status))

    def answered(
        self, raw: Raw, attempts: int, attempt: Attempt, span: Span | None
    ) -> UpstreamResponse:
        """The answer an exchange goes on with: its connection counted in use, a 2xx one
        pending its verdict until ``broken`` or ``close``."""
        self.transport.count_in_use(+1)
        return UpstreamResponse(raw, attempts, attempt, span=span)

    def broken(self, resp: UpstreamResponse, error: GatewayError) -> None:
        """What the upstream sent after its headers cannot be relayed (a malformed stream,
        one cut short, a failed read): a 2xx's attempt failed, and its span says with what."""
        attempt = resp.attempt
        self._tell(attempt, lambda: attempt.broke(tracing.error_type(error)))

    def close(self, resp: UpstreamResponse) -> None:
        """Done with the answer, however it went: a connection not read to its end is
        dropped (never drained for nobody); a 2xx answer not judged yet is judged now, ok
        when read to its end, else cancelled (no verdict on the upstream); the connection is
        counted free and the attempt's span ended. Each only once: a second close does
        nothing."""
        if not resp.closed:
            resp.close()
        attempt = resp.attempt
        if attempt.released:
            return
        self._tell(attempt, attempt.release)
        self.transport.count_in_use(-1)
        if resp.span is not None:
            resp.span.end(error=attempt.failure or status_error(resp.status))

    def _tell(self, attempt: Attempt, move: Callable[[], str | None]) -> None:
        """Make ``move`` of ``attempt`` and tell its one result, if this move has one; an
        attempt that leaves the states in flight is counted out of its upstream's calls."""
        busy = attempt.busy
        result = move()
        if busy and not attempt.busy:
            self.in_flight[attempt.upstream] -= 1
        if result is None:
            return
        self.outliers.record(attempt.upstream, result, probe=attempt.probe)
        self.metrics.upstream_attempts.labels(attempt.upstream, result).inc()

    # -- what the attempt loop does ----------------------------------------------------------
    def retried(self) -> None:
        self.metrics.retries.inc()

    def failed_over(self) -> None:
        self.metrics.failovers.inc()

    def budget_exhausted(self) -> None:
        self.metrics.retry_budget_exhausted.inc()

    def _state_changed(self, name: str, state: str) -> None:
        self.metrics.upstream_state.labels(name).set(_STATE_CODES[state])


def status_error(status: int) -> str | None:
    """A client span's error.type by status: any 4xx or 5xx (the HTTP conventions)."""
    return str(status) if status >= 400 else None
