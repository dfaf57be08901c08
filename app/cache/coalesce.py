"""Single flight: identical cacheable requests share one upstream call.

Within a worker, the first request for a key starts a flight and registers it; identical
requests that arrive while it runs join it as listeners and read its events live (a late
joiner reads the events so far, then the live ones). The entry leaves the map when the flight
ends; an error reaches every listener and is not cached.

Across workers and instances, a short Memcached lease (`add` with a TTL) elects one computing
caller per key; the others wait for its entry (bounded by the lease and their own deadline)
and replay it. A lease whose holder died expires, and one waiter takes over.
"""

from __future__ import annotations

import time

import gevent

from app.cache.entry import Entry
from app.cache.policy import Directive
from app.cache.replay import body_of, events_of
from app.cache.store import AnswerCache
from app.core.config import Settings
from app.core.errors import GatewayError
from app.observe.tracing import Span
from app.request.routes import PASSTHROUGH, Route
from app.streams.drain import Lifecycle
from app.streams.flight import CACHE, LEASE, UPSTREAM, ClientGone, Flight, Head, Producer
from app.streams.log_memory import LogBudget
from app.upstream.retry import Deadline
from llmgate_wire import sse


class Flights:
    """The flights in progress in this worker, by key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Flight] = {}

    def get(self, key: str) -> Flight | None:
        flight = self._by_key.get(key)
        # Not one that failed, was cancelled, or is past the size it can replay to a late
        # joiner (its log given up).
        return flight if flight is not None and flight.open_to_followers else None

    def put(self, key: str, flight: Flight) -> None:
        self._by_key[key] = flight

    def remove(self, key: str, flight: Flight) -> None:
        if self._by_key.get(key) is flight:
            del self._by_key[key]


def publish_entry(
    flight: Flight, entry: Entry, *, route: Route = PASSTHROUGH, include_usage: bool = False
) -> bool:
    """Play a stored entry into a flight, all at once, in the flight's shape: a stream
    flight gets events even from a stored completion, and the other way round. False when
    the entry cannot be converted (the caller computes instead); nothing is published then."""
    headers = [("Content-Type", entry.content_type)] if entry.content_type else []
    raw_events: tuple[bytes, ...] | list[bytes] | None = entry.events
    body = entry.body
    try:
        if flight.stream and entry.events is None:
            raw_events = events_of(entry, route, include_usage)
            headers = [("Content-Type", "text/event-stream")]
        elif not flight.stream and entry.body is None:
            body = body_of(entry, route)
            headers = [("Content-Type", "application/json")]
    except ValueError:
        return False
    if body is not None and not flight.stream:
        flight.publish_head(Head(entry.status, headers, 1, body))
        return True
    if raw_events is None:
        return False
    flight.publish_head(Head(entry.status, headers, 1, None))
    decoder = sse.Decoder()
    for raw in raw_events:
        for event in decoder.feed(raw):
            flight.publish(event)
    flight.finish(decoder.close())
    return True


def replay_producer(
    entry: Entry, compute: Producer, *, route: Route = PASSTHROUGH, include_usage: bool = False
) -> Producer:
    """Play ``entry`` into the flight; compute when it cannot take the flight's shape."""

    def produce(flight: Flight) -> None:
        if publish_entry(flight, entry, route=route, include_usage=include_usage):
            flight.answered_from(CACHE)
            return
        flight.answered_from(UPSTREAM)
        compute(flight)

    return produce


def lease_wait_producer(
    answers: AnswerCache,
    key: str,
    deadline: Deadline,
    compute: Producer,
    *,
    route: Route = PASSTHROUGH,
    include_usage: bool = False,
    poll_s: float = 0.02,
    max_poll_s: float = 0.25,
) -> Producer:
    """Wait for the lease holder's entry; take over the lease if it lapses; compute at worst.

    Polls with a growing interval (20 ms up to 250 ms): a waiter costs a few Memcached gets
    per second, and the first poll lands within milliseconds of a short answer being stored.
    """

    def stored(flight: Flight) -> bool | None:
        """The holder's entry played into ``flight``: True; None when there is none yet;
        False when it is stored in a shape this caller cannot use."""
        found = answers.lookup(key, Directive())
        if found is None:
            return None
        return publish_entry(flight, found[0], route=route, include_usage=include_usage)

    def produce(flight: Flight) -> None:
        until = time.monotonic() + min(answers.settings.cache_lease_s, deadline.remaining())
        delay = poll_s
        while time.monotonic() < until:
            gevent.sleep(delay)
            delay = min(delay * 1.5, max_poll_s)
            replayed = stored(flight)
            if replayed:
                flight.answered_from(CACHE)
                return
            if replayed is False:
                break  # stored in a shape this caller cannot use: compute
            lease = answers.try_lease(key)
            if lease is False:
                continue  # the holder is still at work
            # We hold the lease now, or nobody can be seen holding it: Memcached trouble, or
            # the holder released it between our `add` and our `get`. The holder stores its
            # entry before it releases, so both may have come since our lookup: one more look
            # before calling upstream (in trouble it fails fast and we compute).
            if lease:
                flight.took_lease()
            if stored(flight):
                flight.answered_from(CACHE)
                return
            break
        flight.answered_from(UPSTREAM)
        compute(flight)

    return produce


class Coalescer:
    """Leads the computation of a cacheable answer: this worker's one flight per key, and
    across processes the lease holder's (or a waiter for the holder's entry).

    An answer that will not be stored keeps no log and is shared with nobody: a ``no-store``
    one, and a stream starting while the worker's log memory budget is full. It is the
    caller's own call, with no lease for other processes to wait on."""

    def __init__(
        self,
        settings: Settings,
        answers: AnswerCache,
        lifecycle: Lifecycle,
        log_budget: LogBudget,
    ) -> None:
        self.settings = settings
        self.answers = answers
        self.lifecycle = lifecycle
        self.log_budget = log_budget
        self.flights = Flights()

    def lead(
        self,
        key: str,
        directive: Directive,
        compute: Producer,
        deadline: Deadline,
        stream: bool,
        *,
        background: bool = False,
        request_id: str = "",
        route: Route = PASSTHROUGH,
        include_usage: bool = False,
        span: Span | None = None,
    ) -> Flight | None:
        """The flight for ``key``, started; None for a background refresh that would have
        to wait for another process (nobody waits on a refresh)."""
        if not directive.store or (stream and not self.log_budget.admit()):
            if background:
                return None
            return self.lifecycle.flight(
                compute, keep_log=False, request_id=request_id, stream=stream, span=span
            )
        started = self._under_lease(
            key,
            directive,
            compute,
            deadline,
            stream,
            background,
            route=route,
            include_usage=include_usage,
        )
        if started is None:
            return None
        producer, lease_held, waiting = started

        def done(flight: Flight) -> None:
            self.flights.remove(key, flight)
            try:
                if directive.store and flight.source == UPSTREAM:
                    self.answers.store(key, flight, directive)
            finally:
                if flight.lease_held:
                    self.answers.release_lease(key)

        # The log serves the cache entry and followers, up to the size an entry may have.
        flight = self.lifecycle.flight(
            producer,
            on_done=done,
            log_limit=self.settings.cache_max_entry_bytes,
            log_budget=self.log_budget,
            request_id=request_id,
            stream=stream,
            source=LEASE if waiting else UPSTREAM,
            lease_held=lease_held,
            span=span,
        )
        self.flights.put(key, flight)
        return flight

    def _under_lease(
        self,
        key: str,
        directive: Directive,
        compute: Producer,
        deadline: Deadline,
        stream: bool,
        background: bool,
        *,
        route: Route,
        include_usage: bool,
    ) -> tuple[Producer, bool, bool] | None:
        """(the producer, whether this process holds the lease, whether it waits for another
        process's answer); None for a background refresh another process is doing."""
        answers, settings = self.answers, self.settings
        if not answers.shared or settings.cache_lease_s <= 0:
            return compute, False, False
        if stream and not settings.cache_lease_streams and not background:
            return compute, False, False  # first-token latency matters more than cost here
        lease = answers.try_lease(key)
        if lease:
            # The previous holder stores its entry, then releases its lease: both may have
            # landed since this caller's lookup missed. One more look.
            found = answers.lookup(key, directive) if directive.lookup and not background else None
            if found is None:
                return compute, True, False
            replay = replay_producer(found[0], compute, route=route, include_usage=include_usage)
            return replay, True, True
        if lease is None:
            return compute, False, False  # no lease to be had (Memcached trouble): compute
        if background:
            return None
        wait = lease_wait_producer(
            answers, key, deadline, compute, route=route, include_usage=include_usage
        )
        return wait, False, True

    def refresh(
        self, key: str, directive: Directive, compute: Producer, deadline: Deadline, stream: bool
    ) -> None:
        """Renew a hot entry before it expires, once per key across processes; nobody waits."""
        if self.flights.get(key) is not None:
            return
        flight = self.lead(key, directive, compute, deadline, stream, background=True)
        if flight is None:
            return  # another process holds the lease: it is refreshing already
        listener = flight.join()  # keeps the flight alive until it is complete

        def hold() -> None:
            try:
                listener.wait_complete()
            except (ClientGone, GatewayError):
                pass
            finally:
                listener.leave()

        gevent.spawn(hold)
