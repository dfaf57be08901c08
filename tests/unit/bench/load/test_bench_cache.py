"""The cache section's hits target is issue 25's: the gateway's L1 hits per second over the
floor's, both rows of the same run (fabricated rows here, no process)."""

from __future__ import annotations

import pytest

from bench.kit.report import Cell
from bench.load import cache


def row(name: str, p50: float, rps: float) -> list[Cell]:
    # path, callers, answers, errors, p50, p99, req/s, CPU, generator %, others %
    return [name, 64, 12000, 0, p50, p50 * 3, rps, 0.5, 20.0, 1.0]


def rows() -> list[list[Cell]]:
    return [
        row("direct (no cache)", 800.0, 80.0),
        row("HIT l1", 1.2, 2700.0),
        row("HIT l1, stream", 2.0, 1500.0),
        row("HIT l2 (memcached)", 2.5, 1200.0),
        row("floor: hit", 0.8, 3000.0),
    ]


def test_the_hits_target_is_the_l1_rate_over_the_floors() -> None:
    rate, p50 = cache.checks(rows(), 64)
    assert (rate.what, rate.op, rate.target, rate.unit) == (
        "cache hits through nginx, 64 callers: req/s over the floor's",
        ">=",
        0.9,
        "x floor",
    )
    assert rate.measured == pytest.approx(0.9) and rate.met  # 2,700 / 3,000
    assert (p50.measured, p50.target, p50.met) == (1.2, 15, True)
    slower = rows()
    slower[1][cache.RPS] = 2600.0
    assert not cache.checks(slower, 64)[0].met


def test_the_table_gives_each_rows_rate_over_direct_and_over_the_floor() -> None:
    section = cache.section(rows(), 64, 12000)
    over_direct = section.columns.index("req/s x direct")
    over_floor = section.columns.index("req/s x floor")
    assert all(len(r) == len(section.columns) for r in section.rows)
    by = {r[0]: r for r in section.rows}
    assert by["HIT l1"][over_direct] == pytest.approx(2700 / 80)
    assert by["HIT l1"][over_floor] == pytest.approx(0.9)
    assert by["floor: hit"][over_floor] == pytest.approx(1.0)
    assert [c.unit for c in section.checks] == ["x floor", "ms"]


def test_each_side_of_the_turns_is_its_best_round() -> None:
    """A round is slowed by what else the machine does, never sped up: the most answers a
    second is the side's figure, whichever round it came in."""
    turns = [row("HIT l1", 9.0, 2500.0), row("HIT l1", 7.0, 2900.0), row("HIT l1", 8.0, 2700.0)]
    assert cache.best(turns) is turns[1]


def test_the_notes_and_the_data_keep_every_round_of_the_turns() -> None:
    rates = {"HIT l1": [2500.0, 2900.0], "floor: hit": [3000.0, 3100.0]}
    section = cache.section(rows(), 64, 12000, 2, rates)
    assert section.data["rounds_rps"] == rates
    assert section.notes[-1] == (
        "Each round's hits a second, in the order taken: HIT l1 2500, 2900; floor: hit 3000, 3100."
    )
