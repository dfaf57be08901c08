"""The HTTP/2 section's pure part (bench/client/http2_table.py): the round order, the pooled summary
of a protocol's waves, and the rows against the section's columns.

No process and no timing here: `make bench-smoke` runs the real thing.
"""

from __future__ import annotations

import math

from bench.client import http2_table as t
from bench.client.http2_table import H1, H2, KEPT, NEW, Stream, Wave
from bench.kit import report


def ok(ttft_ms: float, total_ms: float, port: int) -> Stream:
    return Stream(ttft_ms / 1000, total_ms / 1000, 50, True, port)


def wave(streams: list[Stream], protocol: str = H1, **changes: float) -> Wave:
    fields: dict = {"wall_s": 1.0, "client_cpu_s": 0.2, "opened": 0}
    fields |= {"nginx_cpu_s": 0.1, "gunicorn_cpu_s": 0.4, "others": 0.0, **changes}
    return Wave(protocol, NEW, tuple(streams), **fields)


def test_rounds_alternate_which_protocol_goes_first() -> None:
    assert t.order(1) == [H1, H2]
    assert t.order(3) == [H1, H2, H2, H1, H1, H2]
    assert t.order(4).count(H1) == t.order(4).count(H2) == 4


def test_summary_pools_the_waves_and_leaves_failed_streams_out_of_the_percentiles() -> None:
    first = wave(
        [ok(200, 700, 1001), ok(210, 710, 1002), ok(220, 720, 1003)],
        opened=3,
        client_cpu_s=0.3,
        others=0.5,
    )
    second = wave(
        [
            ok(230, 730, 1001),
            Stream(0.240, None, 7, False, 1004, "cut"),
            Stream(None, None, 0, False, 0, "ReadTimeout"),
            Stream(None, None, 0, False, 1005, "HTTP 502"),
            Stream(None, None, 0, False, 1005, "HTTP 502"),
        ],
        wall_s=3.0,
        opened=1,
        client_cpu_s=0.5,
        others=0.1,
    )
    s = t.summary([first, second])
    assert s["streams"] == 8 and s["done"] == 4
    assert s["errors"] == {"cut": 1, "ReadTimeout": 1, "HTTP 502": 2} and s["error_count"] == 4
    # Nearest rank over the four that ended: the cut stream's TTFT (240 ms) is not among them.
    assert s["ttft_p50_ms"] == 220.0 and s["ttft_p99_ms"] == 230.0
    assert s["total_p50_ms"] == 720.0 and s["total_p99_ms"] == 730.0
    assert s["events_min"] == s["events_max"] == 50
    assert s["streams_per_s"] == 4 / 4.0
    # Connections per wave: opened (3 and 1), used = distinct ports with a stream (3 and 3).
    assert s["opened_per_wave"] == 2.0 and s["used_per_wave"] == 3.0
    assert math.isclose(s["client_cpu_ms_per_stream"], 1000 * 0.8 / 8)
    assert math.isclose(s["gunicorn_cpu_ms_per_stream"], 1000 * 0.8 / 8)
    assert math.isclose(s["others_cores_share"], (0.5 * 1 + 0.1 * 3) / 4)


def test_summary_of_nothing_is_nan_not_an_exception() -> None:
    s = t.summary([])
    assert s["streams"] == 0 and math.isnan(s["ttft_p50_ms"]) and math.isnan(s["streams_per_s"])
    assert t.row(NEW, H1, s)[6] is None  # shown as "—"; the report refuses NaN


def test_rows_and_the_ratio_row_fit_the_columns() -> None:
    h1 = t.summary([wave([ok(200, 700, p) for p in range(1, 101)], opened=100)])
    h2 = t.summary([wave([ok(300, 800, 7)] * 100, H2, opened=1, nginx_cpu_s=0.0)])
    rows = [t.row(KEPT, H1, h1), t.row(KEPT, H2, h2), t.ratio_row(KEPT, h1, h2)]
    assert all(len(r) == len(t.COLUMNS) for r in rows)
    by_column = dict(zip(t.COLUMNS, rows[2], strict=True))
    assert by_column["TCP connections opened / used per wave"] == "0.01"
    assert by_column["TTFT p50 ms"] == 300 / 200
    assert by_column["total p99 ms"] == 800 / 700
    assert by_column["streams/s"] == 1.0
    # HTTP/1.1's nginx CPU of 0 would divide by zero: no ratio rather than inf.
    assert t.ratio_row(KEPT, h2, h1)[t.COLUMNS.index("nginx CPU ms/stream")] is None
    assert rows[0][t.COLUMNS.index("TCP connections opened / used per wave")] == "100 / 100"


def test_section_has_both_kinds_of_wave_and_nothing_the_report_refuses() -> None:
    waves = [
        Wave(p, kind, (ok(200, 700, 1),), 1.0, 0.1, 1 if kind == NEW else 0, 0.01, 0.5)
        for p in t.order(2)
        for kind in (NEW, KEPT)
    ]
    section = t.section(waves, {"streams": 1})
    assert [r[:2] for r in section.rows] == [
        [kind, protocol] for kind in (NEW, KEPT) for protocol in (H1, H2, "HTTP/2 / HTTP/1.1")
    ]
    assert report.problems([report.Part("http2", [section])]) == []
    assert len(section.data["waves"]) == 8
    assert section.data["waves"][0] == {
        "protocol": H1,
        "kind": NEW,
        "wall_s": 1.0,
        "error_count": 0,
        "ttft_p50_ms": 200.0,
        "total_p50_ms": 700.0,
        "opened_per_wave": 1.0,
        "used_per_wave": 1.0,
        "client_cpu_ms_per_stream": 100.0,
        "nginx_cpu_ms_per_stream": 10.0,
        "gunicorn_cpu_ms_per_stream": 500.0,
        "others_cores_share": 0.0,
    }
