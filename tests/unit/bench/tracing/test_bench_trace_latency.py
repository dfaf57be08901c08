"""bench/tracing/trace_latency.py's order of the rounds: each stack comes right after each other one
as often, so the CPU a stack leaves behind (the collector's exports spill over into the next
round) falls on all alike. No process here: `make bench-smoke` runs the section."""

from __future__ import annotations

import itertools
import random
from collections import Counter

from bench.tracing.trace_latency import SETUPS, orders


def test_each_stack_follows_each_other_one_as_often() -> None:
    turns = orders(random.Random(0))
    rotations = [next(turns) for _ in range(24 * 10)]
    assert all(sorted(r) == sorted(SETUPS) for r in rotations)
    within = Counter(pair for r in rotations for pair in itertools.pairwise(r))
    assert set(within) == set(itertools.permutations(SETUPS, 2))
    assert set(within.values()) == {6 * 10}
    # Across rotations too (the last round of one, the first of the next): about as often.
    across = Counter((a[-1], b[0]) for a, b in itertools.pairwise(rotations))
    after_collector = [across[("collector", s)] for s in SETUPS if s != "collector"]
    assert min(after_collector) >= 8, after_collector  # ~20 each of 239; a fixed cycle: 0
