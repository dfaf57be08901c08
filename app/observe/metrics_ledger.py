"""The spend ledger's metrics (app/store/spend_ledger.py), built into ``Metrics`` by one line:
what became of each settled call's row, how far behind the writer is, the size of what it
writes at once, and the counters rebuilt from it. docs/metrics.md says what each means.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
ROW_RESULTS = ("written", "dropped", "lost")
REBUILD_RESULTS = ("rebuilt", "unavailable")


def ledger(reg: CollectorRegistry) -> tuple[Counter, Gauge, Histogram, Counter]:
    """(rows by result, the writer's lag, rows per batch, counters rebuilt by result)."""
    rows = Counter(
        "llmgate_ledger_rows_total",
        "Settled calls' rows of the spend ledger, by what became of them: written (committed), "
        "dropped (the worker's queue was full: the database slow or down for too long), lost "
        "(still queued when the worker exited, the database unreachable).",
        ["result"],
        registry=reg,
    )
    lag = Gauge(
        "llmgate_ledger_lag_seconds",
        "How long ago the oldest row a worker has not yet written was handed to its writer "
        "(0: none waiting); the largest of the live workers.",
        multiprocess_mode="livemax",
        registry=reg,
    )
    batch = Histogram(
        "llmgate_ledger_batch_rows",
        "Rows the ledger's writer committed in one transaction.",
        buckets=BATCH_BUCKETS,
        registry=reg,
    )
    rebuilds = Counter(
        "llmgate_ledger_rebuilds_total",
        "Day and month budget counters found missing in Memcached, by result: rebuilt from the "
        "ledger, or unavailable (the ledger could not be read in time: the count is treated "
        "as unreachable, LLMGATE_LIMITS_FAIL).",
        ["result"],
        registry=reg,
    )
    for result in ROW_RESULTS:
        rows.labels(result)
    for result in REBUILD_RESULTS:
        rebuilds.labels(result)
    return rows, lag, batch, rebuilds
