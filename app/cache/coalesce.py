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
from app.streams.flight import Flight, Head, Producer
from app.upstream.retry import Deadline
from llmgate_wire import sse


class Flights:
    """The flights in progress in this worker, by key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Flight] = {}

    def get(self, key: str) -> Flight | None:
        flight = self._by_key.get(key)
        if flight is None or flight.cancelled or flight.failure is not None:
            return None
        if not flight.log_whole:
            return None  # past the size it can replay to a late joiner: no new followers
        return flight

    def put(self, key: str, flight: Flight) -> None:
        self._by_key[key] = flight

    def remove(self, key: str, flight: Flight) -> None:
        if self._by_key.get(key) is flight:
            del self._by_key[key]


def publish_entry(
    flight: Flight, entry: Entry, *, route: str = "", include_usage: bool = False
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
    entry: Entry, compute: Producer, *, route: str = "", include_usage: bool = False
) -> Producer:
    """Play ``entry`` into the flight; compute when it cannot take the flight's shape."""

    def produce(flight: Flight) -> None:
        if publish_entry(flight, entry, route=route, include_usage=include_usage):
            flight.source = "cache"
            return
        flight.source = "upstream"
        compute(flight)

    return produce


def lease_wait_producer(
    answers: AnswerCache,
    key: str,
    deadline: Deadline,
    compute: Producer,
    *,
    route: str = "",
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
                flight.source = "cache"
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
            flight.lease_held = bool(lease)
            if stored(flight):
                flight.source = "cache"
                return
            break
        flight.source = "upstream"
        compute(flight)

    return produce
