"""The in-process LRU: eviction by bytes in least-recently-used order, TTL, size refusal.

The shared get/set/add/delete semantics are in the contract suite
(tests/integration/test_cache_backends.py); these are the L1-only properties.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from app.store.backends import MAX_TTL_S, Backend, clamp_ttl, validate_key
from app.store.memory import MemoryBackend
from tests.conftest import ROOT
from tests.support.clock import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


def test_is_a_backend() -> None:
    assert isinstance(MemoryBackend(1024), Backend)


def test_size_is_key_plus_value_and_lru_entry_goes_first(clock: Clock) -> None:
    cache = MemoryBackend(96, clock=clock)  # values up to 12 bytes
    for name in "abcd":
        assert cache.set(f"k{name}", name.encode() * 10, 60)  # 2 + 10 bytes each
    assert cache.used_bytes == 48 and len(cache) == 4
    assert cache.get("ka") == b"a" * 10  # ka is now the most recently used
    for name in "efgh":
        assert cache.set(f"k{name}", name.encode() * 10, 60)
    assert cache.used_bytes == 96  # exactly full: nothing evicted yet
    assert cache.set("ki", b"i" * 10, 60)  # one over: the least recently used goes
    assert cache.get("kb") is None
    assert cache.get("ka") == b"a" * 10
    assert cache.stats()["evictions"] == 1
    assert cache.set("kj", b"j" * 12, 60)  # 14 bytes: two 12-byte entries must go
    assert cache.get("kc") is None and cache.get("kd") is None
    assert cache.get("ke") == b"e" * 10
    assert cache.used_bytes <= 96


def test_replacing_a_value_updates_the_byte_count(clock: Clock) -> None:
    cache = MemoryBackend(800, clock=clock)
    cache.set("k", b"x" * 100, 60)
    cache.set("k", b"y" * 10, 60)
    assert cache.used_bytes == 11
    cache.delete("k")
    assert cache.used_bytes == 0 and len(cache) == 0


def test_ttl_follows_the_injected_clock(clock: Clock) -> None:
    cache = MemoryBackend(1024, clock=clock)
    cache.set("short", b"1", 1)
    cache.set("long", b"2", 30)
    clock.now += 0.999
    assert cache.get("short") == b"1"
    clock.now += 0.001
    assert cache.get("short") is None  # expires exactly at set time + ttl
    assert cache.get("long") == b"2"
    clock.now += 30
    assert cache.get("long") is None
    assert cache.used_bytes == 0  # expired entries leave when they are found


def test_add_succeeds_over_an_expired_entry(clock: Clock) -> None:
    cache = MemoryBackend(1024, clock=clock)
    assert cache.add("lease", b"a", 5)
    assert not cache.add("lease", b"b", 5)
    clock.now += 5
    assert cache.add("lease", b"c", 5)
    assert cache.get("lease") == b"c"


def test_values_over_an_eighth_are_refused_and_drop_the_older_value(clock: Clock) -> None:
    cache = MemoryBackend(800, clock=clock)
    assert cache.set("k", b"x" * 100, 60)  # exactly max_bytes / 8
    assert not cache.set("k", b"x" * 101, 60)
    assert cache.get("k") is None  # a failed set leaves no stale older value
    assert not cache.add("other", b"x" * 101, 60)
    assert cache.stats()["too_large"] == 2


def test_ttl_is_clamped_to_whole_seconds_within_memcached_range(clock: Clock) -> None:
    assert clamp_ttl(0) == 1 and clamp_ttl(-5) == 1
    assert clamp_ttl(10**9) == MAX_TTL_S < 2_592_000
    cache = MemoryBackend(1024, clock=clock)
    cache.set("k", b"v", 0)
    clock.now += 0.5
    assert cache.get("k") == b"v"  # 0 became 1 s, not "already expired" or "forever"


@pytest.mark.parametrize("key", ["", "a b", "tab\there", "é", "x" * 201, "nul\x00", "del\x7f"])
def test_invalid_keys_are_programming_errors(key: str) -> None:
    cache = MemoryBackend(1024)
    with pytest.raises(ValueError):
        validate_key(key)
    with pytest.raises(ValueError):
        cache.get(key)
    with pytest.raises(ValueError):
        cache.set(key, b"v", 1)


def test_a_key_may_hold_exactly_the_characters_33_to_126() -> None:
    """Every code point, alone and inside an otherwise valid key."""
    for point in range(0x110000):
        ch = chr(point)
        for key in (ch, f"llmgate:{ch}:0"):
            try:
                validate_key(key)
                valid = True
            except ValueError:
                valid = False
            assert valid == (33 <= point <= 126), (point, key)


def test_counters(clock: Clock) -> None:
    cache = MemoryBackend(1024, clock=clock)
    cache.get("a")
    cache.set("a", b"1", 10)
    cache.get("a")
    cache.add("a", b"2", 10)
    assert cache.stats() == {
        "hits": 1,
        "misses": 1,
        "sets": 1,
        "errors": 0,
        "too_large": 0,
        "evictions": 0,
    }


def test_byte_count_stays_exact_under_threads() -> None:
    cache = MemoryBackend(4096)

    def worker(n: int) -> None:
        for i in range(2000):
            key = f"k{(i * 7 + n) % 50}"
            if i % 3:
                cache.set(key, b"v" * (i % 90), 60)
            elif i % 5:
                cache.get(key)
            else:
                cache.delete(key)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(k) + len(v) for k, (v, _) in cache._entries.items())
    assert cache.used_bytes == total <= 4096


def test_its_lock_is_the_threads_own_in_a_patched_worker() -> None:
    # A gevent worker patches threading before it loads the app (gunicorn.conf.py): the L1's
    # lock stays the thread's own, whose acquire is a C call (bench/HISTORY.md, "Cache hits
    # near the floor's"), and still excludes a real thread.
    probe = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import threading, gevent.thread\n"
        "from app.store.memory import MemoryBackend\n"
        "b = MemoryBackend(1 << 20)\n"
        "assert isinstance(threading.Lock(), gevent.thread.LockType)\n"
        "print(type(b._lock).__module__, isinstance(b._lock, gevent.thread.LockType))\n"
        "b.set('k', b'v', 60)\n"
        "print(b.get('k'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split("\n")[:2] == ["_thread False", "b'v'"]
