"""In-process LRU cache bounded in bytes, with a TTL per entry. No I/O here.

The size of an entry is its key plus its value (Python object overhead is not counted, so
leave headroom when sizing ``max_bytes``). A value above ``max_bytes / 8`` is refused: one
huge answer must not flush the whole level. One lock guards everything; nothing under it can
block or switch greenlets. It is the thread's own lock, not the one gevent's patching puts in
``threading`` (a Python object whose acquire and release cost a cache hit ~2 %, bench/HISTORY.md
"Cache hits near the floor's"): no greenlet can find it held, since none switches under it,
and a real thread still waits for it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gevent.monkey import get_original

from app.store.backends import check_value, clamp_ttl, validate_key

_allocate_lock = get_original("_thread", "allocate_lock")


class MemoryBackend:
    def __init__(
        self,
        max_bytes: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        name: str = "l1",
    ) -> None:
        if max_bytes < 8:
            raise ValueError("max_bytes must be at least 8")
        self.name = name
        self.max_bytes = max_bytes
        self.max_value_bytes = max_bytes // 8
        self._clock = clock
        self._lock = _allocate_lock()
        # key -> (value, expires_at); oldest use first
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0
        self._counts = dict.fromkeys(("hits", "misses", "sets", "errors", "too_large"), 0)
        self._counts["evictions"] = 0

    # -- Backend --------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        validate_key(key)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[1] <= self._clock():
                self._remove(key)
                entry = None
            if entry is None:
                self._counts["misses"] += 1
                return None
            self._entries.move_to_end(key)
            self._counts["hits"] += 1
            return entry[0]

    def lookup(self, key: str) -> bytes | None:
        """``get``: this process's memory always answers."""
        return self.get(key)

    def set(self, key: str, value: bytes, ttl: int) -> bool:
        return self._store(key, value, ttl, only_if_absent=False)

    def add(self, key: str, value: bytes, ttl: int) -> bool:
        return self._store(key, value, ttl, only_if_absent=True)

    def delete(self, key: str, *, force: bool = False) -> None:
        validate_key(key)
        with self._lock:
            self._remove(key)

    def touch(self, key: str, ttl: int) -> bool:
        """Give ``key`` a new lifetime; False when it is not (or no longer) there."""
        validate_key(key)
        with self._lock:
            entry = self._entries.get(key)
            now = self._clock()
            if entry is None or entry[1] <= now:
                return False
            self._entries[key] = (entry[0], now + clamp_ttl(ttl))
            return True

    def close(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        """Counters only (they never go down); see ``used_bytes`` and ``len()`` for gauges."""
        with self._lock:
            return dict(self._counts)

    def errors(self) -> int:
        return self._counts["errors"]

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    # -- internals (lock held) ------------------------------------------------------------
    def _store(self, key: str, value: bytes, ttl: int, *, only_if_absent: bool) -> bool:
        validate_key(key)
        value = check_value(value)
        ttl = clamp_ttl(ttl)
        with self._lock:
            now = self._clock()
            expires_at = now + ttl
            current = self._entries.get(key)
            if current is not None and current[1] <= now:
                self._remove(key)
                current = None
            if only_if_absent and current is not None:
                return False
            if len(value) > self.max_value_bytes:
                self._counts["too_large"] += 1
                # Like Memcached: a failed set leaves no stale older value behind.
                if not only_if_absent:
                    self._remove(key)
                return False
            self._remove(key)
            self._entries[key] = (value, expires_at)
            self._bytes += len(key) + len(value)
            self._counts["sets"] += 1
            while self._bytes > self.max_bytes:
                old_key, _ = next(iter(self._entries.items()))
                self._remove(old_key)
                self._counts["evictions"] += 1
            return True

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(key) + len(entry[0])
