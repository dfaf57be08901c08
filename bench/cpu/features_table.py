"""The features section's calls, table and targets (bench/cpu/features.py measures them).

Each row is one call of the app with some of its features on, measured against the same
call without the feature it adds (``Variant.over``): a feature's cost is its row's CPU per
call over that row's, both measured in the same run. The features on together (a gateway
key, its limits, the log line, the metrics: issue 45's "features on") over none at all is
the target, at most ``TARGET`` times, for non-stream calls and for streams; every row's
ratio to the floor (bench/floor/app.py, the same call relayed and nothing else) is a figure,
not a target.

Pure arithmetic over what the measuring processes returned: each variant's best round (the
least CPU per call any of its rounds took: a round is slowed by the machine's other work,
never sped up), the ratios of best rounds, and each turn's ratio of its own best rounds, so
the report shows how far one turn's ratio is from another's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.kit.report import Cell, Check

KINDS = ("non-stream", "stream")
FLOOR = "floor"  # the floor app in place of the gateway (not a feature of the gateway)
FEATURES = ("metrics", "log", "key", "limits", "resumable", "traces")
# Not among every feature's: the upstream named by a file (the continuation's setting lives
# there) instead of LLMGATE_UPSTREAM_URL, and a continuation set that no stream uses.
ON = frozenset({"metrics", "log", "key", "limits"})  # issue 45: "features on"
TARGET = 1.10  # issue 45: features on, at most this many times the call's CPU without them
COLUMNS = ["call", "over", "non-stream µs", "non-stream x", "stream µs", "stream x",
           "non-stream x floor", "stream x floor"]  # fmt: skip


@dataclass(frozen=True)
class Variant:
    """One measured call: the features on (or the floor app), the row it is measured over."""

    name: str
    features: frozenset[str]
    over: str  # the variant without this one's feature ("": none, the floor itself)
    stream_only: bool = False  # a feature a non-stream call does not have

    def kinds(self) -> tuple[str, ...]:
        return ("stream",) if self.stream_only else KINDS


VARIANTS = (
    Variant(FLOOR, frozenset({FLOOR}), ""),
    Variant("none", frozenset(), FLOOR),
    Variant("metrics", frozenset({"metrics"}), "none"),
    Variant("log line", frozenset({"log"}), "none"),
    Variant("key, no limits", frozenset({"key"}), "none"),
    Variant("key's limits", frozenset({"key", "limits"}), "key, no limits"),
    Variant("resumable", frozenset({"resumable"}), "none", stream_only=True),
    Variant("traces", frozenset({"traces"}), "none"),
    Variant("upstreams file", frozenset({"file"}), "none"),
    Variant("continuation, unused", frozenset({"file", "continuation"}), "upstreams file"),
    Variant("features on", ON, "none"),
    Variant("every feature", frozenset(FEATURES), "none"),
)
BY_NAME = {v.name: v for v in VARIANTS}

# What one measuring process returned: kind -> CPU µs per call of each of its rounds.
Rounds = dict[str, list[float]]


def best(turns: list[Rounds], kind: str) -> float:
    """A variant's figure for ``kind``: its least CPU per call over every round of every
    turn (NaN when it was not measured)."""
    found = [us for turn in turns for us in turn.get(kind, [])]
    return min(found) if found else math.nan


def ratio(runs: dict[str, list[Rounds]], name: str, over: str, kind: str) -> float:
    """``name``'s best over ``over``'s best for ``kind`` (NaN if either is missing)."""
    if name not in runs or over not in runs:
        return math.nan
    below = best(runs[over], kind)
    return best(runs[name], kind) / below if below else math.nan


def turn_ratios(runs: dict[str, list[Rounds]], name: str, over: str, kind: str) -> list[float]:
    """The same ratio within each turn: the turn's best round of ``name`` over the turn's
    best round of ``over``."""
    pairs = zip(runs.get(name, []), runs.get(over, []), strict=False)
    return [min(a[kind]) / min(b[kind]) for a, b in pairs if a.get(kind) and b.get(kind)]


def _cell(value: float) -> float | None:
    return None if math.isnan(value) else value


def rows(runs: dict[str, list[Rounds]]) -> list[list[Cell]]:
    """One row per variant measured: its CPU per call and ratio over the call without its
    feature, for each kind, and its ratio to the floor's."""
    out: list[list[Cell]] = []
    for v in VARIANTS:
        if v.name not in runs:
            continue
        row: list[Cell] = [v.name, v.over or None]
        for kind in KINDS:
            us = best(runs[v.name], kind)
            row += [_cell(us), _cell(ratio(runs, v.name, v.over, kind)) if v.over else None]
        for kind in KINDS:
            row.append(_cell(ratio(runs, v.name, FLOOR, kind)) if v.name != FLOOR else None)
        out.append(row)
    return out


def checks(runs: dict[str, list[Rounds]]) -> list[Check]:
    """Issue 45's target for each kind: the features on over none, CPU per call."""
    return [
        Check(
            f"{kind}, features on (key, limits, log line, metrics): CPU per call",
            "<=",
            TARGET,
            ratio(runs, "features on", "none", kind),
            "x without",
        )
        for kind in KINDS
    ]


def missed(runs: dict[str, list[Rounds]]) -> list[str]:
    """Each row over ``TARGET`` times the call without its feature: by how much."""
    out = []
    for v in VARIANTS:
        for kind in v.kinds():
            r = ratio(runs, v.name, v.over, kind) if v.over and v.over != FLOOR else math.nan
            if r > TARGET:
                out.append(f"{v.name} ({kind}) {r:.2f}x {v.over}'s")
    return out
