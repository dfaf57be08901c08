"""How sure a difference of tail latencies is: a paired, blocked bootstrap. Pure: numbers in,
numbers out, no I/O and no clock.

A p99.9 of N calls rests on its N/1000 slowest, and on a shared machine those come in bursts
(another process's work, a garbage collection) that hit a few hundred consecutive calls. So
the calls of one setup are not independent draws, and the interval of a difference of two
p99.9 must resample what varies together:

- a *rotation* is one turn of every setup, one round each, back to back: the setups of a
  rotation ran within a fraction of a second of each other, so they are resampled together
  (paired), and a rotation during which other processes kept the cores busy is left out of
  every setup alike (``quiet``, decided from the machine's counters, never from latencies);
- a *block* is a few consecutive rotations of one session: bursts longer than a rotation stay
  whole;
- a *session* is one set of freshly started stacks: what one process happens to be (which of
  its workers holds nginx's connections, its hash seed) is fixed for its life, so sessions are
  resampled too (two levels: sessions, then blocks within each).

The interval is the 2.5th to 97.5th percentile of the bootstrap's differences. Quantiles are
by nearest rank, as ``bench.kit.loadgen.pct``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

Rotation = dict[str, list[float]]  # setup -> the seconds of its round's calls


@dataclass(frozen=True)
class Interval:
    point: float  # the difference measured, ms
    low: float  # 95 % bootstrap interval, ms
    high: float


def quantile(samples: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank, in ms; NaN for none (``bench.kit.loadgen.pct``)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[_rank(len(ordered), q)] * 1000


def _rank(n: int, q: float) -> int:
    return min(n - 1, int(q * n))


def blocks(sessions: Sequence[Sequence[Rotation]], length: int) -> list[list[list[Rotation]]]:
    """Each session's rotations cut into blocks of ``length`` consecutive ones."""
    return [[list(s[i : i + length]) for i in range(0, len(s), length)] for s in sessions if s]


class _Tail:
    """One setup's slowest calls, each with its block, for the quantile of a resample: a
    resample weighs each block by how often it was drawn, so its q-quantile is found by
    walking down the slowest calls and counting weights, without sorting all of them again.
    """

    def __init__(self, setup: str, flat: list[list[Rotation]], q: float) -> None:
        self.q = q
        self.sizes = [sum(len(r[setup]) for r in block) for block in flat]
        calls = [(t, b) for b, block in enumerate(flat) for r in block for t in r[setup]]
        calls.sort(reverse=True)
        self.all = calls
        # Enough for any resample but the most lopsided (then: the full walk below).
        self.top = calls[: max(64, 20 * (len(calls) - _rank(len(calls), q)))]

    def quantile(self, weights: list[int]) -> float:
        n = sum(w * s for w, s in zip(weights, self.sizes, strict=True))
        if n == 0:
            return math.nan
        above = n - 1 - _rank(n, self.q)  # calls slower than the quantile's
        for calls in (self.top, self.all):
            seen = 0
            for t, b in calls:
                seen += weights[b]
                if seen > above:
                    return t * 1000
        return math.nan  # not reached: the weights sum to n over ``all``


def difference(
    sessions: Sequence[Sequence[Rotation]],
    setup: str,
    base: str,
    *,
    q: float = 0.999,
    block: int = 10,
    resamples: int = 1000,
    seed: int = 0,
) -> Interval:
    """``setup``'s q-quantile minus ``base``'s over all the rotations given, with its 95 %
    interval: sessions resampled, then blocks of ``block`` rotations within each."""
    cut = blocks(sessions, block)
    flat = [b for session in cut for b in session]
    first = [sum(len(s) for s in cut[:i]) for i in range(len(cut))]  # each session's first
    tails = _Tail(setup, flat, q), _Tail(base, flat, q)
    weights = [1] * len(flat)
    point = tails[0].quantile(weights) - tails[1].quantile(weights)
    rng = random.Random(seed)
    found = []
    for _ in range(resamples):
        weights = [0] * len(flat)
        for s in (rng.randrange(len(cut)) for _ in cut):
            size = len(cut[s])
            for _ in range(size):
                weights[first[s] + rng.randrange(size)] += 1
        found.append(tails[0].quantile(weights) - tails[1].quantile(weights))
    found = sorted(d for d in found if not math.isnan(d))
    if not found:
        return Interval(point, math.nan, math.nan)
    return Interval(point, found[int(0.025 * len(found))], found[int(0.975 * len(found)) - 1])
