"""AnswerCache.lookup over a real in-process L1: a hot entry is decoded once, and keeping it
decoded changes nothing a caller can see (a new value, the TTL, the size bounds)."""

from __future__ import annotations

import time

from app.cache.entry import Entry
from app.cache.policy import Directive
from app.cache.store import DECODED_KEYS, DECODED_MAX_BYTES, AnswerCache
from app.cache.tiered import TieredCache
from app.core.config import Settings
from app.store.memory import MemoryBackend
from tests.support.clock import Clock

KEY = "llmgate:v1:" + "a" * 64


def _cache() -> tuple[AnswerCache, TieredCache, Clock]:
    clock = Clock(time.time())
    tiers = TieredCache(MemoryBackend(64 << 20), None, l1_ttl=3600)
    return AnswerCache(tiers, Settings(), shared=False, clock=clock), tiers, clock


def _put(tiers: TieredCache, key: str, body: bytes, created: float, ttl: int = 60) -> None:
    entry = Entry(created, 0.1, ttl, 200, "application/json", body=body)
    assert tiers.set(key, entry.to_bytes(), 3600)


def _body(found: tuple[Entry, str] | None) -> bytes | None:
    return None if found is None else found[0].body


def test_a_hot_entry_is_decoded_once_and_a_new_value_is_decoded_again() -> None:
    answers, tiers, clock = _cache()
    _put(tiers, KEY, b'{"n":1}', clock.now)
    first, second = answers.lookup(KEY, Directive()), answers.lookup(KEY, Directive())
    assert first is not None and second is not None
    assert second[0] is first[0]  # the same decoded entry, not a second decode
    _put(tiers, KEY, b'{"n":2}', clock.now)
    assert _body(answers.lookup(KEY, Directive())) == b'{"n":2}'


def test_equal_bytes_from_the_shared_level_are_not_decoded_again() -> None:
    """Memcached gives a new bytes object on every get: equal bytes reuse the decoded entry
    (and the forms a replay kept on it); a value stored again, even with the same answer,
    has its own time of storing and is decoded again."""
    answers, tiers, clock = _cache()
    _put(tiers, KEY, b'{"n":1}', clock.now)
    first = answers.lookup(KEY, Directive())
    data, _ = tiers.get(KEY) or (b"", "")
    assert tiers.set(KEY, bytes(bytearray(data)), 3600)  # equal bytes, another object
    again = answers.lookup(KEY, Directive())
    assert first is not None and again is not None and again[0] is first[0]
    _put(tiers, KEY, b'{"n":1}', clock.now + 1)  # the same answer, stored a second later
    later = answers.lookup(KEY, Directive())
    assert later is not None and later[0] is not first[0] and later[0].created == clock.now + 1


def test_a_kept_entry_still_expires() -> None:
    answers, tiers, clock = _cache()
    _put(tiers, KEY, b'{"n":1}', clock.now, ttl=60)
    assert _body(answers.lookup(KEY, Directive())) == b'{"n":1}'
    clock.now += 61  # the entry's own TTL, not L1's (an hour here)
    assert answers.lookup(KEY, Directive()) is None


def test_large_entries_and_cold_keys_are_not_kept() -> None:
    answers, tiers, clock = _cache()
    large = b'"' + b"x" * DECODED_MAX_BYTES + b'"'
    _put(tiers, KEY, large, clock.now)
    first, second = answers.lookup(KEY, Directive()), answers.lookup(KEY, Directive())
    assert first is not None and second is not None
    assert second[0] == first[0] and second[0] is not first[0]

    keys = [f"llmgate:v1:{i:064x}" for i in range(DECODED_KEYS + 1)]
    for key in keys:
        _put(tiers, key, b'{"n":3}', clock.now)
    served = [answers.lookup(key, Directive()) for key in keys]
    again = answers.lookup(keys[0], Directive())  # pushed out by the DECODED_KEYS after it
    assert served[0] is not None and again is not None and again[0] is not served[0][0]
    last = answers.lookup(keys[-1], Directive())
    assert last is not None and served[-1] is not None and last[0] is served[-1][0]
