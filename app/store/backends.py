"""The cache storage contract: bytes in, bytes out, and trouble is a miss. No I/O here.

A backend knows nothing about HTTP or OpenAI. Every backend (in-process LRU, Memcached, the
two tiered together) passes one contract suite (tests/integration/test_cache_backends.py).

Rules every backend keeps:

- ``get`` returns the stored bytes or None; any failure reads as None (fail open,
  docs/conventions.md: "a cache failure is a miss, not an error").
- ``set`` returns False when the value was not stored (too large, node down, timeout).
- ``add`` returns True only when the key was absent and now holds the value: a lease.
- A key that breaks the rules below is a programming error: ``ValueError``, raised at once.
- TTLs are whole seconds, at least 1, clamped below Memcached's 30-day limit (a larger
  number is read by Memcached as an absolute Unix time and expires at once).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

MAX_KEY_LENGTH = 200  # Memcached allows 250; the rest is room for part suffixes
MAX_TTL_S = 2_592_000 - 1  # Memcached reads 2,592,000 and above as a Unix timestamp

COUNTERS = ("hits", "misses", "sets", "errors", "too_large")


@runtime_checkable
class Backend(Protocol):
    """What the gateway's cache layer needs from a store."""

    name: str

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes, ttl: int) -> bool: ...

    def add(self, key: str, value: bytes, ttl: int) -> bool: ...

    def delete(self, key: str, *, force: bool = False) -> None:
        """Remove ``key``. ``force``: try even a node being skipped after a failure (a lease
        release: others wait on it, and the node was healthy when the lease was taken)."""

    def close(self) -> None: ...

    def stats(self) -> dict[str, int]: ...

    def errors(self) -> int:
        """``stats()["errors"]`` alone: read after every cache operation, without a copy."""


def validate_key(key: str) -> str:
    """The key itself, or ValueError: ASCII, 1..200 characters, no spaces or control bytes."""
    if not isinstance(key, str):
        raise ValueError(f"cache key must be str, not {type(key).__name__}")
    if not 0 < len(key) <= MAX_KEY_LENGTH:
        raise ValueError(f"cache key length {len(key)} is not within 1..{MAX_KEY_LENGTH}")
    # Characters 33..126: ASCII, printable (no control byte, no DEL) and no space, each
    # checked in C (every lookup, a cache hit's too, passes here).
    if not (key.isascii() and key.isprintable()) or " " in key:
        raise ValueError(f"cache key {key[:40]!r} has a space, control or non-ASCII character")
    return key


def clamp_ttl(ttl: int) -> int:
    """Whole seconds in 1..MAX_TTL_S (0 means "forever" to Memcached; we never ask for that)."""
    return max(1, min(int(ttl), MAX_TTL_S))


def check_value(value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"cache values are bytes, not {type(value).__name__}")
    return bytes(value)
