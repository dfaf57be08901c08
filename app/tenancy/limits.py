"""Per-key limits as counters in fixed windows. No I/O here: the counters are passed in.

Every limit is a counter under a key naming the gateway key, what is counted and the window
it counts in (``llmgate:rl:v1:<key name>:<what>:<window start>``), kept in Memcached so all
workers of all instances count together (app/store/counters.py ``MemcachedCounters``,
wired by the app factory; without Memcached, ``MemoryCounters`` counts per worker only). A
call takes its share of every limit its key has with one ``incr`` each, all sent together
(``Counters.apply``: one round trip to each node), and is refused when a new value is over
its limit, giving every share back with ``decr``: two processes can never both take the last
slot (at worst a refused call's shares were briefly held, refusing a third that would have
fitted). A limit the key does not have is not counted at all.

The trade-offs, written down because they are real:

- **Fixed windows**: a minute's count restarts on the minute (UTC), so up to twice the
  per-minute limit can pass within 60 s straddling the edge. Sliding windows would need two
  counters read per call; fixed windows are what the limit headers can state exactly.
- **Streams** are counted up on start and down on end, in one counter per key that never
  rolls over. Each start renews its TTL to the longest a stream can last (the deadline, the
  send timeout and a minute), so it expires only when no stream of the key can still be
  open: a worker killed mid-stream leaks its slots until then, never longer.
- **A lost Memcached node** loses the counters it held: those keys start again from zero
  (more admitted, never fewer), and while the node is being skipped the limits fail open or
  closed as ``LLMGATE_LIMITS_FAIL`` says.
- **Tokens and money** are reserved from the most the call can be billed (app/request/bounds.py:
  its prompt's bound plus its output's) and settled from the answer's ``usage``; a call the
  gateway does not parse (a passthrough) reserves nothing and is admitted while the window
  still has room, so it can overshoot by its own size.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

PREFIX = "llmgate:rl:v1:"


# A count's value when its counter was missing and the count was not to make it (``create``
# False): nothing was counted. A counter's own value is never below 0.
MISSING = -1
# The windows of a day's or a month's budget: counters the spend ledger can make again.
BUDGETS = frozenset({"tokens_day", "tokens_month", "usd_day", "usd_month"})


@dataclass(frozen=True)
class Count:
    """One change to one counter: ``delta`` added, or taken off when negative (a counter stops
    at 0, and one that is gone stays gone). A counter this count creates starts at ``start``
    and lives ``ttl`` seconds; ``renew``: an existing one's TTL starts again too (the stream
    slots'). ``create`` False: a missing counter is left missing and the count's value is
    ``MISSING`` (a day's or month's budget, made again from the spend ledger first)."""

    key: str
    delta: int
    ttl: int = 0
    renew: bool = False
    create: bool = True
    start: int = 0


class Counters(Protocol):
    """Shared integer counters; None for a value: the store could not be reached."""

    def apply(self, counts: Sequence[Count]) -> list[int | None]:
        """Each count's new value, in order (0 for one taken off a counter that is gone,
        ``MISSING`` for one added to a counter that is gone and was not to be made), sent
        together: one round trip to each node they live on."""
        ...

    def read(self, keys: list[str]) -> dict[str, int] | None: ...


@dataclass(frozen=True)
class Window:
    """One counting period: ``what`` counted from ``start`` until ``end`` (Unix seconds)."""

    what: str  # requests | tokens | tokens_day | tokens_month | usd_day | usd_month | streams
    start: int
    end: int
    hold: int = 0  # > 0: a counter with no end, kept this long after its last use (streams)

    def key(self, name: str) -> str:
        return f"{PREFIX}{name}:{self.what}:{self.start}"

    @property
    def budget(self) -> bool:
        """A day's or a month's budget (tokens or money)."""
        return self.what in BUDGETS

    def ttl(self, now: float) -> int:
        """How long the counter must live: to the window's end, plus a margin for clocks."""
        if self.hold:
            return self.hold
        return max(1, int(self.end - now) + 60)

    def reset_s(self, now: float) -> float:
        return max(0.0, self.end - now)


def minute(what: str, now: float) -> Window:
    start = int(now) - int(now) % 60
    return Window(what, start, start + 60)


def day(what: str, now: float) -> Window:
    """The UTC day of ``now`` (``what``: tokens_day or usd_day)."""
    start = int(now) - int(now) % 86400
    return Window(what, start, start + 86400)


def month(what: str, now: float) -> Window:
    """The UTC calendar month of ``now`` (``what``: tokens_month or usd_month)."""
    t = time.gmtime(now)
    start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
    year, mon = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return Window(what, start, calendar.timegm((year, mon, 1, 0, 0, 0)))


def period(text: str) -> tuple[int, int]:
    """A UTC day (``2026-01-31``) or month (``2026-01``) as [start, end) in Unix seconds;
    ValueError for anything else."""
    parts = text.strip().split("-")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a day (YYYY-MM-DD) or a month (YYYY-MM)")
    numbers = [int(p) for p in parts]
    if not 1 <= numbers[1] <= 12:
        raise ValueError(f"{text!r} is not a day (YYYY-MM-DD) or a month (YYYY-MM)")
    if len(numbers) == 2:
        window = month("", calendar.timegm((numbers[0], numbers[1], 1, 0, 0, 0)))
    else:
        year, mon, mday = numbers
        if not 1 <= mday <= calendar.monthrange(year, mon)[1]:
            raise ValueError(f"{text!r} is not a day (YYYY-MM-DD)")
        window = day("", calendar.timegm((year, mon, mday, 0, 0, 0)))
    return window.start, window.end


def streams(longest_s: float) -> Window:
    """Concurrent streams: one counter that never rolls over. ``longest_s`` is the longest a
    stream can last; the counter is kept a minute beyond it after each start (``renew``), so
    it expires only once every stream it counts has ended, or its worker died."""
    return Window("streams", 0, 0, hold=int(longest_s) + 60)


def reset_text(seconds: float) -> str:
    """A duration the way OpenAI's ``x-ratelimit-reset-*`` headers write it: 1s, 6m0s, 20ms."""
    if seconds < 1:
        return f"{max(0, int(seconds * 1000))}ms"
    whole = int(seconds + 0.999)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


class MemoryCounters:
    """Counters in this process only: the stand-in when no Memcached is configured (each
    worker then enforces the whole limit on its own; docs/security.md says so)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._values: dict[str, tuple[int, float]] = {}

    def apply(self, counts: Sequence[Count]) -> list[int | None]:
        return [self._incr(c) if c.delta >= 0 else self._decr(c.key, -c.delta) for c in counts]

    def _incr(self, count: Count) -> int:
        key, delta, ttl, renew = count.key, count.delta, count.ttl, count.renew
        now = self._clock()
        value, expires = self._values.get(key, (0, 0.0))
        if expires <= now:
            if not count.create:
                return MISSING
            value, expires = count.start, now + ttl
        if renew:
            expires = now + ttl
        value += delta
        self._values[key] = (value, expires)
        if len(self._values) > 10_000:
            self._values = {k: v for k, v in self._values.items() if v[1] > now}
        return value

    def _decr(self, key: str, delta: int) -> int:
        value, expires = self._values.get(key, (0, self._clock()))
        value = max(0, value - delta)  # like Memcached: never below zero
        self._values[key] = (value, expires)
        return value

    def read(self, keys: list[str]) -> dict[str, int]:
        now = self._clock()
        found = {}
        for key in keys:
            value, expires = self._values.get(key, (0, 0.0))
            if expires > now:
                found[key] = value
        return found
