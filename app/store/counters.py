"""The per-key limit counters in Memcached: app/tenancy/limits.py's ``Counters``, shared by
every worker of every instance. Never an exception: None when the nodes cannot be reached.

Each counter is one Memcached item holding a decimal number, flagged ``FLAG_COUNTER`` so
nothing reads it as a cached answer (nor an answer as a counter). Memcached's ``incr`` and
``decr`` are atomic on the node, which is what makes a limit hold across processes: each
call takes its share with one ``incr`` and sees the count its share made.

- A call's counts go together: the commands for one node are written at once and their
  replies read after (``GuardedHashClient.pipeline``, app/store/guarded_client.py), one
  round trip however many limits the key has. Each command is still atomic on its own; only
  the waiting is shared.
- ``incr`` on a missing item fails (NOT_FOUND) rather than creating it, so the missing
  counters of a batch (the first call of a window) are created with ``add`` of ``0`` and
  their TTL, then incremented: a second round trip, once per counter and window. Of two
  processes creating one at once, one ``add`` fails and both increments count. A count that
  says not to create (``create`` False: a day's or month's budget, which the caller makes
  again from the spend ledger, at its ``start``) leaves a missing counter missing and gets
  ``MISSING`` for its value.
- ``decr`` stops at 0 (Memcached's rule, which ``MemoryCounters`` copies), and may leave the
  number space-padded: a read strips it.
- ``renew`` is a ``touch`` after the ``incr``, in the same batch: the stream slots' counter
  never rolls over, so each start gives it its whole TTL again (app/tenancy/limits.py
  ``streams``).

- The calls of a worker go together too (a group commit): while one batch is on its way,
  the counts other calls ask for wait, and go together in the next batch as soon as it is
  back, sent by a greenlet of its own; each caller gets its own values. A call with none
  on the way sends its own at once, as before; under load a batch carries the grants and
  settlements of all the calls that came while the last one was out, one write and one read
  for all of them (bench/HISTORY.md "A gateway key's limits"). Memcached runs the
  commands in the order written, so each ``incr`` sees the counts written before it, as if
  each call had sent its own. What is shared is a failure: an error reply fails its whole
  batch, every call's counts on it. A caller who leaves while its counts wait takes them
  out (never counted); once sent, they stand, as a call's own round trip's would.

The batch for a node runs through the Memcached client (app/store/memcached.py
``MemcachedBackend.run``): one connection, the node skipped while it is down, every failure
counted in the client's stats; a node down leaves the counts on the others counted. The app
factory gives the counters a client of their own, on the cache's nodes with its timeouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol

import gevent
from gevent.event import AsyncResult

from app.store.backends import clamp_ttl
from app.store.memcached import FLAG_COUNTER, MemcachedBackend


class CountLike(Protocol):
    """app/tenancy/limits.py's ``Count``, by its shape (the store does not import tenancy)."""

    @property
    def key(self) -> str: ...
    @property
    def delta(self) -> int: ...
    @property
    def ttl(self) -> int: ...
    @property
    def renew(self) -> bool: ...
    @property
    def create(self) -> bool: ...
    @property
    def start(self) -> int: ...


# app/tenancy/limits.py's MISSING: a count added to a counter that is gone and was not to be
# made (its ``create`` False) was not counted.
MISSING = -1


class MemcachedCounters:
    """The limit counters, over one Memcached client."""

    def __init__(self, memcached: MemcachedBackend) -> None:
        self.memcached = memcached
        self._sending = False  # a batch is on its way to Memcached
        # What was asked for while it was, with where each caller waits: the next batch.
        self._asked: list[tuple[Sequence[CountLike], AsyncResult]] = []

    def apply(self, counts: Sequence[CountLike]) -> list[int | None]:
        """Each count's new value, in order (0 for a ``decr`` of a counter that is gone);
        None for the counts on a node that cannot be reached (counted). Sent at once when no
        batch is on its way, else with the next one."""
        if self._sending:
            asked: AsyncResult = AsyncResult()
            self._asked.append((counts, asked))
            try:
                values: list[int | None] = asked.get()
            except BaseException:
                # Gone before its batch left (a timeout, the greenlet killed): its counts are
                # taken out, never counted. Once sent they stand, as a call's own would.
                self._asked = [entry for entry in self._asked if entry[1] is not asked]
                raise
            return values
        self._sending = True
        try:
            return self._apply(counts)
        finally:
            self._send_next()

    def _send_next(self) -> None:
        """The batch just sent is back: what was asked for meanwhile goes now, together."""
        if self._asked:
            gevent.spawn(self._send_asked)  # still sending: later callers keep waiting
        else:
            self._sending = False

    def _send_asked(self) -> None:
        batch, self._asked = self._asked, []
        try:
            values = self._apply([count for counts, _ in batch for count in counts])
        except BaseException as exc:  # not a failure of Memcached's (those are None): a bug,
            for _, asked in batch:  # or this greenlet killed; each caller raises it
                asked.set_exception(exc)
            return
        finally:
            self._send_next()
        at = 0
        for counts, asked in batch:
            asked.set(values[at : at + len(counts)])
            at += len(counts)

    def _apply(self, counts: Sequence[CountLike]) -> list[int | None]:
        by_node: dict[str | None, list[int]] = {}
        for i, count in enumerate(counts):
            by_node.setdefault(self.memcached.node_of(count.key), []).append(i)
        values: list[int | None] = [None] * len(counts)
        for indices in by_node.values():
            batch = [counts[i] for i in indices]
            found = self.memcached.run(
                [c.key for c in batch], partial(_on_node, counts=batch), None
            )
            for i, value in zip(indices, found or [None] * len(indices), strict=True):
                values[i] = value
        return values

    def read(self, keys: list[str]) -> dict[str, int] | None:
        """The counters that exist among ``keys``; None when a node cannot be reached."""
        found: dict[str, tuple[int, bytes]] | None
        found = self.memcached.run(keys, lambda mc: mc.get_many(keys), None, read=True)
        if found is None:
            return None
        counts = {}
        for key, (flags, data) in found.items():
            text = data.strip()  # decr may leave the item space-padded
            if flags == FLAG_COUNTER and text.isdigit():
                counts[key] = int(text)
        return counts

    def close(self) -> None:
        self.memcached.close()


def _on_node(mc: Any, counts: list[CountLike]) -> list[int | None]:
    """The counts of one node: one round trip, and one more when a counter must be made."""
    commands = []
    for count in counts:
        key = count.key.encode()
        verb = b"incr" if count.delta >= 0 else b"decr"
        commands.append(b"%s %s %d\r\n" % (verb, key, abs(count.delta)))
        if count.renew and count.delta >= 0:
            commands.append(b"touch %s %d\r\n" % (key, clamp_ttl(count.ttl)))
    replies = iter(mc.pipeline(counts[0].key, commands))
    values: list[int | None] = []
    missing = []
    for i, count in enumerate(counts):
        value = _number(next(replies))
        if count.renew and count.delta >= 0:
            next(replies)  # TOUCHED, or NOT_FOUND when the incr found nothing either
        if value is None and count.delta >= 0:
            if count.create:
                missing.append(i)
            else:
                value = MISSING
        values.append(0 if value is None and count.delta < 0 else value)
    if missing:
        for i, value in zip(missing, _create(mc, [counts[i] for i in missing]), strict=True):
            values[i] = value
    return values


def _create(mc: Any, counts: list[CountLike]) -> list[int | None]:
    """Make the missing counters at their start (0 but for a budget made again from the spend
    ledger) with their TTL (``add``: a racing creator's fails, and its count stands) and add
    their deltas; None for one gone again at once (evicted), as a failure."""
    commands = []
    for count in counts:
        key, start = count.key.encode(), b"%d" % count.start
        ttl = clamp_ttl(count.ttl)
        commands.append(b"add %s %d %d %d\r\n%s\r\n" % (key, FLAG_COUNTER, ttl, len(start), start))
        commands.append(b"incr %s %d\r\n" % (key, count.delta))
    replies = mc.pipeline(counts[0].key, commands)
    return [_number(replies[i]) for i in range(1, len(replies), 2)]


def _number(reply: bytes) -> int | None:
    """An ``incr``/``decr`` reply: the new value, or None for NOT_FOUND."""
    if reply == b"NOT_FOUND":
        return None
    return int(reply)  # anything else is not a count: ValueError, the batch failed
