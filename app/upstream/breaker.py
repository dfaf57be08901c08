"""A circuit breaker per upstream (outlier ejection) as a small immutable value. No I/O here.

Closed: calls flow; it opens after ``failures_to_open`` consecutive failures, or when at
least ``window_min`` of the last ``window`` calls were made and more than ``error_rate`` of
them failed. Open: no calls for a cooldown that doubles with each consecutive opening (from
``cooldown_s`` up to ``cooldown_max_s``). Then half-open: one probe call goes through; its
success closes the breaker, its failure opens it again for a longer cooldown; a probe that
ends with no verdict (its caller left) frees the slot for the next call. The clock is passed
in; every transition returns a new value.

What counts as a failure is the caller's to say (app/upstream/outliers.py: no connection, a timeout,
a 5xx, a reset or a malformed stream even after the headers). A 429 is not: it says the key
is busy, not that the upstream is broken.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
STATES = (CLOSED, HALF_OPEN, OPEN)


@dataclass(frozen=True)
class BreakerPolicy:
    failures_to_open: int = 5
    window: int = 20
    window_min: int = 10
    error_rate: float = 0.5
    cooldown_s: float = 5.0
    cooldown_max_s: float = 300.0


@dataclass(frozen=True)
class Breaker:
    policy: BreakerPolicy = BreakerPolicy()
    state: str = CLOSED
    consecutive: int = 0  # failures in a row
    recent: tuple[bool, ...] = ()  # last calls' outcomes, True = failed
    openings: int = 0  # openings in a row without a success between
    until: float = 0.0  # while open: when the cooldown ends
    probing: bool = False  # half-open: the one probe is in flight

    def current(self, now: float) -> Breaker:
        """This breaker as of ``now``: an open one whose cooldown ended is half-open."""
        if self.state == OPEN and now >= self.until:
            return replace(self, state=HALF_OPEN, probing=False)
        return self

    def allows(self, now: float) -> bool:
        state = self.current(now)
        return state.state == CLOSED or (state.state == HALF_OPEN and not state.probing)

    def probes(self, now: float) -> bool:
        """Whether a call starting now is the half-open probe (the caller keeps the answer
        and hands it to ``record`` and ``call_cancelled``)."""
        state = self.current(now)
        return state.state == HALF_OPEN and not state.probing

    def start_call(self, now: float) -> Breaker:
        """A call goes through: in half-open the first is the probe, and the only one."""
        state = self.current(now)
        return replace(state, probing=True) if state.state == HALF_OPEN else state

    def call_cancelled(self, now: float, *, probe: bool = False) -> Breaker:
        """A call that went through ended with no verdict (its caller left): when it was
        the probe, the slot is free again, so the next call probes; nothing else changes."""
        state = self.current(now)
        return replace(state, probing=False) if state.state == HALF_OPEN and probe else state

    def record(self, failed: bool, now: float, *, probe: bool = False) -> Breaker:
        """The outcome of a call that went through. In half-open only the probe's counts: a
        call started before the opening, or in panic (every breaker open), says nothing of
        the upstream since."""
        state = self.current(now)
        if state.state == HALF_OPEN:
            if not probe:
                return state
            return state._open(now) if failed else Breaker(self.policy)  # the probe decides
        if state.state == OPEN:
            return state  # a call from before it opened: the cooldown stands
        recent = (*state.recent, failed)[-self.policy.window :]
        if not failed:
            if recent == state.recent and not state.consecutive and not state.openings:
                return state  # a healthy upstream's usual success: nothing changes
            return replace(state, consecutive=0, recent=recent, openings=0)
        state = replace(state, consecutive=state.consecutive + 1, recent=recent)
        return state._open(now) if state._should_open() else state

    def cooldown(self) -> float:
        p = self.policy
        return min(p.cooldown_max_s, p.cooldown_s * 2 ** max(0, self.openings - 1))

    def _should_open(self) -> bool:
        p = self.policy
        if self.consecutive >= p.failures_to_open:
            return True
        if len(self.recent) < p.window_min:
            return False
        return sum(self.recent) / len(self.recent) > p.error_rate

    def _open(self, now: float) -> Breaker:
        opened = replace(self, state=OPEN, openings=self.openings + 1, probing=False)
        return replace(opened, until=now + opened.cooldown(), consecutive=0, recent=())
