"""bench/ab.py's summary: each side's mean with its runs, and B over A."""

from __future__ import annotations

from bench.ab import Run, summarize


def test_the_summary_gives_each_sides_runs_mean_and_the_ratio() -> None:
    runs = [
        Run("A", "stream", 10.0, 70.0, 0),
        Run("B", "stream", 9.0, 70.0, 0),
        Run("A", "stream", 12.0, 69.0, 1),
        Run("B", "stream", 9.0, 71.0, 0),
        Run("A", "non-stream", 2.0, 600.0, 0),
        Run("B", "non-stream", 2.2, 610.0, 0),
    ]
    lines = summarize(runs, "A", "B")
    assert lines[0].split()[:3] == ["stream", "A", "11.00"] and "[10.00, 12.00]" in lines[0]
    assert "errors 1" in lines[0] and "errors 0" in lines[1]
    assert lines[2].endswith("B / A: 0.818 (-18.2 %)")
    assert lines[5].endswith("B / A: 1.100 (+10.0 %)")
