"""Memcached nodes found by DNS: every A/AAAA address of a name, looked up again and again.

A Kubernetes headless Service resolves to the addresses of its ready pods, so a gateway
that re-reads the name follows the Memcached StatefulSet as it scales, with no restart
(LLMGATE_MEMCACHED=dns+memcached:11211, every LLMGATE_MEMCACHED_DNS_REFRESH_S). What the
lookups find is handed to ``apply`` (the backend's ``set_nodes``), only when it changed.

Rules: a name whose lookup fails keeps its last addresses (a DNS blip must not empty the
hash ring and turn every lookup into a miss at once); the watcher is a thread, i.e. a
greenlet in a gevent-patched worker, built inside the worker by the app factory. The
resolver is a parameter: tests give it names that resolve to several loopback addresses.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence

from app.core.names import looked_up_now

# Under the gateway's logger: its handler (app/factory.py) is the one the worker's log has.
log = logging.getLogger("llmgate.memcached")

Node = tuple[str, int]
Resolver = Callable[[str, int], list[Node]]


def resolve(name: str, port: int) -> list[Node]:
    """Every address of ``name`` (A and AAAA), with ``port``, sorted; OSError when none."""
    # Afresh, never the worker's kept answer (app/core/names.py): the point is to see a change.
    infos = looked_up_now(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return sorted({(str(info[4][0]), port) for info in infos})


class NodeWatcher:
    """Resolves ``names`` every ``every_s`` seconds and applies fixed + found nodes."""

    def __init__(
        self,
        fixed: Sequence[Node],
        names: Sequence[Node],
        apply: Callable[[list[Node]], None],
        *,
        every_s: float,
        resolver: Resolver = resolve,
    ) -> None:
        self.fixed = list(fixed)
        self.names = list(names)
        self.every_s = every_s
        self._apply = apply
        self._resolver = resolver
        self._found: dict[Node, list[Node]] = {name: [] for name in self.names}
        self._applied: list[Node] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def nodes(self) -> list[Node]:
        """The nodes applied last (fixed ones first, then each name's addresses)."""
        return list(self._applied or [])

    def refresh(self) -> bool:
        """Look every name up once; True when the node list changed (and was applied)."""
        for name, port in self.names:
            try:
                self._found[(name, port)] = self._resolver(name, port)
            except OSError as exc:
                log.warning("memcached: cannot resolve %s (%s); keeping its last nodes", name, exc)
        nodes = list(self.fixed)
        for found in self._found.values():
            nodes += [node for node in found if node not in nodes]
        if nodes == self._applied:
            return False
        if self._applied is not None:
            log.info("memcached nodes: %s", ", ".join(f"{h}:{p}" for h, p in nodes) or "none")
        self._applied = nodes
        self._apply(nodes)
        return True

    def start(self) -> NodeWatcher:
        """Resolve now (the ring is ready before the first request), then every ``every_s``."""
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="memcached-dns", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.refresh()
            except Exception:  # never let the watcher die: the ring would stop following
                log.exception("memcached: node refresh failed")
