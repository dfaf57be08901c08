"""The benchmark report's contract: what a bench module hands over, and how it is written.

`python -m bench` (`make bench`) runs the report's modules in the order of ``MODULES``; each
one that exists is imported and asked for its part:

    def run(cfg: Config) -> Section | list[Section]

- ``cfg.smoke``: `make bench-smoke` (CI). The same code paths at tiny sizes, the whole report
  in under a minute: a module takes a few seconds at most. Nothing checks speed then; the
  report must only have every section, with non-empty rows and finite numbers.
- ``cfg.out_dir``: this run's directory (bench/results/<date>/). A module writes its PNG
  plots there (``plots.figure`` in bench/plots.py sets matplotlib up headless) and names
  them in ``Section.plots`` by file name.
- ``cfg.progress(line)``: one line per step ("overhead: stream, 200 callers, gateway"), so a
  15-minute run shows where it is.
- A module starts and stops its own processes (runner.stack.Stack on free loopback ports)
  and leaves nothing running, even when it fails.

A ``Section`` is the module's table, its raw numbers and its verdicts:

- ``rows`` under ``columns``: cells are str, int, float or None (shown as "—"); floats are
  printed with ``Section.fmt``. Every number comes from the run, never a constant.
- ``checks``: the targets of issue 11's table this section measures. A target is a constant
  (``Check.target``, with the comparison ``op``), the measured value is not; the report says
  met / not met and the measured-to-target ratio.
- ``data``: JSON-able raw numbers (samples' percentiles, counts, settings), written to
  results.json under ``key``.
- ``notes``: markdown lines under the table (method, what a number means, caveats).

A module that is absent (not written yet) is listed as such in the report; one that raises
is reported with its error, and `make bench-smoke` fails on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Report order. overhead/cache_hits: the relay's cost against direct and nginx-only;
# capacity/http2: open streams through `make run`'s shape and HTTP/2 at nginx;
# seed: the seed table over TLS and a WAN round trip.
MODULES = ("overhead", "cache_hits", "capacity", "http2", "seed")

Cell = str | int | float | None


@dataclass(frozen=True)
class Config:
    out_dir: Path
    smoke: bool = False
    progress: Callable[[str], None] = print


@dataclass(frozen=True)
class Check:
    """One target of the issue's table against what this run measured."""

    what: str  # "stream, 200 callers: added TTFT p50"
    op: str  # "<=" or ">="
    target: float
    measured: float
    unit: str = ""  # "ms", "x direct", "req/s", "KB" ...

    @property
    def met(self) -> bool:
        return self.measured <= self.target if self.op == "<=" else self.measured >= self.target

    @property
    def ratio(self) -> float:
        """Measured over target (NaN for a zero target)."""
        return self.measured / self.target if self.target else math.nan


@dataclass(frozen=True)
class Plot:
    file: str  # a PNG in cfg.out_dir
    caption: str


@dataclass
class Section:
    key: str  # results.json key and plot file prefix: "overhead", "capacity" ...
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    data: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fmt: str = ".2f"
