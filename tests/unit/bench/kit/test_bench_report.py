"""The benchmark report's pure parts: verdicts against targets, the checks `make bench-smoke`
relies on (every section present, rows, finite numbers), the markdown, and the load
generator's response parser fed whole, a byte at a time and with trailing data.

No process and no timing here: `make bench-smoke` runs the real thing.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from bench.kit import loadgen, machine, proctree, report
from bench.kit.report import Check, Part, Section

STREAM = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'f\r\ndata: {"a": 1}\n\n\r\n'
    b"e\r\ndata: [DONE]\n\n\r\n"
    b"0\r\n\r\n"
)
PLAIN = b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\n{"ok": true}'


def test_check_verdict_and_ratio() -> None:
    assert Check("added TTFT", "<=", 5, 4.0, "ms").met
    assert not Check("added TTFT", "<=", 5, 6.0, "ms").met
    assert Check("req/s", ">=", 1500, 1500.0).met
    assert not Check("req/s", ">=", 1500, 1071.0).met
    assert Check("req/s", ">=", 1500, 3000.0).ratio == 2.0
    assert math.isnan(Check("new connections", "<=", 0, 0.0).ratio)


def section(**changes: object) -> Section:
    fields: dict = {"key": "overhead", "title": "Overhead", "columns": ["path", "req/s"]}
    fields["rows"] = [["direct", 3218.0], ["gateway", 1071.5]]
    fields.update(changes)
    return Section(**fields)


def test_a_whole_report_has_no_problems() -> None:
    parts = [Part("overhead", [section()]), Part("seed", absent=True)]
    assert report.problems(parts) == []


@pytest.mark.parametrize(
    ("part", "found"),
    [
        (Part("overhead", [section(rows=[])]), "overhead: no rows"),
        (Part("overhead", [section(rows=[["gateway", math.nan]])]), "non-finite"),
        (Part("overhead", [section(rows=[["gateway", math.inf]])]), "non-finite"),
        (Part("overhead", [section(rows=[["gateway"]])]), "a row of 1 cells under 2"),
        (Part("overhead", error="Traceback\nRuntimeError: HTTP 502"), "RuntimeError: HTTP 502"),
        (Part("overhead"), "overhead: no section"),
        (
            Part("overhead", [section(checks=[Check("req/s", ">=", 1500, math.nan)])]),
            "check 'req/s' measured nan",
        ),
    ],
)
def test_problems_name_what_is_missing_or_broken(part: Part, found: str) -> None:
    problems = report.problems([part])
    assert len(problems) == 1 and found in problems[0], problems


def test_a_plot_named_but_not_written_is_a_problem(tmp_path: Path) -> None:
    plots = [report.Plot("written.png", "a"), report.Plot("missing.png", "b")]
    (tmp_path / "written.png").write_bytes(b"\x89PNG")
    problems = report.problems([Part("overhead", [section(plots=plots)])], tmp_path)
    assert problems == ["overhead: plot missing.png not written"]


def test_markdown_has_meta_targets_sections_and_absent_modules() -> None:
    checks = [
        Check("non-stream, 200 callers: req/s", ">=", 1500, 1071.0, "req/s"),
        Check("gateway CPU per non-stream request", "<=", 0.7, 0.5, "ms"),
    ]
    plot = report.Plot("overhead-cdf.png", "Latency CDFs")
    settings = {"gunicorn_workers": 2, "simulator": {"x-sim-ttft-ms": "200"}}
    parts = [
        Part(
            "overhead",
            [section(checks=checks, plots=[plot], notes=["a note"], data={"settings": settings})],
            seconds=3,
        ),
        Part("capacity", absent=True),
        Part("seed", error="Traceback\nOSError: no nginx"),
    ]
    meta = {
        "started": "2025-01-01T00:00:00+00:00",
        "command": "python -m bench",
        "seconds": 12.0,
        "noise": "quiet.",
        "machine": {"cores": "2"},
        "versions": {"python": "3.11"},
        "settings": {"smoke": False},
    }
    text = report.markdown(parts, meta)
    assert "- **machine**: cores 2" in text and "- **versions**: python 3.11" in text
    assert (
        "| non-stream, 200 callers: req/s | ≥ 1500 req/s | 1071.00 req/s | **not met** | 0.71 |"
        in text
    )
    assert "| gateway CPU per non-stream request | ≤ 0.7 ms | 0.50 ms | met | 0.71 |" in text
    assert "| gateway | 1071.50 |" in text
    assert "- a note" in text and "![Latency CDFs](overhead-cdf.png)" in text
    assert 'Settings: gunicorn_workers `2`; simulator `{"x-sim-ttft-ms": "200"}`' in text
    assert "Not measured: bench.load.capacity has no run() yet." in text
    assert "OSError: no nginx" in text
    doc = report.as_json(parts, meta)
    assert doc["modules"] == {"overhead": "ok", "capacity": "absent", "seed": "error"}
    assert doc["sections"]["overhead"]["checks"][0]["met"] is False


def feed(response: loadgen._Response, data: bytes, step: int) -> list[bool]:
    return [response.feed(data[i : i + step]) for i in range(0, len(data), step)]


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_response_parser_finds_the_end_and_the_first_data_line(step: int) -> None:
    stream = loadgen._Response()
    done = feed(stream, STREAM, step)
    assert done[-1] and not any(done[:-1])
    assert stream.status == 200 and stream.saw_data and not stream.close
    plain = loadgen._Response()
    done = feed(plain, PLAIN, step)
    assert done[-1] and not any(done[:-1])
    assert plain.close and not plain.saw_data


def test_response_parser_is_not_done_before_the_last_chunk() -> None:
    stream = loadgen._Response()
    assert not stream.feed(STREAM[:-5])  # up to the last chunk's size line
    assert not stream.feed(STREAM[-5:-2])  # "0\r\n" without the empty trailer line
    assert stream.feed(STREAM[-2:])


def test_response_parser_reads_an_error_status() -> None:
    error = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}"
    response = loadgen._Response()
    assert response.feed(error) and response.status == 503


def test_percentiles_by_nearest_rank_in_ms() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert loadgen.pct(samples, 0.5) == pytest.approx(51)
    assert loadgen.pct(samples, 0.99) == pytest.approx(100)
    assert math.isnan(loadgen.pct([], 0.5))


def test_process_tree_readings_of_this_process() -> None:
    me = os.getpid()
    assert proctree.tree(me)[0] == me and proctree.rss_kb([me]) > 0
    others = machine.Others([me])
    before = proctree.cpu_s([me])
    started = time.process_time()
    while time.process_time() - started < 0.05:  # burn 50 ms of CPU: /proc must see them
        pass
    assert proctree.cpu_s([me]) > before
    assert 0.0 <= others.share() <= 1.0
    assert proctree.cpu_s([2**22 + 1]) == 0.0  # a pid that does not exist is skipped
