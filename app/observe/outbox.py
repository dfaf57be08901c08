"""An outbox: items handed from the worker's greenlets to one real OS thread that sends them
in batches. Nothing the sender does (encoding, connecting, waiting on a peer that never
answers) runs on the worker's gevent loop, and handing an item over never waits.

Why a thread of our own: under gevent's patch ``threading.Thread`` is a greenlet on the
worker's loop, so its CPU work (an OTLP batch's protobuf encoding: tens of ms for 512 spans)
delays every request of the worker. The thread here is started with the unpatched
``_thread`` (``gevent.monkey.get_original``). The two sides share a deque (``append`` and
``popleft`` are atomic) and two unpatched locks: a doorbell the greenlets ring when a batch
is full, and ``done``, released when the thread has finished. A patched socket the sender
opens in that thread waits on a gevent hub of the thread's own (gevent makes one per thread
that blocks), never on the worker's. The thread still takes the GIL to run: each time the
loop wakes while the sender is busy, it waits up to Python's switch interval for the GIL,
5 ms by default, which an outbox lowers to ``SWITCH_INTERVAL_S`` for the whole process.

When the outbox holds ``capacity`` items, ``put`` refuses the next one (False: the caller
counts it) rather than wait. ``close`` sends what is queued, waiting at most its timeout:
a sender stuck on a collector that never answers is left behind, not waited for.

After a failed send the thread waits the whole interval, then tries one item alone, and goes
back to full batches once one went through. A collector that never answers then costs the
encoding of one span per try instead of a batch's (512 spans, ~20 ms of CPU that the loop
shares the GIL and the cores with, every export timeout), and one that refuses everything
at once is not retried in a loop.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Generic, TypeVar

from gevent.monkey import get_original

T = TypeVar("T")
_allocate_lock, _start_new_thread = get_original("_thread", ["allocate_lock", "start_new_thread"])
_log = logging.getLogger(__name__)
# A request woken while the sender encodes waits this long at most for the GIL, each time it
# wakes (a call wakes a few times). At Python's 5 ms, a working collector's batches added
# ~23 ms to a call's p99.9, at 0.5 ms ~6 (bench/tracing/trace_latency.py, one run each, 2 callers).
SWITCH_INTERVAL_S = 0.0005


class Outbox(Generic[T]):
    def __init__(
        self,
        send: Callable[[list[T]], bool],
        *,
        capacity: int,
        batch: int,
        interval_s: float,
        on_close: Callable[[], object] = lambda: None,
    ) -> None:
        """``send(items)`` runs in the outbox's thread, at most ``batch`` items a call, every
        ``interval_s`` or as soon as a batch is full, and returns True when they were
        delivered (False or an exception: they were not); ``on_close()`` runs there last.
        The list is lent: the outbox empties it once ``send`` returns (the items stay
        whole)."""
        self._send = send
        self._on_close = on_close
        self._capacity = capacity
        self._batch = batch
        self._interval_s = interval_s
        self._items: deque[T] = deque()
        self._closing = False
        self._failing = False  # the last send failed: wait, then one item alone
        # Both locks start taken: the thread waits on the doorbell, close() on done.
        self._doorbell = _allocate_lock()
        self._doorbell.acquire()
        self._done = _allocate_lock()
        self._done.acquire()
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        _start_new_thread(self._run, ())

    def has_room(self) -> bool:
        """Whether ``put`` would take an item now. Only ``put`` fills the outbox: for the
        side that puts, a True holds until its next put."""
        return not self._closing and len(self._items) < self._capacity

    def put(self, item: T) -> bool:
        """Queue ``item`` for the thread; False (not queued) when the outbox is full or
        closing. Never waits."""
        if self._closing or len(self._items) >= self._capacity:
            return False
        self._items.append(item)
        # Rung once, as a batch fills: the thread sends everything queued each time it wakes,
        # and a failing thread, which waits its whole interval, is not woken by every put.
        if len(self._items) == self._batch:
            self._ring()
        return True

    def oldest(self) -> T | None:
        """The item queued longest and not yet taken by the thread; None when none is."""
        try:
            return self._items[0]
        except IndexError:  # the thread took the last one meanwhile
            return None

    def queued(self) -> int:
        """How many items wait for the thread."""
        return len(self._items)

    def close(self, timeout_s: float) -> bool:
        """Stop taking items and let the thread send what is queued; True when it finished
        within ``timeout_s``. This waits (the loop too): call it only at the worker's exit."""
        self._closing = True
        self._ring()
        finished: bool = self._done.acquire(timeout=max(timeout_s, 0.0))
        return finished

    def _ring(self) -> None:
        with suppress(RuntimeError):  # already rung, and the thread has not answered yet
            self._doorbell.release()

    def _run(self) -> None:
        """The thread: wait for the doorbell or the interval, send everything queued."""
        try:
            while not self._closing:
                self._wait()
                self._send_queued()
            self._send_queued()
            self._on_close()
        except Exception:  # never raised into nothing: a dead thread would only stop exporting
            _log.exception("outbox: the sending thread failed")
        finally:
            self._done.release()

    def _wait(self) -> None:
        """For the doorbell or the interval; after a failed send, the whole interval (a full
        batch does not cut it short) unless the outbox closes."""
        ends = time.monotonic() + self._interval_s
        while True:
            rung = self._doorbell.acquire(timeout=max(0.0, ends - time.monotonic()))
            if not (rung and self._failing) or self._closing:
                return

    def _send_queued(self) -> None:
        while self._items:
            size = 1 if self._failing else self._batch
            batch = [self._items.popleft() for _ in range(min(size, len(self._items)))]
            try:
                self._failing = self._send(batch) is not True
            except Exception:  # one failed batch is lost, the next ones still go
                _log.exception("outbox: sending a batch of %d failed", len(batch))
                self._failing = True
            # A failed send leaves a reference cycle (its exception, the frames of its
            # traceback, their locals: this list). Emptied, the items are freed now, not by
            # the next full collection, which would stop the worker while it frees them.
            batch.clear()
            if self._failing and not self._closing:
                return  # the next try waits for the interval (close tries what is left)
