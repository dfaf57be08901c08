"""bench/cpu/translation_table.py: the cases, the fit of CPU per stream against its events, and
the rows set against each door's pass-through. No process and no timing here."""

from __future__ import annotations

import math

import pytest

from app.dialects import anthropic, anthropic_door, gemini
from app.upstream.translation import Chained
from bench.cpu import translation_split as split
from bench.cpu.translation_table import (
    FIT_COLUMNS,
    MEASURED_COLUMNS,
    Case,
    Cost,
    Line,
    cases,
    extra_us,
    fit,
    fit_rows,
    lines,
    measured_rows,
    merge,
    share,
)
from bench.kit import report


def cost(
    door: str, kind: str, tokens: int, ms: float, stream: bool = True, calls: int = 100
) -> Cost:
    upstream = {"openai": 0, "anthropic": 0, "gemini": 0, kind: calls}
    return Cost(Case(door, kind, stream, tokens), calls, 0, ms * calls / 1000, 0.0, 0.1, upstream)


def test_the_pass_through_is_the_upstream_speaking_the_doors_dialect() -> None:
    assert Case("chat", "openai", True, 10).passthrough
    assert not Case("chat", "anthropic", True, 10).passthrough
    assert Case("messages", "anthropic", True, 10).passthrough
    assert not Case("messages", "openai", True, 10).passthrough
    assert Case("messages", "gemini", False, 50).baseline() == Case(
        "messages", "anthropic", False, 50
    )
    assert Case("chat", "gemini", True, 10).path == "/v1/chat/completions"
    assert Case("messages", "openai", True, 10).path == "/v1/messages"


def test_cases_are_every_door_and_kind_a_stream_per_size_and_one_whole() -> None:
    found = cases((10, 200), 50)
    assert len(found) == 2 * 3 * 3
    assert len(set(found)) == len(found)
    assert {(c.door, c.kind) for c in found} == {
        (d, k) for d in ("chat", "messages") for k in ("openai", "anthropic", "gemini")
    }
    assert sorted(c.tokens for c in found if not c.stream) == [50] * 6
    # each case's pass-through is measured too, so every ratio has its base
    assert all(c.baseline() in found for c in found)


def test_a_line_through_two_sizes_gives_the_fixed_cost_and_the_cost_per_event() -> None:
    line = fit([(10.0, 1.5), (200.0, 11.0)])  # 0.05 ms = 50 µs per event, 1 ms fixed
    assert line.fixed_ms == pytest.approx(1.0)
    assert line.per_event_us == pytest.approx(50.0)
    assert line.residual_ms == pytest.approx(0.0, abs=1e-12)


def test_three_sizes_are_fitted_by_least_squares_and_the_worst_gap_is_kept() -> None:
    # y = 2 + 0.1 x, the middle point 0.3 ms above the line: least squares moves the line
    # up by a third of it and the middle point stays 0.2 ms above.
    line = fit([(0.0, 2.0), (10.0, 3.3), (20.0, 4.0)])
    assert line.per_event_us == pytest.approx(100.0)
    assert line.fixed_ms == pytest.approx(2.1)
    assert line.residual_ms == pytest.approx(0.2)


def test_a_fit_needs_two_sizes_and_ignores_cases_nothing_answered() -> None:
    assert math.isnan(fit([(10.0, 1.0), (10.0, 2.0)]).per_event_us)
    assert math.isnan(fit([]).fixed_ms)
    assert math.isnan(fit([(10.0, 1.0), (200.0, math.nan)]).per_event_us)
    assert fit([(10.0, 1.0), (20.0, 2.0), (30.0, math.nan)]).per_event_us == pytest.approx(100.0)


def test_two_halves_add_their_cpu_and_calls_and_weigh_the_noise_by_calls() -> None:
    a = Cost(Case("chat", "gemini", True, 10), 30, 1, 0.3, 0.1, 0.5, {"gemini": 31, "openai": 0})
    b = Cost(Case("chat", "gemini", True, 10), 10, 0, 0.2, 0.0, 0.1, {"gemini": 10})
    both = merge(a, b)
    assert (both.calls, both.errors) == (40, 1)
    assert both.workers_ms == pytest.approx(1000 * 0.5 / 40)
    assert both.nginx_ms == pytest.approx(1000 * 0.1 / 40)
    assert both.others == pytest.approx((0.5 * 30 + 0.1 * 10) / 40)
    assert both.upstream == {"gemini": 41, "openai": 0}
    assert math.isnan(Cost(a.case, 0, 5, 0.1, 0.1, 0.0).workers_ms)


def test_each_row_sets_a_case_against_the_same_call_to_its_pass_through() -> None:
    costs = [
        cost("chat", "openai", 10, 2.0),
        cost("chat", "anthropic", 10, 3.0),
        cost("messages", "anthropic", 10, 4.0),
        cost("messages", "openai", 10, 6.0),
        cost("messages", "openai", 10, 5.0, stream=False),  # its base was not measured
    ]
    rows = measured_rows(costs)
    assert all(len(r) == len(MEASURED_COLUMNS) for r in rows)
    ratio = MEASURED_COLUMNS.index("x pass-through")
    assert [r[ratio] for r in rows] == [1.0, 1.5, 1.0, 1.5, None]
    assert rows[0][1] == "openai (pass-through)" and rows[1][1] == "anthropic"
    assert rows[2][1] == "anthropic (pass-through)" and rows[3][1] == "openai"
    assert rows[1][MEASURED_COLUMNS.index("upstream calls (simulator)")] == "anthropic 100"
    assert rows[4][2] == "whole"


def test_the_fit_rows_give_each_kinds_cost_per_event_against_its_doors_pass_through() -> None:
    costs = [
        cost("chat", "openai", 10, 1.5),
        cost("chat", "openai", 200, 11.0),  # 1 ms + 50 µs/event
        cost("chat", "gemini", 10, 2.2),
        cost("chat", "gemini", 200, 21.2),  # 1.2 ms + 100 µs/event
        cost("chat", "gemini", 50, 9.0, stream=False),  # not a stream: not fitted
        cost("messages", "anthropic", 10, 1.4),
        cost("messages", "anthropic", 200, 7.1),  # 1.1 ms + 30 µs/event
        cost("messages", "openai", 10, 2.4),
        cost("messages", "openai", 200, 14.75),  # 1.75 ms + 65 µs/event
    ]
    found = lines(costs)
    assert set(found) == {
        ("chat", "openai"),
        ("chat", "gemini"),
        ("messages", "anthropic"),
        ("messages", "openai"),
    }
    assert found[("chat", "gemini")].per_event_us == pytest.approx(100.0)
    extra = extra_us(found)
    assert extra[("chat", "gemini")] == pytest.approx(50.0)
    assert extra[("messages", "openai")] == pytest.approx(35.0)
    assert extra[("chat", "openai")] == 0.0
    rows = {(r[0], r[1]): r for r in fit_rows(found)}
    gemini = rows[("chat", "gemini")]
    assert len(gemini) == len(FIT_COLUMNS)
    col = FIT_COLUMNS.index
    assert gemini[col("fixed ms/call")] == pytest.approx(1.2)
    assert gemini[col("fixed x pass-through")] == pytest.approx(1.2)
    assert gemini[col("per event x pass-through")] == pytest.approx(2.0)
    door = rows[("messages", "openai")]
    assert door[col("per event x pass-through")] == pytest.approx(65 / 30)
    assert rows[("messages", "anthropic (pass-through)")][col("extra µs/event")] == 0.0


def test_the_rows_make_a_whole_report_section() -> None:
    costs = [cost("chat", k, n, 1.0 + n / 100) for k in ("openai", "anthropic") for n in (10, 200)]
    section = report.Section("translation_fit", "t", FIT_COLUMNS, fit_rows(lines(costs)))
    assert report.problems([report.Part("translation", [section])]) == []
    assert Line(1.0, 2.0, 0.0).per_event_us == 2.0


# -- bench/cpu/translation_split.py's pure parts ------------------------------------------------


def test_the_split_asks_each_upstream_in_its_own_dialect() -> None:
    path, body = split.upstream_call("chat", "anthropic", "m-anthropic")
    assert path == "/v1/messages" and body["model"] == "m-anthropic" and body["stream"] is True
    assert body["max_tokens"] == 1024 and "stream_options" not in body
    path, body = split.upstream_call("chat", "gemini", "m-gemini")
    assert path == "/v1beta/models/m-gemini:streamGenerateContent?alt=sse"
    assert "contents" in body and "messages" not in body
    path, body = split.upstream_call("messages", "openai", "m-openai")
    assert path == "/v1/chat/completions" and body["stream_options"] == {"include_usage": True}
    path, body = split.upstream_call("messages", "anthropic", "m-anthropic")
    assert path == "/v1/messages" and body == {
        **split.messages_request(True),
        "model": "m-anthropic",
    }


def test_the_split_translates_as_the_transport_chains_translators() -> None:
    assert split.translator("chat", "openai") is None
    assert split.translator("messages", "anthropic") is None
    assert isinstance(split.translator("chat", "anthropic"), anthropic.StreamToChat)
    assert isinstance(split.translator("chat", "gemini"), gemini.StreamToChat)
    assert isinstance(split.translator("messages", "openai"), anthropic_door.ChatToStream)
    chained = split.translator("messages", "gemini")
    assert isinstance(chained, Chained)
    assert isinstance(chained.first, gemini.StreamToChat)
    assert isinstance(chained.second, anthropic_door.ChatToStream)


def test_the_split_rows_give_the_translators_share_of_the_gateways_extra() -> None:
    def steps(translator_us: float) -> dict[str, Line]:
        return {
            s: Line(0.05, translator_us if s == "translator" else 2.0, 0.0) for s in split.STEPS
        }

    rows = split.rows(
        {
            ("chat", "openai"): steps(0.0),
            ("chat", "gemini"): steps(10.0),
            ("chat", "anthropic"): steps(8.0),
        },
        {("chat", "openai"): 0.0, ("chat", "gemini"): 20.0, ("chat", "anthropic"): -3.0},
    )
    assert all(len(r) == len(split.COLUMNS) for r in rows)
    share = split.COLUMNS.index("translator % of the extra")
    fixed = split.COLUMNS.index("translator fixed µs/stream")
    assert (
        rows[0][1] == "openai (pass-through)" and rows[0][share] is None and rows[0][fixed] is None
    )
    assert rows[1][share] == pytest.approx(50.0) and rows[1][fixed] == pytest.approx(50.0)
    assert rows[2][share] is None  # no extra measured: no share of it


def test_a_cases_calls_are_shared_out_over_its_parts_to_the_last_call() -> None:
    assert [share(480, 4, i) for i in range(4)] == [120, 120, 120, 120]
    assert [share(10, 4, i) for i in range(4)] == [3, 3, 2, 2]
    assert [share(3, 4, i) for i in range(4)] == [1, 1, 1, 0]
    assert sum(share(161, 2, i) for i in range(2)) == 161
