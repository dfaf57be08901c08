"""One path's run at one load, as bench/load/overhead.py measured it, and two halves of a run
made one. Pure: numbers in, numbers out; bench/load/overhead_table.py reads them into the
section's table, targets and plots."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from bench.kit import loadgen
from bench.kit.loadgen import pct


def summary(samples: list[float]) -> dict[str, float]:
    """The samples' count, and their mean, percentiles and largest in ms."""
    return {
        "n": len(samples),
        "mean": statistics.fmean(samples) * 1000 if samples else math.nan,
        **{f"p{round(q * 100)}": pct(samples, q) for q in (0.5, 0.9, 0.99)},
        "max": max(samples) * 1000 if samples else math.nan,
    }


@dataclass
class Measured:
    path: str
    kind: str
    callers: int
    result: loadgen.Result
    cpu_ms: float | None  # per request, the path's process tree
    upstream_per_1000: float | None
    others: float  # the share of all cores other processes used meanwhile
    # Upstream connections closed per 1,000 requests: opened less what the simulator's open
    # count grew by. A pool that keeps every connection it opened closes none.
    closed_per_1000: float | None = None
    # Memcached's CPU per request (gateway+keys' limits), apart from ``cpu_ms``.
    memcached_cpu_ms: float | None = None
    # Each half's CPU per request (``merge``), in the order run: the spread within one run.
    halves_cpu_ms: tuple[float, ...] = ()

    def row_data(self) -> dict:
        r = self.result
        return {
            "path": self.path,
            "kind": self.kind,
            "callers": self.callers,
            "requests": len(r.total),
            "errors": len(r.errors),
            "first_errors": r.errors[:3],
            "ttft_ms": summary(r.ttft),
            "total_ms": summary(r.total),
            "rps": r.rps,
            "cpu_ms_per_request": self.cpu_ms,
            "cpu_ms_per_request_halves": list(self.halves_cpu_ms),
            "memcached_cpu_ms_per_request": self.memcached_cpu_ms,
            "upstream_connections_per_1000": self.upstream_per_1000,
            "upstream_connections_closed_per_1000": self.closed_per_1000,
            "loadgen_core_share": r.load,
            "others_cores_share": self.others,
        }


def merge(a: Measured, b: Measured) -> Measured:
    """One path's two halves as one run: samples pooled, per-request figures weighted."""
    ra, rb = a.result, b.result
    na, nb = max(1, len(ra.total)), max(1, len(rb.total))

    def mean(x: float | None, y: float | None, wx: float, wy: float) -> float | None:
        return None if x is None or y is None else (x * wx + y * wy) / (wx + wy)

    result = loadgen.Result(
        ra.ttft + rb.ttft,
        ra.total + rb.total,
        ra.errors + rb.errors,
        ra.wall + rb.wall,
        ra.cpu + rb.cpu,
    )
    return Measured(
        a.path,
        a.kind,
        a.callers,
        result,
        mean(a.cpu_ms, b.cpu_ms, na, nb),
        mean(a.upstream_per_1000, b.upstream_per_1000, na, nb),
        mean(a.others, b.others, ra.wall, rb.wall) or 0.0,
        mean(a.closed_per_1000, b.closed_per_1000, na, nb),
        mean(a.memcached_cpu_ms, b.memcached_cpu_ms, na, nb),
        (a.cpu_ms, b.cpu_ms) if a.cpu_ms is not None and b.cpu_ms is not None else (),
    )
