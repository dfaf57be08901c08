"""The spend ledger of one worker: settled calls' rows written to the database by a real OS
thread, and the ledger read for a greenlet without blocking the worker's loop.

Writing: ``append`` hands a row to an ``Outbox`` (app/observe/outbox.py) and never waits. Its
thread, not a greenlet, writes: every ``flush_s``, or at once when ``batch`` rows are in, each
batch one transaction (app/store/spend_db.py). A batch the database refuses or cannot take
(down, slow, its connection broken) is not dropped: the thread keeps it and tries again,
waiting 0.1 s, then twice as long each time up to ``RETRY_MAX_S``, on a new connection, while
the rows handed over meanwhile wait in the outbox. Only what passes ``capacity`` rows is
dropped, counted in ``llmgate_ledger_rows_total{result="dropped"}`` and said in a log line at
most every ``WARN_EVERY_S``: memory stays bounded, and a call never waits for the database.

What a crash costs: rows are written within ``flush_s`` of their call's end, so a worker killed
with SIGKILL loses at most the rows of its last ``flush_s`` (and, while the database is
unreachable, every row it queued). ``close`` (gunicorn's worker_exit hook: SIGTERM, a reload)
writes what is queued first, waiting at most its timeout; rows it could not write then are
counted ``lost``.

Reading (a day's or month's total, a report; the schema made as the worker starts, so the
first read does not make it): in a thread of the hub's pool
(``gevent.get_hub().threadpool``), so the greenlet waits and the loop runs on; a read that
takes longer than ``read_timeout_s`` answers None, and the ledger is taken as unreadable for
``UNREADABLE_S`` after a failure, so the calls behind it do not each wait that long. Reads of
the same total at once share one query.

The thread touches no Prometheus metric (the values have no lock, app/patches/
prometheus_values.py): it keeps plain counts, and a greenlet of the worker publishes them
every ``PUBLISH_S``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import gevent
from gevent.event import AsyncResult
from gevent.monkey import get_original

from app.observe.metrics import Metrics
from app.observe.outbox import Outbox
from app.store.spend_db import SpendDatabase, failure, redacted
from app.store.spend_rows import SpendRow

_allocate_lock = get_original("_thread", "allocate_lock")
log = logging.getLogger("llmgate.ledger")

RETRY_MAX_S = 2.0
WARN_EVERY_S = 10.0
UNREADABLE_S = 5.0
PUBLISH_S = 1.0
PRUNE_EVERY_S = 3600.0
PRUNE_BATCH = 10_000
DAY_S = 86400.0

_Item = tuple[float, SpendRow]  # (monotonic time handed over, the row)


class SpendLedger:
    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        flush_s: float = 1.0,
        batch: int = 500,
        capacity: int = 50_000,
        retention_days: int = 0,
        read_timeout_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.metrics = metrics
        self.read_timeout_s = read_timeout_s
        self.retention_days = retention_days
        self._clock = clock
        # The thread's own (it alone writes them; the greenlet reads them to publish).
        self._db: SpendDatabase | None = None
        self._in_hand: float | None = None  # when the oldest row of the batch in hand came
        self._hand_count = 0  # and how many rows that batch holds
        self._written = 0
        self._lost = 0
        self._sizes: deque[int] = deque()
        self._next_prune = 0.0
        self._stopping = False
        self._wake = _allocate_lock()  # released by close: a retry's wait ends at once
        self._wake.acquire()
        self._schema = _allocate_lock()  # one migration at a time in this process
        self._schema_ready = False
        # The greenlets' own.
        self._published = (0, 0)  # (written, lost) as last published
        self._dropped_unsaid = 0
        self._warned_drops = float("-inf")
        self._warned_writes = float("-inf")  # the thread's
        self._unreadable_until = float("-inf")
        self._reading: dict[tuple[Any, ...], AsyncResult] = {}
        self._readers: list[SpendDatabase] = []  # idle reading connections, any thread's
        self._outbox: Outbox[_Item] = Outbox(
            self._write, capacity=capacity, batch=batch, interval_s=flush_s, on_close=self._shut
        )
        self._publisher = gevent.spawn(self._publish_every, PUBLISH_S)
        gevent.get_hub().threadpool.spawn(self._warm)

    # -- the greenlets' side ------------------------------------------------------------
    def append(self, row: SpendRow) -> None:
        """Hand ``row`` to the writer; never waits. A full queue drops it (counted)."""
        if not self._outbox.put((time.monotonic(), row)):
            self.metrics.ledger_rows.labels("dropped").inc()
            self._dropped_unsaid += 1
            now = time.monotonic()
            if now - self._warned_drops >= WARN_EVERY_S:
                self._warned_drops = now
                log.warning(
                    "spend ledger: %d rows dropped, the worker's queue is full "
                    "(LLMGATE_LEDGER_QUEUE): the database is slow or unreachable",
                    self._dropped_unsaid,
                )
                self._dropped_unsaid = 0

    def total(self, key_name: str, what: str, start: float, end: float) -> int | None:
        """What ``key_name`` was charged (tokens, or cost in picodollars) by the calls
        admitted in [start, end): None when the ledger cannot say within the read timeout.
        Asked for a budget's counter that Memcached lost (app/tenancy/access.py), so counted
        as its rebuild."""
        found: int | None = self._read(("total", key_name, what, start, end))
        self.metrics.ledger_rebuilt.labels("rebuilt" if found is not None else "unavailable").inc()
        return found

    def report(self, start: float, end: float) -> list[dict[str, Any]] | None:
        """Calls admitted in [start, end) summed per key, model and upstream; None when the
        ledger cannot say within the read timeout."""
        return self._read(("report", start, end))

    def _read(self, query: tuple[Any, ...]) -> Any:
        if time.monotonic() < self._unreadable_until:
            return None
        pending = self._reading.get(query)
        if pending is None:
            pending = gevent.get_hub().threadpool.spawn(self._query, query)
            self._reading[query] = pending
        try:
            return pending.get(timeout=self.read_timeout_s)
        except (Exception, gevent.Timeout) as exc:  # the wait's end, or the query's error
            self._unreadable_until = time.monotonic() + UNREADABLE_S
            log.warning(
                "spend ledger: cannot read %s: %s", redacted(self.url), failure(exc, self.url)
            )
            return None
        finally:
            if self._reading.get(query) is pending:
                del self._reading[query]

    def close(self, timeout_s: float) -> bool:
        """The worker exits: write what is queued, waiting at most ``timeout_s``; what could
        not be written is counted lost. True when everything queued was written. Once."""
        if self._stopping:
            return not self._lost
        self._stopping = True
        self._release(self._wake)
        finished = self._outbox.close(timeout_s)
        if not finished:  # the thread is still trying: what it holds will never be written
            self._lost += self._outbox.queued() + (self._hand_count if self._in_hand else 0)
        self._publisher.kill(block=False)
        self._publish()
        lost = self._lost
        if lost:
            log.error("spend ledger: %d rows not written at the worker's exit", lost)
        return finished and not lost

    def _publish_every(self, every_s: float) -> None:
        while True:
            gevent.sleep(every_s)
            self._publish()

    def _publish(self) -> None:
        """The thread's counts into the worker's metrics (see the module docstring)."""
        written, lost = self._written, self._lost
        done, gone = self._published
        if written > done:
            self.metrics.ledger_rows.labels("written").inc(written - done)
        if lost > gone:
            self.metrics.ledger_rows.labels("lost").inc(lost - gone)
        self._published = (written, lost)
        while self._sizes:
            self.metrics.ledger_batch.observe(self._sizes.popleft())
        oldest = self._outbox.oldest()
        waiting = [t for t in (self._in_hand, oldest[0] if oldest else None) if t is not None]
        self.metrics.ledger_lag.set(time.monotonic() - min(waiting) if waiting else 0.0)

    # -- the writer's thread ------------------------------------------------------------
    def _write(self, items: list[_Item]) -> bool:
        """One batch, written before this returns, however many tries it takes; given up only
        when the worker is exiting."""
        rows = [row for _, row in items]
        self._in_hand, self._hand_count = items[0][0], len(rows)
        wait = 0.1
        try:
            while True:
                try:
                    self._connection().insert(rows)
                    break
                except Exception as exc:
                    self._broken(exc)
                    if self._stopping:
                        self._lost += len(rows)
                        return True
                    self._wake.acquire(timeout=wait)
                    wait = min(wait * 2, RETRY_MAX_S)
        finally:
            self._in_hand = None
        self._written += len(rows)
        self._sizes.append(len(rows))
        self._prune_when_due()
        return True

    def _connection(self) -> SpendDatabase:
        if self._db is None:
            self._db = self._ready(SpendDatabase(self.url))
        return self._db

    def _broken(self, exc: BaseException) -> None:
        """A write failed: its connection is let go (the next try opens a new one)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        now = time.monotonic()
        if now - self._warned_writes >= WARN_EVERY_S:
            self._warned_writes = now
            log.warning(
                "spend ledger: writing to %s failed, will retry: %s",
                redacted(self.url),
                failure(exc, self.url),
            )

    def _prune_when_due(self) -> None:
        """Rows past the retention deleted, a batch at a time: one batch after a write until
        fewer than a batch remain, then again an hour later."""
        if not self.retention_days or time.monotonic() < self._next_prune:
            return
        before = self._clock() - self.retention_days * DAY_S
        try:
            gone = self._connection().prune(before, PRUNE_BATCH)
        except Exception as exc:
            self._broken(exc)
            return
        if gone < PRUNE_BATCH:
            self._next_prune = time.monotonic() + PRUNE_EVERY_S

    def _shut(self) -> None:
        if self._db is not None:
            self._db.close()
        while self._readers:
            self._readers.pop().close()

    # -- the pool's threads -------------------------------------------------------------
    def _ready(self, db: SpendDatabase) -> SpendDatabase:
        """``db`` with the schema made or migrated, once per process."""
        if not self._schema_ready:
            with self._schema:
                if not self._schema_ready:
                    try:
                        db.migrate()
                    except BaseException:
                        db.close()
                        raise
                    self._schema_ready = True
        return db

    def _warm(self) -> None:
        """As the worker starts: the schema made and a reading connection opened, so that a
        first rebuild only reads. A fresh SQLite file's WAL and tables cost fsyncs, which took
        over a second (the read timeout) on a busy disk. A database that cannot be reached
        now is tried again by the first read or write."""
        try:
            db = self._ready(SpendDatabase(self.url, connect_timeout_s=self.read_timeout_s))
        except Exception as exc:
            log.info("spend ledger: not ready at start: %s", failure(exc, self.url))
            return
        self._readers.append(db)

    def _query(self, query: tuple[Any, ...]) -> Any:
        """In a thread of the hub's pool: the query on an idle reading connection, or a new
        one; a connection that failed is closed, never kept."""
        try:
            db = self._readers.pop()
        except IndexError:
            db = self._ready(SpendDatabase(self.url, connect_timeout_s=self.read_timeout_s))
        try:
            found = db.total(*query[1:]) if query[0] == "total" else db.report(*query[1:])
        except BaseException:
            db.close()
            raise
        self._readers.append(db)
        return found

    @staticmethod
    def _release(lock: Any) -> None:
        with contextlib.suppress(RuntimeError):  # released already
            lock.release()
