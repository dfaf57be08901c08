"""Outlier ejection in one worker: each upstream's breaker, told each attempt's result once.

No I/O here; the clock is passed in, and a state change is announced through ``on_state``
(app/upstream/ledger.py turns it into the state metric).

An attempt's result is one of ``RESULTS``. An error answer is judged at its status: a 5xx
failed, a 429 is ``rate_limited`` (the key is busy, the upstream is fine), any other non-2xx
is ``ok`` (the upstream answered; the request or its URL was wrong). A 2xx answer is judged
when its exchange ends, because a generation is in its body: read to its end it is ``ok``;
broken off by the upstream (a reset, an idle or deadline timeout, a malformed or cut stream)
it ``failed``. An attempt the gateway gave up for a reason of its own side (its caller left,
it lost a hedge race, the worker is shutting down) is ``cancelled``: no verdict on the
upstream, but a half-open probe gives its slot back, so the next call probes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from app.upstream.breaker import Breaker, BreakerPolicy

OK, RATE_LIMITED, FAILED, CANCELLED = "ok", "rate_limited", "failed", "cancelled"
RESULTS = (OK, RATE_LIMITED, FAILED, CANCELLED)


def result_at_status(status: int) -> str | None:
    """An answer's result as its status tells it, or None: a 2xx is judged at its end."""
    if status >= 500:
        return FAILED
    if status == 429:
        return RATE_LIMITED
    return None if 200 <= status < 300 else OK


class Outliers:
    """The breakers of one worker's upstreams, by name. The only place they change."""

    def __init__(
        self,
        names: Iterable[str],
        policy: BreakerPolicy,
        clock: Callable[[], float],
        on_state: Callable[[str, str], None] = lambda name, state: None,
    ) -> None:
        self._breakers = {name: Breaker(policy) for name in names}
        self._clock = clock
        self._on_state = on_state

    def __getitem__(self, name: str) -> Breaker:
        return self._breakers[name]

    def states(self) -> dict[str, str]:
        """Each upstream's state now (an open breaker whose cooldown ended is half-open)."""
        now = self._clock()
        return {name: b.current(now).state for name, b in self._breakers.items()}

    def refresh(self) -> Callable[[str], bool]:
        """Bring every breaker to now (so the state shown turns half-open when its cooldown
        ends); whether each lets a call through, by name."""
        now = self._clock()
        for name, breaker in self._breakers.items():
            self._set(name, breaker.current(now))
        return lambda name: self._breakers[name].allows(now)

    def start(self, name: str) -> bool:
        """An attempt at ``name`` goes out: whether it is the half-open probe (its result,
        and only its, decides the breaker: hand it back to ``record``)."""
        breaker, now = self._breakers[name], self._clock()
        probe = breaker.probes(now)
        self._set(name, breaker.start_call(now))
        return probe

    def record(self, name: str, result: str, *, probe: bool = False) -> None:
        """The one result of an attempt at ``name`` that ``start`` announced."""
        if result not in RESULTS:
            raise ValueError(f"unknown attempt result {result!r}")
        breaker, now = self._breakers[name], self._clock()
        if result == CANCELLED:
            self._set(name, breaker.call_cancelled(now, probe=probe))
        else:
            self._set(name, breaker.record(result == FAILED, now, probe=probe))

    def _set(self, name: str, breaker: Breaker) -> None:
        before = self._breakers[name].state
        self._breakers[name] = breaker
        if breaker.state != before:
            self._on_state(name, breaker.state)
