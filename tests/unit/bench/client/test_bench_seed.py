"""The seed table's arithmetic (bench/client/seed_math.py) and the tables built from a run's numbers
(bench/client/seed_table.py), on made-up samples: no processes, no timing."""

from __future__ import annotations

import math

import pytest

from bench.client import seed_table as seed
from bench.client.seed_math import (
    claim_lines,
    percentile,
    ratio,
    reuse_saving_ms,
    rtt_needed_ms,
    saving_in_rtts,
    slope,
    summary,
)


def test_percentile_is_nearest_rank() -> None:
    samples = list(range(50, 0, -1))  # 1..50, unsorted
    assert percentile(samples, 0.50) == 25
    assert percentile(samples, 0.95) == 48
    assert percentile(samples, 0.99) == 50  # of 50 samples, the largest
    assert percentile(samples, 0.0) == 1
    assert percentile(samples, 1.0) == 50
    assert percentile([7.0], 0.99) == 7.0
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError):
        percentile(samples, 1.5)


def test_summary_and_ratio() -> None:
    assert summary([4.0, 1.0, 3.0, 2.0]) == {"mean": 2.5, "p50": 2.0, "p95": 4.0, "p99": 4.0}
    assert ratio(2.0, 4.0) == 0.5
    assert ratio(None, 4.0) is None and ratio(2.0, None) is None
    assert math.isnan(ratio(2.0, 0.0))  # type: ignore[arg-type]


def test_round_trips_a_reused_connection_saves() -> None:
    assert reuse_saving_ms(100, "TLSv1.3") == 200  # TCP + TLS 1.3's one round trip
    assert reuse_saving_ms(100, "TLSv1.2") == 300  # TCP + TLS 1.2's two
    assert rtt_needed_ms(1100, "TLSv1.3") == 550
    assert rtt_needed_ms(1200, "TLSv1.2") == 400
    assert saving_in_rtts(250, 100, at_zero_ms=50) == 2.0
    assert saving_in_rtts(5, 0) is None
    assert slope([(0, 10), (50, 110), (150, 310)]) == pytest.approx(2.0)
    assert slope([(100, 1), (100, 2)]) is None
    first, second = claim_lines((3200, 2100, 1500))
    assert "550 ms with TLS 1.3" in first and "367 ms with TLS 1.2" in first
    assert "600 ms" in second and "60 tokens at 100 tokens/s" in second


def _row(total_ms: list[float], tls: str = "TLSv1.3", first_ms: list[float] | None = None):
    return {
        "total_s": [v / 1000 for v in total_ms],
        "first_s": [v / 1000 for v in first_ms] if first_ms else None,
        "wall_s": sum(total_ms) / 1000,
        "peak_rss_kib": 32 * 1024,
        "tls_version": tls,
        "cache": {"none": len(total_ms)},
        "handshakes": len(total_ms),
        "calls": len(total_ms),
        "top_allocations": [{"where": "x.py:1", "kib": 2.0, "count": 3}],
        "traced_peak_kib": 40.0,
    }


def _model(rtt: float, rtts_per_handshake: int, server: float = 100.0, cpu: float = 8.0):
    """(a) and (b) as the arithmetic says: a new connection costs its handshakes and some CPU."""
    naive = _row([(rtts_per_handshake + 1) * rtt + server + cpu] * 4)
    tls = "TLSv1.3" if rtts_per_handshake == 2 else "TLSv1.2"
    naive["tls_version"] = tls
    return naive, _row([rtt + server] * 4, tls)


def test_tables_from_a_runs_numbers() -> None:
    opts = seed.Options(rtt_ms=100, requests=4, concurrency=1)
    a, b = _model(100, 2)
    res = {
        "rows": {
            "a": a,
            "b": b,
            "c": _row([200.0] * 4, first_ms=[150.0] * 4),
            "d": _row([205.0] * 4, "plain"),
            "e": _row([210.0] * 4, "plain", first_ms=[155.0] * 4),
            "f": _row([4.0] * 4, "plain"),
        },
        "scaling": [
            {"rtt_ms": rtt, "tls_expected": tls, "a": naive, "b": pooled}
            for rtt, k, tls in [
                (0, 2, "TLSv1.3"),
                (50, 2, "TLSv1.3"),
                (0, 3, "TLSv1.2"),
                (100, 3, "TLSv1.2"),
            ]
            for naive, pooled in [_model(rtt, k)]
        ],
        "upstream_tls_versions": {"TLSv1.3": 60},
        "gateway_warm_handshakes": {"TLSv1.3": 2},
        "load": {"before": [1.0, 1.0, 1.0], "after": [1.0, 1.0, 1.0]},
    }
    main, rtt, memory = seed.sections(res, opts, out_dir=None)
    by_row = {str(row[0])[:3]: dict(zip(main.columns, row, strict=True)) for row in main.rows}
    assert by_row["(a)"]["x (a)"] == 1.0
    assert by_row["(b)"]["x (a)"] == pytest.approx(200 / 408)
    assert by_row["(c)"]["first token x (a)"] == pytest.approx(150 / 408)
    assert by_row["(b)"]["first token mean ms"] is None  # not a stream: no first token
    assert by_row["(f)"]["QPS"] == pytest.approx(250.0)
    assert by_row["(a)"]["client peak RSS MiB"] == 32.0
    saving = {(row[0], row[1]): row[5] for row in rtt.rows}
    # The CPU part (8 ms, the saving at RTT 0) is left out of the round trips counted.
    assert saving[(100, "TLSv1.3")] == pytest.approx(2.0)
    assert saving[(50, "TLSv1.3")] == pytest.approx(2.0)
    assert saving[(100, "TLSv1.2")] == pytest.approx(3.0)
    assert saving[(0, "TLSv1.3")] is None
    assert any("TLSv1.3 2.00 (expected 2)" in note for note in rtt.notes)
    assert any("TLSv1.2 3.00 (expected 3)" in note for note in rtt.notes)
    assert memory.rows[0][4] == "2.0 KiB x.py:1" and memory.rows[0][6] is None
