"""The spend ledger of a worker (app/store/spend_ledger.py) on a SQLite file: rows handed over
never wait, are written in batches by a thread of the ledger's own, wait in memory (bounded)
while the database cannot take them and are written when it can, are dropped past the bound
(counted, said), and are written at close or counted lost. Reads run in the hub's thread pool,
shared by the callers asking at once, and a ledger that cannot answer in time is None and left
alone for a while.

A database that cannot take writes is a real one: another connection holds SQLite's write
lock (``BEGIN EXCLUSIVE``), as another process's long transaction would. What was written is
read with sqlite3 itself, and the figures with the worker's own metrics registry.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gevent
import pytest

from app.observe.metrics import Metrics
from app.store import spend_db, spend_ledger
from app.store.spend_ledger import SpendLedger
from app.store.spend_rows import SpendRow

T0 = 1_790_000_000.0


def row(i: int, at: float = T0, key: str = "team", tokens: int = 10) -> SpendRow:
    return SpendRow(
        f"r{i}", at, key, "m", "u", 4, 0, None, 6, tokens, tokens * 1000, "usage", None, "v1"
    )


def written(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM llmgate_spend").fetchone()[0])
        except sqlite3.OperationalError:  # no table yet
            return 0


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def until(predicate, timeout: float = 10.0) -> bool:
    """Wait on the hub (the ledger's publishing greenlet runs meanwhile) until ``predicate``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        gevent.sleep(0.02)
    return bool(predicate())


class Locked:
    """SQLite's write lock held by another connection: the ledger's writes fail (busy) until
    ``release``. Readers of a WAL database go on."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(spend_db, "BUSY_S", 0.05)  # a locked database fails fast
    return tmp_path / "spend.sqlite3"


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(multiproc_dir="")


@pytest.fixture
def ledgers() -> Iterator[list[SpendLedger]]:
    made: list[SpendLedger] = []
    yield made
    for ledger in made:
        ledger.close(2)


def make(ledgers, path: Path, metrics: Metrics, **options) -> SpendLedger:
    ledger = SpendLedger(str(path), metrics, **options)
    ledgers.append(ledger)
    return ledger


def test_the_schema_is_made_as_the_ledger_starts_before_any_row_or_read(
    path, metrics, ledgers
) -> None:
    """A first rebuild only reads: the fresh file's WAL and table are made off the loop at
    once (they cost fsyncs: over the read timeout on a busy disk)."""

    def tables() -> list[str]:
        with sqlite3.connect(path) as conn:
            return [name for (name,) in conn.execute("SELECT name FROM sqlite_master")]

    make(ledgers, path, metrics)
    assert until(lambda: path.exists() and "llmgate_spend" in tables(), timeout=5)
    assert "llmgate_schema" in tables()


def test_rows_are_written_in_batches_from_the_ledgers_thread(path, metrics, ledgers) -> None:
    ledger = make(ledgers, path, metrics, batch=500, flush_s=60)
    threads: set[int] = set()
    insert = spend_db.SpendDatabase.insert

    def noted(db, rows):
        threads.add(threading.get_ident())
        insert(db, rows)

    spend_db.SpendDatabase.insert = noted  # type: ignore[method-assign]
    try:
        for i in range(1200):
            ledger.append(row(i))
        # Full batches go at once, though the interval is a minute; a part batch waits.
        assert until(lambda: written(path) >= 1000)
        assert ledger.close(5)
    finally:
        spend_db.SpendDatabase.insert = insert  # type: ignore[method-assign]
    assert written(path) == 1200
    assert threads and threading.get_ident() not in threads
    assert sample(metrics, "llmgate_ledger_rows_total", result="written") == 1200
    batches = sample(metrics, "llmgate_ledger_batch_rows_count")
    assert 3 <= batches <= 4  # none above 500 rows
    assert sample(metrics, "llmgate_ledger_batch_rows_bucket", le="500.0") == batches
    assert sample(metrics, "llmgate_ledger_batch_rows_sum") == 1200


def test_a_database_that_takes_nothing_delays_no_call_and_gets_the_rows_later(
    path, metrics, ledgers
) -> None:
    spend_db.SpendDatabase(str(path)).migrate()
    lock = Locked(path)
    ledger = make(ledgers, path, metrics, batch=10, flush_s=0.05)
    slowest = 0.0
    for i in range(100):
        began = time.perf_counter()
        ledger.append(row(i))
        slowest = max(slowest, time.perf_counter() - began)
    assert slowest < 0.01  # handed over, never waited for
    gevent.sleep(1.5)
    assert lock.conn.execute("SELECT COUNT(*) FROM llmgate_spend").fetchone()[0] == 0
    assert until(lambda: sample(metrics, "llmgate_ledger_lag_seconds") >= 1.0)
    lock.release()
    assert until(lambda: written(path) == 100)
    assert until(lambda: sample(metrics, "llmgate_ledger_rows_total", result="written") == 100)
    assert until(lambda: sample(metrics, "llmgate_ledger_lag_seconds") == 0.0)
    assert sample(metrics, "llmgate_ledger_rows_total", result="dropped") == 0


def test_past_its_queue_rows_are_dropped_counted_and_said(path, metrics, ledgers, caplog) -> None:
    spend_db.SpendDatabase(str(path)).migrate()
    lock = Locked(path)
    ledger = make(ledgers, path, metrics, batch=5, flush_s=0.05, capacity=10)
    with caplog.at_level(logging.WARNING, logger="llmgate.ledger"):
        for i in range(5):
            ledger.append(row(i))
        gevent.sleep(0.5)  # the thread holds these five, trying again and again
        for i in range(5, 25):
            ledger.append(row(i))
    assert sample(metrics, "llmgate_ledger_rows_total", result="dropped") == 10
    assert any("rows dropped" in r.getMessage() for r in caplog.records)
    lock.release()
    assert until(lambda: written(path) == 15)
    with sqlite3.connect(path) as conn:  # the first ones, in order: the later ones dropped
        found = [r for (r,) in conn.execute("SELECT request_id FROM llmgate_spend ORDER BY at")]
    assert sorted(found, key=lambda r: int(r[1:])) == [f"r{i}" for i in range(15)]


def test_close_writes_what_is_queued(path, metrics, ledgers) -> None:
    ledger = make(ledgers, path, metrics, flush_s=60)
    for i in range(7):
        ledger.append(row(i))
    assert written(path) == 0  # a minute's interval: nothing went yet
    assert ledger.close(5) is True
    assert written(path) == 7


def test_close_with_the_database_taking_nothing_counts_the_rows_lost(
    path, metrics, ledgers, caplog
) -> None:
    spend_db.SpendDatabase(str(path)).migrate()
    lock = Locked(path)
    ledger = make(ledgers, path, metrics, batch=3, flush_s=0.05)
    for i in range(7):
        ledger.append(row(i))
    with caplog.at_level(logging.ERROR, logger="llmgate.ledger"):
        assert ledger.close(2) is False
    assert sample(metrics, "llmgate_ledger_rows_total", result="lost") == 7
    assert any("7 rows not written" in r.getMessage() for r in caplog.records)
    lock.release()
    assert written(path) == 0


def test_a_total_is_read_off_the_loop_once_for_the_callers_asking_at_once(
    path, metrics, ledgers, monkeypatch
) -> None:
    ledger = make(ledgers, path, metrics, flush_s=0.05)
    for i in range(4):
        ledger.append(row(i, tokens=25))
    ledger.append(row(9, key="other"))
    assert until(lambda: written(path) == 5)
    queries = []
    total = spend_db.SpendDatabase.total

    def slow(db, *args):
        queries.append(args)
        time.sleep(0.3)  # the pool's thread sleeps; the loop goes on
        return total(db, *args)

    monkeypatch.setattr(spend_db.SpendDatabase, "total", slow)
    ticks = []

    def tick() -> None:
        while True:
            gevent.sleep(0.01)
            ticks.append(1)

    ticker = gevent.spawn(tick)
    asked = [gevent.spawn(ledger.total, "team", "tokens", T0, T0 + 1) for _ in range(5)]
    gevent.joinall(asked, timeout=5)
    ticker.kill()
    assert [g.value for g in asked] == [100] * 5
    assert len(queries) == 1  # one read for the five
    assert len(ticks) >= 15  # the loop ran while the read was out
    assert sample(metrics, "llmgate_ledger_rebuilds_total", result="rebuilt") == 5


def test_a_ledger_that_cannot_answer_in_time_is_none_then_left_alone(
    path, metrics, ledgers, monkeypatch, caplog
) -> None:
    ledger = make(ledgers, path, metrics, read_timeout_s=0.2)
    queries = []

    def stuck(db, *args):
        queries.append(args)
        time.sleep(1)
        return 0

    monkeypatch.setattr(spend_db.SpendDatabase, "total", stuck)
    with caplog.at_level(logging.WARNING, logger="llmgate.ledger"):
        began = time.monotonic()
        assert ledger.total("team", "tokens", 0, 1) is None
        assert time.monotonic() - began < 0.6
        # Not asked again for a while: the calls behind it do not each wait the timeout.
        began = time.monotonic()
        assert ledger.total("team", "tokens", 0, 1) is None
        assert time.monotonic() - began < 0.05
    assert len(queries) == 1
    assert sample(metrics, "llmgate_ledger_rebuilds_total", result="unavailable") == 2
    assert any("cannot read" in r.getMessage() for r in caplog.records)


def test_rows_past_the_retention_are_pruned_a_batch_per_write(
    path, metrics, ledgers, monkeypatch
) -> None:
    monkeypatch.setattr(spend_ledger, "PRUNE_BATCH", 10)
    db = spend_db.SpendDatabase(str(path))
    db.migrate()
    now = time.time()
    old = now - 41 * 86400
    db.insert([row(i, at=old) for i in range(25)] + [row(100, at=now - 39 * 86400)])
    db.close()
    ledger = make(ledgers, path, metrics, retention_days=40, flush_s=0.02)
    # 26 rows; each write adds one, then a batch of 10 old ones goes, then the last 5.
    for i, left in enumerate((17, 8, 4)):
        ledger.append(row(200 + i, at=now))
        assert until(lambda left=left: written(path) == left)
    with sqlite3.connect(path) as conn:
        kept = conn.execute("SELECT COUNT(*) FROM llmgate_spend WHERE at < ?", (old + 1,))
        assert kept.fetchone()[0] == 0
    assert written(path) == 1 + 3  # the row within the retention, and the new ones
