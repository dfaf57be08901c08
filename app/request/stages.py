"""The gateway's own time by stage, as a call's answer tells it. No I/O here: the clock
readings are the stages' own, handed over through the call's Trace (app/request/call.py).

A call's time, from nginx taking it to its answer's head, is cut into stages, each named as
the ``Server-Timing`` header names it (W3C Server Timing: ``name;dur=<ms>``, comma separated):

    queue     nginx to the worker: nginx's start time (the ``X-Request-Start`` header it sets,
              in ms) to the worker's taking the call, on the machine's wall clock
    auth      the gateway key's check and its limits' grant (only with keys)
    cache     the answer cache's lookups (only where the cache looked)
    connect   a new upstream connection's handshake on the call's way (0: one was reused)
    upstream  the upstream's own time to its first byte: the request sent to its head (a
              stream's with its first event), the connect left out
    work      the rest of the worker's time: reading and checking the body, building the
              request and the reply; what no stage above names
    gateway   the total the gateway added: every stage but ``upstream``

The stages but ``gateway`` add up to the whole time by construction (``work`` is the rest);
what the figures promise is that none overlaps another, so ``work`` is never below 0 by more
than the clock's rounding (tests/integration/test_server_timing.py holds the sum against
nginx's own timing of the call). A stream's header is made when its first event is in: its
stages are those before the first byte; its relay, each event's time in the worker, is told
at its end (``RelayTimes``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

QUEUE, AUTH, CACHE, CONNECT, UPSTREAM, WORK, GATEWAY = (
    "queue",
    "auth",
    "cache",
    "connect",
    "upstream",
    "work",
    "gateway",
)
# The stages a call may have, in the order the header lists them (the label values of
# llmgate_added_seconds, with the relay's two: app/observe/metrics_stages.py).
STAGES = (QUEUE, AUTH, CACHE, CONNECT, UPSTREAM, WORK, GATEWAY)
RELAY, RELAY_MAX = "relay", "relay_max"
# nginx's start time is believed within this much of the worker's clock (seconds): a value
# further off is another machine's clock or a header nobody should have sent, and is ignored.
QUEUE_BOUND_S = 600.0


@dataclass(slots=True)
class Stages:
    """The stages one call measured, each in seconds, None when the call had no such stage
    (no nginx start time, no key, no cache lookup, no upstream call)."""

    queue_s: float | None = None
    auth_s: float | None = None
    cache_s: float | None = None
    connect_s: float | None = None
    upstream_s: float | None = None

    def figures(self, elapsed: float) -> list[tuple[str, float]]:
        """Each stage's seconds, in header order, for a call the worker has held
        ``elapsed`` seconds: ``work`` is the worker's time no other stage names, ``gateway``
        everything but the upstream's own."""
        found: list[tuple[str, float]] = []
        named = 0.0
        for name, seconds in (
            (QUEUE, self.queue_s),
            (AUTH, self.auth_s),
            (CACHE, self.cache_s),
            (CONNECT, self.connect_s),
            (UPSTREAM, self.upstream_s),
        ):
            if seconds is not None:
                found.append((name, seconds))
                if name != QUEUE:
                    named += seconds
        found.append((WORK, elapsed - named))
        total = elapsed + (self.queue_s or 0.0)
        found.append((GATEWAY, total - (self.upstream_s or 0.0)))
        return found


def header(figures: list[tuple[str, float]]) -> str:
    """The ``Server-Timing`` value of ``figures``: each in ms, to a tenth."""
    return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in figures)


def queue_start(value: str) -> float | None:
    """nginx's start time of the call from ``X-Request-Start`` (``t=<seconds>.<ms>``, what
    nginx/llmgate.conf.template sets from ``$msec``), in seconds; None when it is not one."""
    text = value[2:] if value.startswith("t=") else value
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if seconds == seconds and seconds > 0 else None


def queued(start: float | None, now: float) -> float | None:
    """The seconds from nginx's ``start`` to ``now`` (the worker's wall clock); None when
    there was no start or it is implausible (QUEUE_BOUND_S). nginx writes whole milliseconds,
    so a call taken within the same millisecond may read a little below 0: shown as 0."""
    if start is None:
        return None
    seconds = now - start
    if not -1.0 < seconds < QUEUE_BOUND_S:
        return None
    return max(0.0, seconds)


# The relay's buckets: 10 us apart at first, then each 1.25 times the last, up to ~6.5 s; a
# stream's median relay time is its bucket's upper bound (within 25 %), its longest exact.
_BOUNDS = tuple(1e-5 * 1.25**k for k in range(61))


class RelayTimes:
    """Each event's time in the worker on a stream's way out, a median and a maximum kept in
    a few counts (a stream of a million events holds no more than one of ten).

    What is measured (app/edge/finish.py): from the worker loop's turn that woke the stream
    (its loop's own clock, read when the loop last looked at its sockets: nothing is read
    per event for it) to the batch's handing to the caller's socket (the clock the stream's
    figures read anyway). Where the worker is busy, that is the wait behind the other
    greenlets of the same turn; an idle one shows its own few microseconds."""

    __slots__ = ("_counts", "events", "longest")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.events = 0
        self.longest = 0.0

    def add(self, seconds: float, events: int = 1) -> None:
        """A batch of ``events`` that took ``seconds`` (a negative time, a clock's rounding,
        counts as 0)."""
        if seconds > self.longest:
            self.longest = seconds
        k = bisect.bisect_left(_BOUNDS, seconds)
        self._counts[k] = self._counts.get(k, 0) + events
        self.events += events

    @property
    def median(self) -> float:
        """The upper bound of the bucket holding the middle event; 0.0 with none."""
        half, seen = self.events / 2, 0
        for k in sorted(self._counts):
            seen += self._counts[k]
            if seen >= half:
                return min(_BOUNDS[k] if k < len(_BOUNDS) else self.longest, self.longest)
        return 0.0

    def comment(self) -> bytes:
        """An SSE comment line in Server-Timing's syntax (clients skip comments), without the
        blank line that would end an event: ``: server-timing: relay;dur=<p50 ms>,
        relay-max;dur=<max ms>``. app/edge/finish.py puts it at the head of the stream's end
        event, inside its block: a comment block of its own would make a client that keeps
        the last event id (the OpenAI SDK does) read an empty event."""
        return (
            f": server-timing: relay;dur={self.median * 1000:.2f}, "
            f"relay-max;dur={self.longest * 1000:.2f}\n"
        ).encode()
