"""The outbox (app/observe/outbox.py): what is put is sent, in batches, from a thread of its own; a
full outbox refuses rather than waits; close sends what is queued and waits no longer than
its timeout; a failed batch loses only itself, and is followed by one item alone, after the
whole interval. Plain threads here (no gevent): the senders
below block on events the test sets, so the counts, not the timings, are checked."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

from app.observe.outbox import SWITCH_INTERVAL_S, Outbox
from tests.support.waiting import wait_for


class Sender:
    """Keeps every batch and the thread that sent it; waits for ``gate`` before each."""

    def __init__(self, gate: threading.Event | None = None, fail_first: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()
        self.gate = gate
        self.fail_first = fail_first
        self.closed_in: int | None = None

    def send(self, batch: list[int]) -> bool:
        self.threads.add(threading.get_ident())
        if self.gate is not None:
            self.gate.wait(30)
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("the collector said no")
        self.batches.append(list(batch))  # the outbox empties the list it lent
        return True

    def close(self) -> None:
        self.closed_in = threading.get_ident()

    @property
    def sent(self) -> list[int]:
        return [item for batch in self.batches for item in batch]


def _outbox(sender: Sender, *, capacity: int = 100, batch: int = 3, interval_s: float = 60):
    return Outbox(sender.send, capacity=capacity, batch=batch, interval_s=interval_s,
                  on_close=sender.close)  # fmt: skip


def test_items_are_sent_in_order_in_batches_from_the_outbox_thread() -> None:
    sender = Sender()
    outbox = _outbox(sender)
    assert all(outbox.put(i) for i in range(10))
    assert outbox.close(10)
    assert sender.sent == list(range(10))
    assert all(1 <= len(b) <= 3 for b in sender.batches)
    # Sending and closing happened in the outbox's thread, never in the caller's.
    assert sender.threads and threading.get_ident() not in sender.threads
    assert sender.closed_in in sender.threads


def test_a_full_batch_or_the_interval_sends_without_close() -> None:
    sender = Sender()
    outbox = _outbox(sender, batch=3, interval_s=60)
    for i in range(3):  # a full batch rings at once (the interval is a minute)
        outbox.put(i)
    assert wait_for(lambda: sender.sent == [0, 1, 2], timeout=10)
    other = Sender()
    timed = _outbox(other, batch=100, interval_s=0.05)
    timed.put(7)  # one item, far from a batch: the interval sends it
    assert wait_for(lambda: other.sent == [7], timeout=10)
    assert outbox.close(10) and timed.close(10)


def test_a_full_outbox_refuses_and_never_waits() -> None:
    gate = threading.Event()
    sender = Sender(gate)
    outbox = _outbox(sender, capacity=4, batch=2, interval_s=0.01)
    accepted = [i for i in range(50) if outbox.put(i)]  # the sender is stuck meanwhile
    # Four queued, and at most one batch of two already taken by the stuck sender.
    assert 4 <= len(accepted) <= 6, accepted
    gate.set()
    assert outbox.close(10)
    assert sender.sent == accepted  # what was accepted went out, nothing else


def test_close_waits_no_longer_than_its_timeout_for_a_stuck_sender() -> None:
    gate = threading.Event()  # never set before the close: a collector that never answers
    sender = Sender(gate)
    outbox = _outbox(sender, batch=1, interval_s=0.01)
    outbox.put(1)
    # The sender is stuck in its first batch.
    assert wait_for(lambda: bool(sender.threads), timeout=10)
    began = time.monotonic()
    assert outbox.close(0.2) is False
    assert time.monotonic() - began < 5  # not the 30 s the sender would hold it
    assert outbox.put(2) is False  # closed: refused
    gate.set()


def test_a_failed_batch_loses_only_itself() -> None:
    sender = Sender(fail_first=True)
    outbox = _outbox(sender, batch=2)
    for i in range(6):
        outbox.put(i)
    assert outbox.close(10)
    assert sender.sent == [2, 3, 4, 5]


class Tries:
    """Fails its first ``failures`` sends; keeps the size of every try and what went."""

    def __init__(self, failures: int, gate: threading.Event | None = None) -> None:
        self.failures = failures
        self.gate = gate
        self.sizes: list[int] = []
        self.sent: list[int] = []

    def send(self, batch: list[int]) -> bool:
        if self.gate is not None:
            self.gate.wait(30)
        self.sizes.append(len(batch))
        if len(self.sizes) <= self.failures:
            return False
        self.sent += batch
        return True


def test_after_a_failed_send_one_item_goes_alone_until_one_went_through() -> None:
    """A collector that never answers costs one item's encoding per try, not a batch's."""
    gate = threading.Event()
    tries = Tries(failures=3, gate=gate)
    outbox = Outbox(tries.send, capacity=100, batch=3, interval_s=0.01)
    for i in range(12):
        outbox.put(i)
    gate.set()  # the first try, held until all twelve were queued, fails
    assert wait_for(lambda: sum(tries.sizes) == 12, timeout=10)
    first = tries.sizes[0]  # a batch of 3 (or fewer, had the interval come first)
    rest = 12 - first - 3
    assert tries.sizes == [first, 1, 1, 1] + [3] * (rest // 3) + ([rest % 3] if rest % 3 else [])
    assert tries.sent == list(range(first + 2, 12))  # the third lone item went through
    assert outbox.close(10)


def test_a_failing_sender_is_tried_again_only_after_the_whole_interval() -> None:
    """Not at each batch that fills meanwhile: a collector refusing everything at once would
    be retried in a loop. Closing tries what is left, one item at a time."""
    gate = threading.Event()
    tries = Tries(failures=100, gate=gate)
    outbox = Outbox(tries.send, capacity=100, batch=2, interval_s=60)
    for i in range(3):
        outbox.put(i)  # a full batch, tried at once (held until the third item is queued)
    gate.set()
    # It failed, with an item left in the queue.
    assert wait_for(lambda: tries.sizes == [2], timeout=10)
    outbox.put(3)  # and a batch fills again within the minute
    time.sleep(0.3)
    assert tries.sizes == [2]
    assert outbox.close(10)
    assert tries.sizes == [2, 1, 1]


class Item:
    """An item a weak reference can follow."""


def test_a_failed_batch_is_freed_without_waiting_for_the_garbage_collector() -> None:
    """A failed export leaves a reference cycle (its exception, the traceback's frames,
    their locals, the batch among them); emptied, the batch's items go at once, not at the
    next full collection, which would walk them and stop the worker meanwhile."""

    def send(batch: list[Item]) -> bool:
        try:
            raise ConnectionError("refused")
        except ConnectionError as exc:
            error = exc  # kept in this frame: exception -> traceback -> frame -> error
        raise error

    items = [Item() for _ in range(3)]
    alive = [weakref.ref(item) for item in items]
    gc.disable()
    try:
        outbox = Outbox(send, capacity=10, batch=3, interval_s=60)
        for item in items:
            outbox.put(item)
        del items, item
        assert outbox.close(10)
        assert [ref() for ref in alive] == [None, None, None]
    finally:
        gc.enable()


def test_an_outbox_bounds_the_loops_wait_for_the_gil() -> None:
    """While the sender runs, the loop waits at most the switch interval for the GIL each
    time it wakes: an outbox lowers Python's 5 ms for the process."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        _outbox(Sender()).close(10)
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S <= 0.001
    finally:
        sys.setswitchinterval(before)
