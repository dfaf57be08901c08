"""The Memcached plumbing beneath the stages that keep things in it, and the in-process
backend that stands in for it. Its users: the response cache (app/cache/), the per-key limit
counters (app/tenancy/limits.py) and resumable streams' logs (app/resume/).

    backends.py pure: the Backend contract (bytes in, bytes out, every failure a miss)
    memory.py   the in-process LRU bounded in bytes (the cache's L1; logs without Memcached)
    memcached.py the client: pymemcache's HashClient over the Memcached nodes, failing open
    parts.py    pure: values of 1 MiB or more as parts with a manifest
    guarded_client.py the pymemcache clients it runs on: guarded connections, pipelines
    node_breaker.py pure: which Memcached nodes to skip after a failure, and who probes
    discovery.py the Memcached nodes of a DNS name, re-resolved (dns+name:port)
    counters.py the per-key limit counters' commands (app/tenancy/limits.py) in Memcached
    log_store.py resumable streams' logs in Memcached (app/resume/)
    spend_rows.py pure: a settled call's row in the spend ledger, and its columns
    spend_db.py the spend ledger's database (SQLite or PostgreSQL), its schema and queries
    spend_ledger.py the ledger of one worker: its writer thread, and reads off the loop

The clients are built by the app factory inside the worker, after gevent patched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from app.core.config import Settings

if TYPE_CHECKING:  # the package itself imports nothing heavy: its pure modules stay pure
    from app.observe.metrics import Metrics
    from app.store.log_store import LogStore
    from app.store.memcached import MemcachedBackend
    from app.store.memory import MemoryBackend
    from app.store.spend_ledger import SpendLedger


def build_resume_store(settings: Settings, metrics: Metrics) -> LogStore | MemoryBackend | None:
    """Where resumable streams' logs are kept (docs/streams.md): Memcached, so any worker of
    any instance can serve a resume; without it each worker's memory (a resume must then
    reach the same worker). None when resuming is off."""
    if settings.resume_window_s <= 0:
        return None
    from app.store.log_store import LogStore
    from app.store.memory import MemoryBackend

    client = memcached_client(settings, "resume", metrics=metrics)
    return LogStore(client) if client is not None else MemoryBackend(256 << 20, name="resume")


def build_spend_ledger(settings: Settings, metrics: Metrics) -> SpendLedger | None:
    """The spend ledger of LLMGATE_LEDGER_URL, when there is one and gateway keys are on:
    its writer thread starts here, inside the worker."""
    if not settings.ledger or not settings.keys_file:
        return None
    from app.store.spend_ledger import SpendLedger

    return SpendLedger(
        settings.ledger,
        metrics,
        flush_s=settings.ledger_flush_s,
        batch=settings.ledger_batch,
        capacity=settings.ledger_queue,
        retention_days=settings.ledger_retention_days,
        read_timeout_s=settings.ledger_read_timeout_s,
    )


def memcached_client(
    settings: Settings,
    name: str,
    *,
    max_value_bytes: int | None = None,
    metrics: Metrics,
) -> MemcachedBackend | None:
    """A client of the Memcached nodes of LLMGATE_MEMCACHED, fixed ``host:port`` entries and
    ``dns+name:port`` names alike (a name's addresses looked up again and again, so the
    ring follows the nodes as they come and go); None when there are none. ``name``: the
    client's, in its metrics and log lines (the answer cache's ``l2``, the key limits'
    ``limits``, resumable streams' ``resume``), where its nodes' changes are counted."""
    from app.store.memcached import DEFAULT_MAX_VALUE_BYTES, MemcachedBackend

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
        on_event=_node_events(metrics, name),
    )
    if names:
        from app.store.discovery import NodeWatcher

        # Lives as long as the worker: the ring follows the names' addresses.
        client.watcher = NodeWatcher(
            nodes, names, client.set_nodes, every_s=settings.memcached_dns_refresh_s
        ).start()
    return client


def _node_events(metrics: Metrics, name: str) -> Callable[[str], None]:
    """The counter of the client ``name``'s nodes' changes (dropped, failed, back)."""
    events = metrics.memcached_node_events
    return lambda event: events.labels(name, event).inc()
