"""bench/tracing/tail_stats.py: the quantile of a weighted resample is the one of the calls it
stands for; a difference's interval is paired (a burst both setups met cancels), and it
resamples sessions, so what one set of processes happened to be widens it. Seeded draws, no
timing."""

from __future__ import annotations

import random

from bench.tracing import tail_stats
from bench.tracing.tail_stats import Rotation, difference, quantile


def _sessions(
    draw: random.Random, sessions: int, rotations: int, calls: int
) -> list[list[Rotation]]:
    """Rotations of two setups; a heavy tail (1 call in 200 is 5-40 ms slower)."""

    def call() -> float:
        slow = draw.uniform(0.005, 0.040) if draw.random() < 0.005 else 0.0
        return draw.uniform(0.002, 0.004) + slow

    return [
        [
            {"a": [call() for _ in range(calls)], "b": [call() for _ in range(calls)]}
            for _ in range(rotations)
        ]
        for _ in range(sessions)
    ]


def test_a_resamples_quantile_is_the_quantile_of_the_calls_it_stands_for() -> None:
    draw = random.Random(7)
    sessions = _sessions(draw, 3, 40, 25)
    cut = tail_stats.blocks(sessions, 4)
    flat = [block for session in cut for block in session]
    for q in (0.5, 0.99, 0.999):
        tail = tail_stats._Tail("a", flat, q)
        for _ in range(30):
            weights = [draw.choice((0, 0, 1, 1, 2, 5)) for _ in flat]
            expanded = [t for w, block in zip(weights, flat, strict=True)
                        for _ in range(w) for r in block for t in r["a"]]  # fmt: skip
            assert tail.quantile(weights) == quantile(expanded, q)


def test_a_shift_of_every_call_is_measured_exactly() -> None:
    sessions = _sessions(random.Random(1), 2, 30, 50)
    for session in sessions:
        for rotation in session:
            rotation["b"] = [t + 0.003 for t in rotation["a"]]
    got = difference(sessions, "b", "a", block=5, resamples=200)
    assert round(got.point, 6) == round(got.low, 6) == round(got.high, 6) == 3.0


def test_a_burst_both_setups_met_cancels_out() -> None:
    """Pairs: in a rotation with a burst (a neighbour's work) both setups meet it. Resampled
    apart, the bursts would fall unevenly on the two: an interval of -8 to +10 ms here."""
    draw = random.Random(3)
    sessions = _sessions(draw, 2, 200, 50)
    for session in sessions:
        for rotation in session:
            if draw.random() < 0.02:  # 20 calls of both 5 to 50 ms slower
                burst = draw.uniform(0.005, 0.050)
                for setup in ("a", "b"):
                    rotation[setup][:20] = [t + burst for t in rotation[setup][:20]]
    got = difference(sessions, "b", "a", block=1, resamples=300)
    assert got.low <= 0 <= got.high
    assert got.high - got.low < 8, got


def test_a_difference_one_session_alone_showed_is_not_taken_for_sure() -> None:
    """Session 1's b is 10 ms slower in its tail, session 2's is not: two sessions cannot
    say which is the rule, and the interval must hold both (resampling the blocks of each
    session alone gives 2 to 10 ms)."""
    draw = random.Random(5)
    sessions = _sessions(draw, 2, 200, 50)
    for rotation in sessions[0]:
        rotation["b"] = [t + 0.010 if t > 0.006 else t for t in rotation["b"]]
    got = difference(sessions, "b", "a", block=10, resamples=400)
    assert got.low < 1 and got.high > 9, got
