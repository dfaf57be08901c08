"""The per-key limit counters in Memcached: app/tenancy/limits.py's ``Counters``, shared by
every worker of every instance. Never an exception: None when the nodes cannot be reached.

Each counter is one Memcached item holding a decimal number, flagged ``FLAG_COUNTER`` so
nothing reads it as a cached answer (nor an answer as a counter). Memcached's ``incr`` and
``decr`` are atomic on the node, which is what makes a limit hold across processes: each
call takes its share with one ``incr`` and sees the count its share made.

- ``incr`` on a missing item fails (NOT_FOUND) rather than creating it, so a counter is
  created with ``add`` of ``0`` and its TTL, then incremented. Of two processes creating it
  at once, one ``add`` fails and both increments count.
- ``decr`` stops at 0 (Memcached's rule, which ``MemoryCounters`` copies), and may leave the
  number space-padded: a read strips it.
- ``renew`` is one ``touch`` more: the stream slots' counter never rolls over, so each start
  gives it its whole TTL again (app/tenancy/limits.py ``streams``).

The commands of one call run together through the Memcached client (app/cache/memcached.py
``MemcachedBackend.run``): one connection, the node skipped while it is down, every failure
counted in the client's stats. The app factory gives the counters a client of their own,
on the cache's nodes with its timeouts.
"""

from __future__ import annotations

from typing import Any

from app.cache.backends import clamp_ttl
from app.cache.memcached import FLAG_COUNTER, MemcachedBackend


class MemcachedCounters:
    """The limit counters, over one Memcached client."""

    def __init__(self, memcached: MemcachedBackend) -> None:
        self.memcached = memcached

    def incr(self, key: str, delta: int, ttl: int, *, renew: bool = False) -> int | None:
        """Add ``delta`` to the counter ``key``, created at 0 to live ``ttl`` seconds when
        absent (``renew``: an existing counter's TTL starts again). The new value, or None
        when its node cannot be reached (counted)."""

        def commands(mc: Any) -> int | None:
            value = mc.incr(key, delta, noreply=False)
            if value is None:  # NOT_FOUND: create it; a racing creator's add just fails
                mc.add(key, b"0", expire=clamp_ttl(ttl), noreply=False, flags=FLAG_COUNTER)
                value = mc.incr(key, delta, noreply=False)
            elif renew:
                mc.touch(key, expire=clamp_ttl(ttl), noreply=False)
            return None if value is None else int(value)

        return self.memcached.run([key], commands, None)

    def decr(self, key: str, delta: int) -> int | None:
        """Take ``delta`` off the counter (Memcached stops at 0); None on failure."""

        def commands(mc: Any) -> int | None:
            value = mc.decr(key, delta, noreply=False)
            return 0 if value is None else int(value)

        return self.memcached.run([key], commands, None)

    def read(self, keys: list[str]) -> dict[str, int] | None:
        """The counters that exist among ``keys``; None when a node cannot be reached."""
        found: dict[str, tuple[int, bytes]] | None
        found = self.memcached.run(keys, lambda mc: mc.get_many(keys), None)
        if found is None:
            return None
        counts = {}
        for key, (flags, data) in found.items():
            text = data.strip()  # decr may leave the item space-padded
            if flags == FLAG_COUNTER and text.isdigit():
                counts[key] = int(text)
        return counts

    def close(self) -> None:
        self.memcached.close()
