"""The answer cache: entries in and out of the tiered backends, and the cross-process lease.

Only complete, successful answers are stored: a 2xx body, or a stream that ended with
`[DONE]` (a Responses stream: with `response.completed`) and carried no error event — never
an error, a 429, a failed or incomplete response, or a partial or aborted stream.
Every backend failure is a miss (the backends fail open); an unreadable entry is a miss.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from app.cache.entry import Entry, EntryError
from app.cache.keys import lease_key
from app.cache.policy import Directive, acceptable_age, entry_ttl
from app.core.config import Settings
from app.observe.metrics import Metrics
from app.observe.unobserved import UNOBSERVED
from app.request.events import completed_ok, is_error_event
from app.streams.flight import Finished, Flight

log = logging.getLogger("llmgate.cache")

# Decoded entries kept for the hottest keys: a hit served from L1 is the same bytes object
# every time, and decoding it (zlib, JSON, the dataclass) was the largest part of a hit's own
# work. Small answers only, so the copies stay under DECODED_KEYS * DECODED_MAX_BYTES, and
# the forms a replay keeps on each (app/cache/replay.py: two event shapes and a body, each
# at most FORM_MAX_BYTES) under three times that again: 6 MiB a worker at most.
DECODED_KEYS = 64
DECODED_MAX_BYTES = 32 * 1024


class Tiers(Protocol):
    def get(self, key: str) -> tuple[bytes, str] | None: ...
    def get_shared(self, key: str) -> bytes | None: ...
    def set(self, key: str, value: bytes, ttl: int) -> bool: ...
    def add(self, key: str, value: bytes, ttl: int) -> bool: ...
    def delete(self, key: str, *, force: bool = False) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def errors(self) -> int: ...


def entry_from_flight(flight: Flight, *, now: float, ttl: int = 0) -> Entry | None:
    """The flight's answer as an entry, or None when it must not be stored."""
    head = flight.head
    if head is None or not 200 <= head.status < 300 or not flight.complete:
        return None
    if head.body is None and not flight.log_whole:
        return None  # the log was given up (too large to keep): not every event is here
    ctype = next((v for k, v in head.headers if k.lower() == "content-type"), "")
    compute_s = (flight.finished_at or time.monotonic()) - flight.started
    try:
        if head.body is not None:
            head.body.decode("utf-8")
            return Entry(now, compute_s, ttl, head.status, ctype, body=head.body)
        end = flight.end
        if not isinstance(end, Finished) or end.leftover:
            return None
        events = flight.events
        if not completed_ok(events) or any(is_error_event(e) for e in events):
            return None
        raw = tuple(e.raw for e in events if not e.is_comment)
        for event in raw:
            event.decode("utf-8")
        return Entry(now, compute_s, ttl, head.status, ctype, events=raw)
    except UnicodeDecodeError:
        return None


class AnswerCache:
    def __init__(
        self,
        tiers: Tiers,
        settings: Settings,
        *,
        shared: bool,
        metrics: Metrics = UNOBSERVED,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.tiers = tiers
        self.settings = settings
        self.shared = shared  # an L2 other processes see: leases make sense
        self.metrics = metrics
        self._errors_seen = 0
        self._clock = clock
        self._rand = rand
        # key -> (the stored bytes, their entry); least recently served first
        self._decoded: dict[str, tuple[bytes, Entry]] = {}

    def _timed(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.metrics.cache_op.labels(op).observe(time.perf_counter() - started)
            errors = self.tiers.errors()
            if errors > self._errors_seen:
                self.metrics.cache_errors.inc(errors - self._errors_seen)
            self._errors_seen = errors

    def lookup(self, key: str, directive: Directive) -> tuple[Entry, str] | None:
        found = self._timed("get", self.tiers.get, key)
        if found is None:
            return None
        data, level = found
        try:
            entry = self._decode(key, data)
        except EntryError as exc:
            log.warning("cache entry unreadable, treated as a miss: %s", exc)
            return None
        now = self._clock()
        if entry.expired(now) or not acceptable_age(directive, entry.age(now)):
            return None
        return entry, level

    def _decode(self, key: str, data: bytes) -> Entry:
        """``data`` as an entry, decoded again only when it differs from the bytes decoded
        last time for ``key``: the same object (an L1 hit), or equal bytes (an L2 hit is a
        new object each time; equal bytes decode to an equal entry, whose replay forms are
        kept on it). A value written since differs: its time of storing, at least."""
        kept = self._decoded.pop(key, None)
        if kept is not None and (kept[0] is data or kept[0] == data):
            entry = kept[1]
        else:
            entry = Entry.from_bytes(data)
            if entry.size > DECODED_MAX_BYTES:
                return entry
        self._decoded[key] = (data, entry)
        if len(self._decoded) > DECODED_KEYS:
            del self._decoded[next(iter(self._decoded))]
        return entry

    def store(self, key: str, flight: Flight, directive: Directive) -> bool:
        ttl = entry_ttl(
            directive, self.settings.cache_ttl_s, self.settings.cache_ttl_jitter_s, self._rand
        )
        entry = entry_from_flight(flight, now=self._clock(), ttl=ttl)
        if entry is None:
            if flight.complete and not flight.log_whole:
                # Its log was given up on the way: too large for an entry, or no room left
                # in the worker's log memory budget.
                self.metrics.cache_not_stored.labels(flight.log_given_up or "too_large").inc()
            return False
        data = entry.to_bytes()
        if len(data) > self.settings.cache_max_entry_bytes:
            self.metrics.cache_not_stored.labels("too_large").inc()
            return False
        stored = bool(self._timed("set", self.tiers.set, key, data, ttl))
        if stored:
            self.metrics.cache_stored_bytes.inc(len(data))
        return stored

    def try_lease(self, key: str) -> bool | None:
        """True: we hold the lease. False: another caller does. None: the lease cannot be
        had (Memcached down or skipped) — compute without one rather than wait on nobody."""
        ttl = max(1, int(self.settings.cache_lease_s + 0.999))
        if self._timed("add", self.tiers.add, lease_key(key), b"1", ttl):
            return True
        # `add` also fails when the node is down: only a lease we can read is held.
        return False if self._timed("get", self.tiers.get_shared, lease_key(key)) else None

    def release_lease(self, key: str) -> None:
        """Forced past Memcached's node breaker: a store that just failed (a blip) must not
        leave the lease behind for other processes to wait out (LLMGATE_CACHE_LEASE_S)."""
        self.tiers.delete(lease_key(key), force=True)
