"""The Memcached backend: its nodes through pymemcache's HashClient. Fails open.

With app/store/guarded_client.py, the only module that talks to pymemcache (app/layers.toml),
whose clients it runs; the limit counters
(app/store/counters.py) send their commands through it too (``run``). Built in the worker
after gevent patched ``socket`` and ``threading``; no socket opens before the first command.
What pymemcache does not give us, and how it is handled here (docs/stack-notes.md):

- No timeouts by default: ``connect_timeout`` and ``timeout`` are always passed.
- HashClient writes with ``noreply`` by default (a 2 MB set "succeeded" and stored nothing):
  ``default_noreply=False`` and ``noreply=False`` on every write.
- Pickle is never used: a bytes-only serde; the item's flags say what the item is (a whole
  value, a manifest, a part). Anything else reads as a miss.
- Items of 1 MiB or more are rejected by Memcached: larger values are split into parts
  with a manifest (their layout: app/store/parts.py); a missing or mismatching part is a miss.
- Node health is ours, not HashClient's (what its own would do: app/store/node_breaker.py).
  Our client (app/store/guarded_client.py) turns ``OSError`` and unexpected closes into
  ``NodeFailure``; a ``NodeBreaker`` skips a failed node for a quarter of a second, then
  lets one probe, doubling the skip after each failed probe up to ``dead_timeout`` seconds.
- A node that dropped a pooled connection (EOF, reset, broken pipe: what a restart leaves)
  is not skipped for it: its idle connections are closed, a read runs again at once on a new
  one (reading twice changes nothing; a write is not repeated, lest an ``add`` or ``incr``
  count twice: it fails, as a miss, unless it was found dropped before it was sent, as a
  pipeline of counts looks first), and whether the node is up is left to that new
  connection. Before, each stale connection in the pool failed in its turn and skipped the
  node for ``dead_timeout`` each time, for minutes after a restart.
- Each change of a node's state is said once, at WARNING (the ``llmgate`` logger's handler,
  app/factory.py, prints it in the worker's log) and counted (``on_event``): ``dropped``
  (it closed our connections: restarted, or gone), ``failed`` (skipped from now), ``back``
  (answering again).
- A command interrupted mid-reply (``gevent.Timeout``) poisons its connection; the backend
  destroys it from its pool (app/store/guarded_client.py says why pymemcache does not).
- ``max_pool_size`` raises instead of waiting: a semaphore of ``pool_size`` slots (each call
  holds one connection at a time) makes callers wait up to ``timeout`` for a slot first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import gevent.lock
from pymemcache.exceptions import MemcacheError

from app.core.reasons import reason
from app.store.backends import check_value, clamp_ttl, validate_key
from app.store.guarded_client import GuardedHashClient, NodeFailure, RememberedRing, node_name
from app.store.node_breaker import NodeBreaker
from app.store.parts import DEFAULT_PART_BYTES, read_manifest, split

if TYPE_CHECKING:
    from app.store.discovery import NodeWatcher

# Under the gateway's logger: its handler (app/factory.py) is the one the worker's log has.
log = logging.getLogger("llmgate.memcached")

T = TypeVar("T")

# Item flags (32 bits, opaque to Memcached): "lg" plus the item's kind. The low five bits
# stay clear: python-memcached and pymemcache's default serde read them as pickle, int, long,
# zlib and text, so another client that reads our items sees plain bytes, never a pickle.
FLAG_VALUE = 0x6C670100
FLAG_MANIFEST = 0x6C670200
FLAG_PART = 0x6C670300
FLAG_COUNTER = 0x6C670400  # a decimal counter for incr/decr (app/store/counters.py)

DEFAULT_MAX_VALUE_BYTES = 8 * 1024 * 1024

_FAILED: Any = object()  # a call that did not happen or did not finish


class Unavailable(Exception):
    """The node holding a key could not answer: whether the key is there is not known."""


class _BytesSerde:
    """Bytes only, never pickle; a read returns ``(flags, value)`` so the caller can check."""

    def serialize(self, key: bytes, value: Any) -> tuple[bytes, int]:
        if not isinstance(value, bytes):
            raise TypeError("memcached values are bytes")
        return value, FLAG_VALUE

    def deserialize(self, key: bytes, value: bytes, flags: int) -> tuple[int, bytes]:
        return flags, value


class MemcachedBackend:
    def __init__(
        self,
        nodes: list[tuple[str, int]],
        *,
        connect_timeout: float = 0.1,
        timeout: float = 0.2,
        dead_timeout: float = 10.0,
        pool_size: int = 32,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        part_bytes: int = DEFAULT_PART_BYTES,
        name: str = "l2",
        discovered: bool = False,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        """``discovered``: the nodes come (also) from DNS (app/store/discovery.py, through
        ``set_nodes``), so the ring may start, or become, empty: every call is a miss then.
        ``on_event``: told ``dropped``, ``failed`` or ``back`` once per change of a node."""
        if not nodes and not discovered:
            raise ValueError("MemcachedBackend needs at least one node")
        if not 0 < part_bytes < 1024 * 1024 - 1024:
            raise ValueError("part_bytes must stay under Memcached's 1 MiB item limit")
        self.name = name
        self.nodes = [(host, int(port)) for host, port in nodes]
        self.timeout = timeout
        self.max_value_bytes = max_value_bytes
        self.part_bytes = part_bytes
        self._client = GuardedHashClient(
            self.nodes,
            hasher=RememberedRing,
            serde=_BytesSerde(),
            connect_timeout=connect_timeout,
            timeout=timeout,
            no_delay=True,
            use_pooling=True,
            max_pool_size=pool_size,
            ignore_exc=False,  # errors must reach us: we count them and run the breaker
            default_noreply=False,
        )
        self._breaker = NodeBreaker(dead_timeout, time.monotonic)
        self._on_event = on_event
        # node -> when it was last found to have dropped our connections (time.monotonic):
        # a connection opened before that was dropped in the same go, and is not news.
        self._dropped_at: dict[str, float] = {}
        self.watcher: NodeWatcher | None = None  # the DNS lookups feeding set_nodes, if any
        # gevent's semaphore: threading's is Python over a Condition (3.1 us to take and give
        # back a free slot, and a new lock per waiter once all are taken, as at a saturated
        # worker); gevent's takes 0.17 us and parks a waiter as any greenlet wait does.
        self._slots = gevent.lock.BoundedSemaphore(pool_size)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("hits", "misses", "sets", "errors", "too_large", "dead_skips", "parts", "busy"), 0
        )

    # -- Backend --------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        value = self._get(key)
        return None if value is _FAILED else value

    def lookup(self, key: str) -> bytes | None:
        """``get``, but a node that could not answer (down, skipped, no connection free)
        raises ``Unavailable`` instead of reading as a miss: for a reader to whom "not
        there" and "cannot tell" must differ (a resume, app/resume/service.py)."""
        value = self._get(key)
        if value is _FAILED:
            raise Unavailable(key)
        return value

    def _get(self, key: str) -> Any:
        validate_key(key)
        head = self._call([key], lambda: self._client.get(key), _FAILED, read=True)
        value = None
        if head is _FAILED:
            value = _FAILED
        elif head is not None:
            flags, data = head
            if flags == FLAG_VALUE:
                value = data
            elif flags == FLAG_MANIFEST:
                value = self._get_parts(key, data)
        self._count("hits" if value is not None and value is not _FAILED else "misses")
        return value

    def set(self, key: str, value: bytes, ttl: int) -> bool:
        return self._store(key, value, ttl, only_if_absent=False)

    def add(self, key: str, value: bytes, ttl: int) -> bool:
        return self._store(key, value, ttl, only_if_absent=True)

    def delete(self, key: str, *, force: bool = False) -> None:
        """Parts of a split value are left to expire with their TTL (no manifest, no reader).
        ``force`` tries a node the breaker is skipping (bounded by the timeouts as ever)."""
        validate_key(key)
        self._call([key], lambda: self._client.delete(key, noreply=False), _FAILED, force=force)

    def set_nodes(self, nodes: list[tuple[str, int]]) -> None:
        """Make the ring exactly ``nodes``: new ones join, missing ones leave with their
        connections closed. Consistent hashing moves only the keys of the nodes that changed."""
        wanted = [(host, int(port)) for host, port in nodes]
        for node in wanted:
            if node not in self.nodes:
                self._client.add_server(node)
        for node in self.nodes:
            if node not in wanted:
                self._client.drop_server(node)
                self._breaker.forget(node_name(node))
                self._dropped_at.pop(node_name(node), None)
        self.nodes = wanted

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        self._client.close()

    def stats(self) -> dict[str, int]:
        """hits, misses, sets, errors, too_large, dead_skips, parts (items moved as parts of
        split values), busy (no pool slot within ``timeout``)."""
        with self._lock:
            return dict(self._counts)

    def errors(self) -> int:
        return self._counts["errors"]

    def dead_nodes(self) -> list[str]:
        """Nodes being skipped right now (for health reporting)."""
        return self._breaker.dead()

    # -- other items on the same nodes (the limit counters: app/store/counters.py) ---------
    def run(
        self, keys: list[str], commands: Callable[[Any], T], failed: T, *, read: bool = False
    ) -> T:
        """``commands(client)`` on ``keys``, with the pymemcache client (a read gives ``(flags,
        bytes)``), run as every call here: ``failed`` when a node they need is skipped, no
        connection is free within ``timeout`` or anything fails (counted, the node marked).
        ``read``: they only read, and may run again on a dropped connection."""
        for key in keys:
            validate_key(key)
        return self._call(keys, lambda: commands(self._client), failed, read=read)

    def node_of(self, key: str) -> str | None:
        """The node ``key`` lives on (None while the ring is empty): the commands of one
        ``run`` that go to one node can be pipelined (``GuardedHashClient.pipeline``)."""
        node: str | None = self._client.hasher.get_node(key)
        return node

    # -- storing ----------------------------------------------------------------------------
    def _store(self, key: str, value: bytes, ttl: int, *, only_if_absent: bool) -> bool:
        validate_key(key)
        value = check_value(value)
        ttl = clamp_ttl(ttl)
        if len(value) > self.max_value_bytes:
            self._count("too_large")
            if not only_if_absent:  # like Memcached: a failed set leaves no older value
                self.delete(key)
            return False
        if len(value) <= self.part_bytes:
            write = self._client.add if only_if_absent else self._client.set
            stored = self._call(
                [key],
                lambda: write(key, value, expire=ttl, noreply=False, flags=FLAG_VALUE),
                False,
                # A set, run twice, leaves what it leaves once (an add may not: it is not).
                read=not only_if_absent,
            )
        else:
            stored = self._store_parts(key, value, ttl, only_if_absent)
        if stored:
            self._count("sets")
        return bool(stored)

    def _store_parts(self, key: str, value: bytes, ttl: int, only_if_absent: bool) -> bool:
        manifest, chunks = split(value, self.part_bytes)
        parts = dict(zip(manifest.part_keys(key), chunks, strict=True))
        head_bytes = manifest.to_bytes()

        def write() -> bool:
            # Parts first: a reader never finds a manifest whose parts were not yet written.
            if self._client.set_many(parts, expire=ttl, noreply=False, flags=FLAG_PART):
                return False  # some part NOT_STORED
            head = self._client.add if only_if_absent else self._client.set
            return bool(head(key, head_bytes, expire=ttl, noreply=False, flags=FLAG_MANIFEST))

        stored = self._call([key, *parts], write, False)
        if stored:
            self._count("parts", manifest.count)
        return stored

    def _get_parts(self, key: str, data: bytes) -> bytes | None:
        manifest = read_manifest(data, -(-self.max_value_bytes // self.part_bytes))
        if manifest is None:
            self._count("errors")
            return None
        part_keys = manifest.part_keys(key)
        found = self._call(part_keys, lambda: self._client.get_many(part_keys), _FAILED, read=True)
        if found is _FAILED:
            return None
        chunks = []
        for part_key in part_keys:
            item = found.get(part_key)
            if item is None or item[0] != FLAG_PART:
                return None  # evicted or never written: the whole value is a miss
            chunks.append(item[1])
        value = manifest.join(chunks)
        if value is None:
            self._count("errors")
            return None
        self._count("parts", manifest.count)
        return value

    # -- calling pymemcache -----------------------------------------------------------------
    def _call(
        self,
        keys: list[str],
        op: Callable[[], T],
        failed: T,
        *,
        force: bool = False,
        read: bool = False,
    ) -> T:
        """Run ``op`` unless a node it needs is being skipped (``force``: run it anyway); any
        failure returns ``failed``. ``read``: ``op`` has the same effect run twice as once (a
        read, a set of a whole value, a touch), so it runs again once when its connection was
        found dropped."""
        nodes = {self._client.hasher.get_node(k) for k in keys}
        if not force and not self._breaker.allow(nodes):
            self._count("dead_skips")
            return failed
        if not self._slots.acquire(timeout=self.timeout):
            self._count("busy")
            return failed
        try:
            result = self._attempt(op, read)
        except NodeFailure as exc:
            self._count("errors")
            if exc.dropped is None and self._breaker.failed(exc.node):
                why = reason(exc.__cause__) if exc.__cause__ is not None else "no reason given"
                log.warning("memcached node %s failed (%s); skipping it", exc.node, why)
                self._event("failed")
            return failed
        except MemcacheError as exc:  # the node answered, with an error (SERVER_ERROR ...)
            self._count("errors")
            self._nodes_answered(nodes)
            log.debug("memcached call failed: %r", exc)
            return failed
        except Exception as exc:
            self._count("errors")
            log.warning("memcached call failed unexpectedly: %r", exc)
            return failed
        except BaseException:
            self._discard_poisoned()
            raise
        finally:
            self._slots.release()
        self._nodes_answered(nodes)
        return result

    def _attempt(self, op: Callable[[], T], read: bool) -> T:
        """``op``; once more when the node dropped its connection (on a new one: the idle
        ones were closed), if it is a read or was found dropped before it was sent. A write
        that may have been sent is not repeated: it fails as it is."""
        try:
            return op()
        except NodeFailure as exc:
            if exc.dropped is None:
                raise
            self._dropped(exc.node, exc.dropped, exc.__cause__)
            if not (read or exc.unsent):
                raise
        return op()

    def _dropped(self, node: str, opened_at: float, cause: BaseException | None) -> None:
        """``node`` dropped a connection opened at ``opened_at``: its idle ones, as old, are
        closed, and the next command on it connects anew (which tells whether it is up).
        Said once for all the connections one restart dropped: those opened before it was
        first noticed."""
        self._client.close_idle(node)
        if opened_at > self._dropped_at.get(node, float("-inf")):
            self._dropped_at[node] = time.monotonic()
            why = reason(cause) if cause is not None else "no reason given"
            log.warning(
                "memcached node %s closed our connections (%s; restarted?); reconnecting",
                node,
                why,
            )
            self._event("dropped")

    def _nodes_answered(self, nodes: Iterable[str]) -> None:
        for node in self._breaker.succeeded(nodes):
            log.warning("memcached node %s is back", node)
            self._event("back")

    def _event(self, event: str) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def _discard_poisoned(self) -> None:
        """Destroy pool members left behind by an interrupted call (pool.py keeps them)."""
        for pooled in list(self._client.clients.values()):
            pool = pooled.client_pool
            for client in pool.used:
                if getattr(client, "poisoned", False):
                    pool.destroy(client)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n
