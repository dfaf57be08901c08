"""The translated calls' section (bench/cpu/translation.py measures): the cases, the fit of CPU
per call against the events of a stream, and the rows. No I/O here, no clock.

A case is a door (``chat``: /v1/chat/completions, ``messages``: /v1/messages), an upstream
kind, stream or not, and the tokens asked for. Its pass-through is the same call to the
upstream that speaks the door's dialect (OpenAI for chat, Anthropic for messages), where the
gateway relays the provider's bytes as they are; every other kind is translated.

A stream's CPU per call is fitted as ``fixed + per_event * tokens`` by least squares over
the sizes measured (each token is one provider event in and one event out; the few framing
events a stream has whatever its length fall in ``fixed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from bench.kit.report import Cell

# Each door's kinds, its pass-through first.
DOORS = {"chat": ("openai", "anthropic", "gemini"), "messages": ("anthropic", "openai", "gemini")}


@dataclass(frozen=True)
class Case:
    door: str  # "chat" | "messages"
    kind: str  # the upstream's: "openai" | "anthropic" | "gemini"
    stream: bool
    tokens: int

    @property
    def passthrough(self) -> bool:
        return self.kind == DOORS[self.door][0]

    def baseline(self) -> Case:
        """The same call to the upstream that speaks the door's dialect."""
        return replace(self, kind=DOORS[self.door][0])

    @property
    def label(self) -> str:
        call = f"stream of {self.tokens}" if self.stream else "whole"
        return f"{self.door} over {self.kind}, {call}"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.door == "chat" else "/v1/messages"


def cases(sizes: tuple[int, ...], whole_tokens: int) -> list[Case]:
    """Every door and kind: a stream at each size, and one answer not streamed."""
    out = []
    for door, kinds in DOORS.items():
        for kind in kinds:
            out += [Case(door, kind, True, n) for n in sizes]
            out.append(Case(door, kind, False, whole_tokens))
    return out


@dataclass(frozen=True)
class Cost:
    """What one case cost over its measured calls (CPU seconds, idle use taken out)."""

    case: Case
    calls: int  # answered with a 200
    errors: int
    workers_s: float  # gunicorn's workers
    nginx_s: float  # nginx's master and workers
    others: float  # the share of all cores other processes used meanwhile, 0..1
    upstream: dict[str, int] = field(default_factory=dict)  # simulator's calls by dialect

    @property
    def workers_ms(self) -> float:
        """The workers' CPU per answered call, ms (NaN for none answered)."""
        return 1000 * self.workers_s / self.calls if self.calls else math.nan

    @property
    def nginx_ms(self) -> float:
        return 1000 * self.nginx_s / self.calls if self.calls else math.nan


def share(count: int, parts: int, part: int) -> int:
    """Part ``part``'s calls of ``count`` shared out over ``parts``: as even as can be, the
    first parts taking the remainder, all of them adding up to ``count``."""
    return count // parts + (1 if part < count % parts else 0)


def merge(a: Cost, b: Cost) -> Cost:
    """One case's two parts as one run: CPU and calls added, noise weighted by calls."""
    calls = a.calls + b.calls
    weight = (a.others * a.calls + b.others * b.calls) / calls if calls else 0.0
    upstream = {k: a.upstream.get(k, 0) + b.upstream.get(k, 0) for k in a.upstream | b.upstream}
    return Cost(
        a.case,
        calls,
        a.errors + b.errors,
        a.workers_s + b.workers_s,
        a.nginx_s + b.nginx_s,
        weight,
        upstream,
    )


@dataclass(frozen=True)
class Line:
    """``fixed_ms + per_event_us * events / 1000`` ms per call, and how far the measured
    points lie from it (the largest gap, ms; 0 with two sizes: the line goes through both)."""

    fixed_ms: float
    per_event_us: float
    residual_ms: float


def fit(points: list[tuple[float, float]]) -> Line:
    """Least squares over (events, ms per call); NaN when fewer than two distinct sizes."""
    points = [(x, y) for x, y in points if math.isfinite(y)]
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return Line(math.nan, math.nan, math.nan)
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    fixed = my - slope * mx
    residual = max(abs(y - (fixed + slope * x)) for x, y in points)
    return Line(fixed, slope * 1000, residual)


def ratio(value: float, base: float) -> float | None:
    return value / base if base and math.isfinite(value) and math.isfinite(base) else None


def measured_rows(costs: list[Cost]) -> list[list[Cell]]:
    """Per case: CPU per call of the workers and of nginx, against the pass-through's."""
    by = {c.case: c for c in costs}
    rows: list[list[Cell]] = []
    for c in costs:
        base = by.get(c.case.baseline())
        calls = ", ".join(f"{k} {v}" for k, v in sorted(c.upstream.items()) if v)
        rows.append(
            [
                c.case.door,
                c.case.kind + (" (pass-through)" if c.case.passthrough else ""),
                "stream" if c.case.stream else "whole",
                c.case.tokens,
                c.calls,
                c.errors,
                c.workers_ms,
                None if base is None else ratio(c.workers_ms, base.workers_ms),
                c.nginx_ms,
                calls,
                c.others * 100,
            ]
        )
    return rows


MEASURED_COLUMNS = [
    "door",
    "upstream",
    "call",
    "tokens",
    "calls",
    "errors",
    "workers CPU ms/call",
    "x pass-through",
    "nginx CPU ms/call",
    "upstream calls (simulator)",
    "others % cores",
]


def lines(costs: list[Cost]) -> dict[tuple[str, str], Line]:
    """Each door and kind's streams fitted over their sizes."""
    out = {}
    for door, kinds in DOORS.items():
        for kind in kinds:
            points = [
                (float(c.case.tokens), c.workers_ms)
                for c in costs
                if c.case.stream and c.case.door == door and c.case.kind == kind
            ]
            if points:
                out[(door, kind)] = fit(points)
    return out


def extra_us(found: dict[tuple[str, str], Line]) -> dict[tuple[str, str], float]:
    """Each door and kind's µs per event over its door's pass-through's (0 for that one)."""
    out = {}
    for (door, kind), line in found.items():
        base = found.get((door, DOORS[door][0]))
        if base is not None:
            out[(door, kind)] = line.per_event_us - base.per_event_us
    return out


def fit_rows(found: dict[tuple[str, str], Line]) -> list[list[Cell]]:
    """Per door and kind: fixed ms per call and µs per event, each against the pass-through's."""
    rows: list[list[Cell]] = []
    extra = extra_us(found)
    for (door, kind), line in found.items():
        base = found.get((door, DOORS[door][0]))
        rows.append(
            [
                door,
                kind + (" (pass-through)" if kind == DOORS[door][0] else ""),
                line.fixed_ms,
                line.per_event_us,
                None if base is None else ratio(line.fixed_ms, base.fixed_ms),
                None if base is None else ratio(line.per_event_us, base.per_event_us),
                extra.get((door, kind)),
                line.residual_ms,
            ]
        )
    return rows


FIT_COLUMNS = [
    "door",
    "upstream",
    "fixed ms/call",
    "µs/event",
    "fixed x pass-through",
    "per event x pass-through",
    "extra µs/event",
    "largest residual ms",
]
