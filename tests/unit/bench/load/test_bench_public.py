"""bench/load/public.py's figures as the public method defines them: a step is within the
bounds only under 1 s p99 and under 0.1 % errors; the sustained figure is the best such
step, not the last; the tail's stages are the Server-Timing of the calls at or past p99."""

from __future__ import annotations

import pytest

from bench.load.public import Step, best, tail_stages


def _step(callers: int, rps: float, p99_ms: float, errors: int = 0, calls: int = 10_000) -> Step:
    return Step(
        callers=callers,
        calls=calls,
        rps=rps,
        p50_ms=p99_ms / 2,
        p95_ms=p99_ms,
        p99_ms=p99_ms,
        errors={"HTTP 502": errors} if errors else {},
        new_conns_per_1000=0.0,
    )


def test_a_step_is_within_the_bounds_only_under_one_second_and_a_thousandth_of_errors() -> None:
    assert _step(50, 1000, 999.9).passes
    assert not _step(50, 1000, 1000.0).passes
    assert _step(50, 1000, 10, errors=9).passes  # 9 in 10,009
    assert not _step(50, 1000, 10, errors=11).passes  # 11 in 10,011
    assert _step(800, 1600, 100).fair_bound_ms == pytest.approx(1000.0)


def test_the_sustained_figure_is_the_best_step_within_the_bounds() -> None:
    steps = [_step(50, 900, 80), _step(200, 1500, 300), _step(800, 1600, 3700)]
    top = best(steps)
    assert top is not None and top.callers == 200
    assert best([_step(800, 1600, 3700)]) is None


def test_the_tail_is_the_server_timing_of_the_calls_at_or_past_p99() -> None:
    kept = [
        (0.010, "queue;dur=1.0, work;dur=0.5, gateway;dur=1.5"),
        (0.900, "queue;dur=800.0, work;dur=1.0, gateway;dur=801.0"),
        (1.100, "queue;dur=1000.0, work;dur=3.0, gateway;dur=1003.0"),
        (1.200, ""),  # an answer without the header: not counted
    ]
    tail = tail_stages(kept, p99_s=0.9)
    assert tail == {"gateway": 902.0, "queue": 900.0, "work": 2.0, "total": 1000.0}
    assert tail_stages(kept, p99_s=2.0) == {}
