"""The response cache: two levels behind one interface.

    policy.py   pure: what is cacheable, the caller's controls, TTL with jitter
    entry.py    pure: a stored answer and its byte format
    shapes.py   pure: stream events -> completion, stream replay, shared shape checks
    chunks.py   pure: completion -> stream events
    tiered.py   L1 in front of L2
    store.py    entries in and out of the tiers, the cross-process lease

The two levels are app/store/'s backends: L1 its in-process LRU (memory.py), L2 its
Memcached client (memcached.py).

`build_answer_cache` is called by the app factory inside the worker, after gevent patched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.config import Settings

if TYPE_CHECKING:  # the package itself imports nothing heavy: its pure modules stay pure
    from app.cache.store import AnswerCache
    from app.observe.metrics import Metrics


def build_answer_cache(settings: Settings, metrics: Metrics) -> AnswerCache | None:
    if settings.cache_mode == "off":
        return None
    from app.cache.store import AnswerCache
    from app.cache.tiered import TieredCache
    from app.store import memcached_client
    from app.store.memory import MemoryBackend

    l1 = MemoryBackend(settings.cache_l1_bytes, name="l1")
    l2 = memcached_client(
        settings, "l2", max_value_bytes=settings.cache_max_entry_bytes, metrics=metrics
    )
    tiers = TieredCache(l1, l2, l1_ttl=settings.cache_l1_ttl_s)
    return AnswerCache(tiers, settings, shared=l2 is not None, metrics=metrics)
