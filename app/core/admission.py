"""Admission control: per-worker limits on concurrent requests and streams. No I/O here.

A request is admitted once its body is parsed (then it is known whether it streams) and
holds its slots until its response body is fully sent or the caller left. Beyond a limit
the answer is immediate, a 429 ``gateway_overloaded`` (``errors.Overloaded``): nothing
waits in a queue here, and gunicorn's own queue (connections beyond worker_connections
wait unseen in the listen backlog) stays out of reach because the default limits sit
below worker_connections (docs/configuration.md, "Admission control").

``Load`` is the counters as a value (``acquire``/``release`` return a new one); ``Gate`` is
one worker's current ``Load``; a ``Ticket`` is one call's claim on the gate, released
exactly once by ``Held`` when the server closes the response body. Under gevent, greenlets
switch only on I/O, and nothing here does I/O: a check and its increment cannot interleave.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from app.core.errors import Overloaded
from app.core.frozen import quick_init

REQUESTS = "requests"
STREAMS = "streams"
KINDS = (REQUESTS, STREAMS)
# What a refused caller is told to wait: a slot frees when any call ends, which is usually
# within seconds; the OpenAI SDK waits exactly this (x-should-retry: true) before retrying.
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Limits:
    """Most calls in flight per worker of each kind; 0 is no limit."""

    requests: int = 0
    streams: int = 0


@quick_init
@dataclass(frozen=True)
class Load:
    """Calls in flight in one worker. A stream counts as a request and as a stream."""

    requests: int = 0
    streams: int = 0

    def acquire(self, kind: str, limits: Limits) -> Load | None:
        """The load with one more call of ``kind``, or None when that is over its limit."""
        current, limit = getattr(self, kind), getattr(limits, kind)
        if limit and current >= limit:
            return None
        return self._with(kind, current + 1)

    def release(self, kind: str) -> Load:
        current = getattr(self, kind)
        if current <= 0:
            raise ValueError(f"no {kind} in flight to release")
        return self._with(kind, current - 1)

    def _with(self, kind: str, count: int) -> Load:
        # Built directly: dataclasses.replace costs 1.8 us to this 0.5, twice or four times
        # a call (admitted, released).
        if kind == REQUESTS:
            return Load(count, self.streams)
        return Load(self.requests, count)


# (kind, event, load after it): event is "admitted", "released" or "rejected".
Observer = Callable[[str, str, Load], None]


def _ignore(kind: str, event: str, load: Load) -> None:
    pass


class Gate:
    """One worker's load against its limits."""

    def __init__(self, limits: Limits, observe: Observer = _ignore) -> None:
        self.limits = limits
        self.load = Load()
        self._observe = observe

    def enter(self, stream: bool) -> tuple[str, ...]:
        """Take a request slot, and a stream slot for a stream: both or neither.

        Returns the kinds taken; raises ``Overloaded`` naming the limit that was full.
        """
        kinds = KINDS if stream else (REQUESTS,)
        load = self.load
        for kind in kinds:
            after = load.acquire(kind, self.limits)
            if after is None:
                self._observe(kind, "rejected", self.load)
                raise Overloaded(kind, getattr(self.limits, kind), retry_after_s=RETRY_AFTER_S)
            load = after
        self.load = load
        for kind in kinds:
            self._observe(kind, "admitted", load)
        return kinds

    def leave(self, kinds: tuple[str, ...]) -> None:
        for kind in kinds:
            self.load = self.load.release(kind)
            self._observe(kind, "released", self.load)

    def ticket(self) -> Ticket:
        return Ticket(self)


class Ticket:
    """One call's slots: none until ``admit``, none again after ``release``.

    Without a gate (tests, tools) every call is admitted and nothing is counted.
    """

    def __init__(self, gate: Gate | None = None) -> None:
        self._gate = gate
        self._held: tuple[str, ...] = ()
        self._admitted = False

    def admit(self, stream: bool) -> None:
        """Admit the call (raises ``Overloaded``); a second call changes nothing."""
        if self._gate is None or self._admitted:
            return
        self._held = self._gate.enter(stream)
        self._admitted = True

    @property
    def held(self) -> tuple[str, ...]:
        return self._held

    def release(self) -> None:
        """Give the slots back; safe to call any number of times."""
        held, self._held = self._held, ()
        if held and self._gate is not None:
            self._gate.leave(held)


class Held:
    """A response body that releases its ticket when the server closes it.

    WSGI servers call ``close()`` once the body is sent, and also when the caller left
    mid-body (gunicorn in a ``finally``); the slots are given back even when closing the
    inner body raises. Its items are the inner body's own iterator: nothing of ours runs
    for a stream's writes, and the slots go back when the server closes the body, after
    its last byte is written, not when its items run out.
    """

    def __init__(self, body: Iterable[bytes], release: Callable[[], None]) -> None:
        self._body = body
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._give_back()

    def _give_back(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
