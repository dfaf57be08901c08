"""Two cache levels in front of each other: in-process L1, shared L2 (Memcached). No I/O here.

A read tries L1, then L2; an L2 hit is copied into L1 for ``l1_ttl`` seconds (the remaining
TTL of the L2 item is unknown, so L1 may keep a copy a little past the L2 expiry: at most
``l1_ttl``, keep it short). A write goes to both, L1 for at most ``l1_ttl``. Leases (``add``,
``get_shared``) must be shared across processes, so they live in L2 only and never enter L1;
without an L2 they fall back to L1.
"""

from __future__ import annotations

from app.store.backends import Backend, validate_key


class TieredCache:
    name = "tiered"

    def __init__(self, l1: Backend, l2: Backend | None, *, l1_ttl: int) -> None:
        if l1_ttl < 1:
            raise ValueError("l1_ttl must be at least 1 second")
        if l2 is not None and l2.name == l1.name:
            raise ValueError("the two levels need different names (they prefix the stats)")
        self.l1 = l1
        self.l2 = l2
        self.l1_ttl = l1_ttl

    def get(self, key: str) -> tuple[bytes, str] | None:
        """The value and the name of the level that served it, or None."""
        value = self.l1.get(key)
        if value is not None:
            return value, self.l1.name
        if self.l2 is None:
            return None
        value = self.l2.get(key)
        if value is None:
            return None
        self.l1.set(key, value, self.l1_ttl)
        return value, self.l2.name

    def get_shared(self, key: str) -> bytes | None:
        """Read the shared level only, copying nothing into L1: for markers such as leases,
        whose truth is what other processes see now (a stale L1 copy would make waiters wait
        on a lease that Memcached no longer holds, or cannot say it holds)."""
        if self.l2 is None:
            return self.l1.get(key)
        validate_key(key)
        return self.l2.get(key)

    def set(self, key: str, value: bytes, ttl: int) -> bool:
        """True when at least one level stored the value."""
        stored_l2 = self.l2.set(key, value, ttl) if self.l2 is not None else False
        stored_l1 = self.l1.set(key, value, min(ttl, self.l1_ttl))
        return stored_l1 or stored_l2

    def add(self, key: str, value: bytes, ttl: int) -> bool:
        if self.l2 is None:
            return self.l1.add(key, value, ttl)
        validate_key(key)
        return self.l2.add(key, value, ttl)

    def delete(self, key: str, *, force: bool = False) -> None:
        if self.l2 is not None:
            self.l2.delete(key, force=force)
        self.l1.delete(key)

    def close(self) -> None:
        if self.l2 is not None:
            self.l2.close()
        self.l1.close()

    def errors(self) -> int:
        return self.l1.errors() + (self.l2.errors() if self.l2 is not None else 0)

    def stats(self) -> dict[str, int]:
        """Each level's counters, prefixed with its name: ``l1_hits``, ``l2_errors``, ..."""
        merged = {f"{self.l1.name}_{k}": v for k, v in self.l1.stats().items()}
        if self.l2 is not None:
            merged.update({f"{self.l2.name}_{k}": v for k, v in self.l2.stats().items()})
        return merged
