"""The seed table's arithmetic: percentiles, ratios and what a round trip costs. No I/O here.

A new HTTPS connection costs round trips before its request can leave: one for TCP's
handshake, then TLS's (one for TLS 1.3, two for TLS 1.2's full handshake; RFC 8446 section 2
and RFC 5246 section 7.3). A reused connection skips them, so its saving is that many RTTs
whatever the server does; the request's own round trip and the server's time are paid
either way. Streaming saves something else: the time between the first token and the last,
which is the answer's length over the model's speed and does not depend on the RTT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Round trips a new connection spends before its request can be sent: TCP + TLS.
HANDSHAKE_RTTS = {"TLSv1.3": 2, "TLSv1.2": 3}

# The figures our users read, as the seed table's rows (a) naive, (b) pooled, (c) streaming's
# first token, in ms. No RTT came with them: the report says which RTT each step needs.
CLAIM_MS = (3200.0, 2100.0, 1500.0)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (the smallest sample with at least ``q`` of them at or below
    it): p50 of 50 samples is the 25th, p99 of 50 the largest. NaN for no samples."""
    if not 0 <= q <= 1:
        raise ValueError(f"percentile {q} outside [0, 1]")
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p95 and p99 of ``samples`` (same unit as the samples)."""
    mean = sum(samples) / len(samples) if samples else math.nan
    return {
        "mean": mean,
        "p50": percentile(samples, 0.50),
        "p95": percentile(samples, 0.95),
        "p99": percentile(samples, 0.99),
    }


def ratio(value: float | None, base: float | None) -> float | None:
    """``value / base``; None when either is missing, NaN when the base is zero."""
    if value is None or base is None:
        return None
    return value / base if base else math.nan


def reuse_saving_ms(rtt_ms: float, tls_version: str) -> float:
    """What a reused connection saves per call against a new one, at this RTT."""
    return HANDSHAKE_RTTS[tls_version] * rtt_ms


def rtt_needed_ms(saving_ms: float, tls_version: str) -> float:
    """The RTT at which connection reuse alone saves ``saving_ms`` per call."""
    return saving_ms / HANDSHAKE_RTTS[tls_version]


def saving_in_rtts(saving_ms: float, rtt_ms: float, at_zero_ms: float = 0.0) -> float | None:
    """A measured saving counted in round trips (2 expected for TLS 1.3, 3 for TLS 1.2),
    less ``at_zero_ms``, what a new connection costs with no RTT at all (CPU: reading the
    roots, the handshake's crypto). None at RTT 0."""
    return (saving_ms - at_zero_ms) / rtt_ms if rtt_ms else None


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x: the saving per ms of RTT, in RTTs. None without two
    distinct x values."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def claim_lines(claim_ms: Sequence[float] = CLAIM_MS) -> list[str]:
    """What the claim's steps need: the RTT for the reuse step, the answer for streaming's."""
    naive, pooled, first_token = claim_ms
    reuse = naive - pooled
    stream = pooled - first_token
    return [
        f"{naive:.0f} → {pooled:.0f} ms (connection reuse, {reuse:.0f} ms): needs an RTT of "
        f"{rtt_needed_ms(reuse, 'TLSv1.3'):.0f} ms with TLS 1.3, "
        f"{rtt_needed_ms(reuse, 'TLSv1.2'):.0f} ms with TLS 1.2.",
        f"{pooled:.0f} → {first_token:.0f} ms (streaming's first token, {stream:.0f} ms): no "
        f"RTT makes it; it is the generation after the first token, e.g. "
        f"{stream / 10:.0f} tokens at 100 tokens/s.",
    ]
