"""Which Memcached nodes to skip: a failed node is skipped for a quarter of a second, then
one caller probes it; each failed probe doubles the skip, up to ``dead_timeout`` seconds. No
I/O here: the clock is passed in, the caller logs.

Short first: the commonest failure of a node that was answering is a restart (a pod
rescheduled, an upgrade), back within a second or two, and every second it is skipped is a
second of misses, of limits counted nowhere, of resumes that cannot be read. Doubling: a
node that stays down costs one probe (at most a connect timeout; a refused connection costs
nothing) four times a second at first, then one every ``dead_timeout``.

The Memcached client (app/store/memcached.py) asks ``allow`` before a command and reports
how it went. While a node is skipped, a command that needs it fails at once (a cache miss,
a limit counter that cannot be read) instead of each caller waiting out a timeout on it.
When the time is up, the first caller to ask becomes the probe and the others keep
skipping until its answer: one command pays for a node still down, not every caller at once.

pymemcache's HashClient has machinery of its own, which the client keeps from engaging: it
marks a node failed only on ``OSError``, returns a silent default while it waits
``retry_timeout``, retries the node on live traffic ``retry_attempts`` times (each costing
a full timeout), then removes it from the hash ring, moving its keys to other nodes
(client/hash.py ``_safely_run_func``, ``_mark_failed_server``); its bookkeeping is unlocked
and its silent skips cannot be counted.

The state is locked: the client is shared by every greenlet of the worker and by the DNS
watcher's thread (app/store/discovery.py), and the lock is never held across I/O. While no
node is dead, a command takes no lock at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

FIRST_SKIP_S = 0.25


class NodeBreaker:
    """Per node: after a failure, skip it for ``FIRST_SKIP_S`` (or ``dead_timeout`` when
    shorter), then let one caller probe; each failed probe doubles the skip, up to
    ``dead_timeout``."""

    def __init__(self, dead_timeout: float, clock: Callable[[], float]) -> None:
        self.dead_timeout = dead_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._retry_at: dict[str, float] = {}
        self._skip: dict[str, float] = {}  # a dead node's current skip

    def allow(self, nodes: Iterable[str]) -> bool:
        """Whether a command on ``nodes`` may run now: no node is being skipped, or its time
        is up and this caller is the one that probes it."""
        if not self._retry_at:
            return True
        with self._lock:
            now = self._clock()
            due = [n for n in nodes if n in self._retry_at]
            if any(self._retry_at[n] > now for n in due):
                return False
            # This caller probes; the others keep skipping meanwhile, for as long as the node
            # was skipped: a probe that never reports (no connection slot, a connection
            # found dropped, the caller killed) does not hold the node back any longer.
            for node in due:
                self._retry_at[node] = now + self._skip.get(node, FIRST_SKIP_S)
            return True

    def failed(self, node: str) -> bool:
        """Mark the node dead (skipped twice as long as the last time, from FIRST_SKIP_S);
        True when it was alive until now."""
        with self._lock:
            was_alive = node not in self._retry_at
            last = self._skip.get(node)
            skip = min(self.dead_timeout, FIRST_SKIP_S if last is None else 2 * last)
            self._skip[node] = skip
            self._retry_at[node] = self._clock() + skip
            return was_alive

    def succeeded(self, nodes: Iterable[str]) -> list[str]:
        """The command on ``nodes`` was answered: the nodes among them that were dead are
        alive again (returned, for the caller to say so)."""
        if not self._retry_at:
            return []
        with self._lock:
            back = [node for node in nodes if self._retry_at.pop(node, None) is not None]
            for node in back:
                self._skip.pop(node, None)
            return back

    def forget(self, node: str) -> None:
        """The node left the ring."""
        with self._lock:
            self._retry_at.pop(node, None)
            self._skip.pop(node, None)

    def dead(self) -> list[str]:
        """The nodes being skipped right now, sorted."""
        with self._lock:
            now = self._clock()
            return sorted(n for n, at in self._retry_at.items() if at > now)
