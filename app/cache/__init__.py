"""The response cache: two levels behind one interface.

    policy.py   pure: what is cacheable, the caller's controls, TTL with jitter
    entry.py    pure: a stored answer and its byte format
    shapes.py   pure: stream events -> completion, stream replay, shared shape checks
    chunks.py   pure: completion -> stream events
    backends.py the Backend contract (bytes in, bytes out, every failure a miss)
    memory.py   L1: per-worker LRU bounded in bytes
    memcached.py L2: pymemcache HashClient over the Memcached pool
    guarded_client.py the pymemcache clients L2 runs on: guarded connections, pipelines
    node_breaker.py pure: which Memcached nodes to skip after a failure, and who probes
    discovery.py the Memcached nodes of a DNS name, re-resolved (dns+name:port)
    counters.py the per-key limit counters (app/tenancy/limits.py) in Memcached
    log_store.py resumable streams' logs in Memcached (app/resume/)
    tiered.py   L1 in front of L2
    store.py    entries in and out of the tiers, the cross-process lease

`build_answer_cache` is called by the app factory inside the worker, after gevent patched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from app.core.config import Settings

if TYPE_CHECKING:  # the package itself imports nothing heavy: its pure modules stay pure
    from app.cache.log_store import LogStore
    from app.cache.memcached import MemcachedBackend
    from app.cache.memory import MemoryBackend
    from app.cache.store import AnswerCache
    from app.observe.metrics import Metrics


def build_answer_cache(settings: Settings, metrics: Metrics | None = None) -> AnswerCache | None:
    if settings.cache_mode == "off":
        return None
    from app.cache.memory import MemoryBackend
    from app.cache.store import AnswerCache
    from app.cache.tiered import TieredCache

    l1 = MemoryBackend(settings.cache_l1_bytes, name="l1")
    l2 = memcached_client(
        settings, "l2", max_value_bytes=settings.cache_max_entry_bytes, metrics=metrics
    )
    tiers = TieredCache(l1, l2, l1_ttl=settings.cache_l1_ttl_s)
    return AnswerCache(tiers, settings, shared=l2 is not None, metrics=metrics)


def build_resume_store(
    settings: Settings, metrics: Metrics | None = None
) -> LogStore | MemoryBackend | None:
    """Where resumable streams' logs are kept (docs/streams.md): Memcached, so any worker of
    any instance can serve a resume; without it each worker's memory (a resume must then
    reach the same worker). None when resuming is off."""
    if settings.resume_window_s <= 0:
        return None
    from app.cache.log_store import LogStore
    from app.cache.memory import MemoryBackend

    client = memcached_client(settings, "resume", metrics=metrics)
    return LogStore(client) if client is not None else MemoryBackend(256 << 20, name="resume")


def memcached_client(
    settings: Settings,
    name: str,
    *,
    max_value_bytes: int | None = None,
    metrics: Metrics | None = None,
) -> MemcachedBackend | None:
    """A client of the Memcached nodes of LLMGATE_MEMCACHED, fixed ``host:port`` entries and
    ``dns+name:port`` names alike (a name's addresses looked up again and again, so the
    ring follows the nodes as they come and go); None when there are none. ``name``: the
    client's, in its metrics and log lines (the answer cache's ``l2``, the key limits'
    ``limits``, resumable streams' ``resume``), where its nodes' changes are counted."""
    from app.cache.memcached import DEFAULT_MAX_VALUE_BYTES, MemcachedBackend

    nodes, names = settings.memcached_nodes, settings.memcached_dns
    if not nodes and not names:
        return None
    client = MemcachedBackend(
        nodes,
        connect_timeout=settings.memcached_connect_timeout_s,
        timeout=settings.memcached_timeout_s,
        dead_timeout=settings.memcached_retry_s,
        max_value_bytes=DEFAULT_MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes,
        name=name,
        discovered=bool(names),
        on_event=None if metrics is None else _node_events(metrics, name),
    )
    if names:
        from app.cache.discovery import NodeWatcher

        # Lives as long as the worker: the ring follows the names' addresses.
        client.watcher = NodeWatcher(
            nodes, names, client.set_nodes, every_s=settings.memcached_dns_refresh_s
        ).start()
    return client


def _node_events(metrics: Metrics, name: str) -> Callable[[str], None]:
    """The counter of the client ``name``'s nodes' changes (dropped, failed, back)."""
    events = metrics.memcached_node_events
    return lambda event: events.labels(name, event).inc()
