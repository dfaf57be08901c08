"""bench/cpu/ab.py's summary: each side's mean with its runs, and B over A; bench/floor/turns.py's
on top."""

from __future__ import annotations

from bench.cpu.ab import Run, summarize
from bench.floor import turns as floor


def test_the_summary_gives_each_sides_runs_mean_and_the_ratio() -> None:
    runs = [
        Run("A", "stream", 10.0, 70.0, 0, 0.25),
        Run("B", "stream", 9.0, 70.0, 0),
        Run("A", "stream", 12.0, 69.0, 1, 0.031),
        Run("B", "stream", 9.0, 71.0, 0),
        Run("A", "non-stream", 2.0, 600.0, 0),
        Run("B", "non-stream", 2.2, 610.0, 0),
    ]
    lines = summarize(runs, "A", "B")
    assert lines[0].split()[:3] == ["stream", "A", "11.00"] and "[10.00, 12.00]" in lines[0]
    assert "errors 1" in lines[0] and "errors 0" in lines[1]
    # How much of the cores other processes used during each run: the noise beside it.
    assert lines[0].endswith("others [25, 3] % of the cores")
    assert lines[2].endswith("B / A: 0.818 (-18.2 %)")
    assert lines[5].endswith("B / A: 1.100 (+10.0 %)")


def test_the_floor_summary_gives_the_gateways_own_work_and_its_ratio_to_the_floor() -> None:
    runs = [
        Run("gateway", "stream", 6.0, 200.0, 0),
        Run("floor", "stream", 4.0, 200.0, 0),
        Run("gateway", "stream", 6.4, 200.0, 0),
        Run("floor", "stream", 4.0, 200.0, 0),
    ]
    lines = floor.summarize(runs)
    assert lines[2].endswith("floor / gateway: 0.645 (-35.5 %)")
    # 6.2 - 4.0 = 2.2 ms of the gateway's own (35 % of 6.2); 6.2 / 4.0 = 1.55x the floor's.
    assert lines[3] == (
        "stream     the gateway's own work: 2.20 ms/call (35 % of its CPU); "
        "gateway 1.55x the floor, target ≤ 1.10x"
    )
