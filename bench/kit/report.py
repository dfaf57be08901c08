"""The benchmark report's contract: what a bench module hands over, and how it is written.

`python -m bench` (`make bench`) runs the report's modules in the order of ``MODULES``; each
one that exists is imported and asked for its part:

    def run(cfg: Config) -> Section | list[Section]

- ``cfg.smoke``: `make bench-smoke` (CI). The same code paths at tiny sizes, the whole report
  in under a minute: a module takes a few seconds at most. Nothing checks speed then; the
  report must only have every section, with non-empty rows and finite numbers.
- ``cfg.out_dir``: this run's directory (bench/results/<date>/). A module writes its PNG
  plots there (``plots.figure`` in bench/kit/plots.py sets matplotlib up headless) and names
  them in ``Section.plots`` by file name.
- ``cfg.progress(line)``: one line per step ("overhead: stream, 200 callers, gateway"), so a
  15-minute run shows where it is.
- A module starts and stops its own processes (runner.stack.Stack on free loopback ports)
  and leaves nothing running, even when it fails.

A ``Section`` is the module's table, its raw numbers and its verdicts:

- ``rows`` under ``columns``: cells are str, int, float or None (shown as "—"); floats are
  printed with ``Section.fmt``. Every number comes from the run, never a constant.
- ``checks``: the targets this section measures (issue 11's table; issue 25's against the
  shape's floor). A target is a constant (``Check.target``, with the comparison ``op``), the
  measured value is not; the report says met / not met and the measured-to-target ratio. A
  target relative to the floor stays a constant: the floor is measured in the same run and
  the measured value is the gateway's figure over the floor's ("x floor": CPU per call ≤
  1.10) or less it ("KB over the floor": memory per stream ≤ 10).
- ``data``: JSON-able raw numbers (samples' percentiles, counts), written to results.json
  under ``key``; ``data["settings"]`` (a dict: workers, connections, the simulator's
  controls, sizes) is also printed under the section's table.
- ``notes``: markdown lines under the table (method, what a number means, caveats).

A module that is absent (not written yet) is listed as such in the report; one that raises
is reported with its error, and `make bench-smoke` fails on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Report order: each part's name (`python -m bench --only NAME`) and its module. overhead,
# features, memory, cache: the relay's cost against direct, nginx-only and the floor, each
# feature's CPU over the same call without it (issue 45), a keyed call at 10 callers over the
# same call without a key (issue 45), memory per open
# stream, cache hits; capacity: open streams through `make run`'s shape; http2: HTTP/2 at
# nginx; seed: the seed table over TLS and a WAN round trip; trace_latency: the tail of a
# call with traces on, the collector working, silent or absent; translation: CPU per call and
# per event of calls translated to another dialect (issue 23); prompt_cache: an agent loop over
# three upstreams routed at random, cache-affine and to one only (issue 43); public: the public
# cross-gateway method (issue 45): added p99 at 1 caller, sustained req/s at a 20 ms mock,
# stall-free streams, translated req/s.
MODULES = {
    "overhead": "bench.load.overhead",
    "features": "bench.cpu.features",
    "keyed": "bench.load.keyed_few",
    "memory": "bench.load.memory",
    "cache": "bench.load.cache",
    "capacity": "bench.load.capacity",
    "http2": "bench.client.http2",
    "seed": "bench.client.seed",
    "trace_latency": "bench.tracing.trace_latency",
    "translation": "bench.cpu.translation",
    "prompt_cache": "bench.load.prompt_cache",
    "public": "bench.load.public",
}

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


# -- writing the report ---------------------------------------------------------------------
@dataclass
class Part:
    """What one module of ``MODULES`` gave: its sections, or why there are none."""

    module: str
    sections: list[Section] = field(default_factory=list)
    absent: bool = False  # no such module (yet)
    error: str = ""  # it raised: the traceback's last lines
    seconds: float = 0.0


def cell(value: Cell, fmt: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return format(value, fmt)
    return str(value)


def table(columns: list[str], rows: list[list[Cell]], fmt: str = ".2f") -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v, fmt) for v in row) + " |" for row in rows]
    return lines


def verdicts(checks: list[Check]) -> list[str]:
    """The targets table: each target, the measured value, met or not, the ratio."""
    rows: list[list[Cell]] = []
    for c in checks:
        op = "≤" if c.op == "<=" else "≥"
        ratio = "—" if math.isnan(c.ratio) else f"{c.ratio:.2f}"
        rows.append(
            [
                c.what,
                f"{op} {c.target:g} {c.unit}".strip(),
                f"{c.measured:.2f} {c.unit}".strip(),
                "met" if c.met else "**not met**",
                ratio,
            ]
        )
    return table(["what", "target", "measured", "verdict", "measured / target"], rows)


def problems(parts: list[Part], out_dir: Path | None = None) -> list[str]:
    """What makes a report unusable: a module that failed, a section without rows, a number
    that is not finite, a plot not written into ``out_dir``. Absent modules are not a
    problem."""
    found = []
    for part in parts:
        if part.error:
            found.append(f"{part.module}: raised {part.error.splitlines()[-1]}")
        if not part.absent and not part.error and not part.sections:
            found.append(f"{part.module}: no section")
        for s in part.sections:
            if not s.rows:
                found.append(f"{s.key}: no rows")
            for row in s.rows:
                if len(row) != len(s.columns):
                    found.append(f"{s.key}: a row of {len(row)} cells under {len(s.columns)}")
                bad = [v for v in row if isinstance(v, float) and not math.isfinite(v)]
                if bad:
                    found.append(f"{s.key}: non-finite value in row {row[:3]}")
            for c in s.checks:
                if not math.isfinite(c.measured):
                    found.append(f"{s.key}: check {c.what!r} measured {c.measured}")
            for plot in s.plots:
                if out_dir is not None and not (out_dir / plot.file).is_file():
                    found.append(f"{s.key}: plot {plot.file} not written")
    return found


def markdown(parts: list[Part], meta: dict[str, Any]) -> str:
    """report.md: where and how it ran, the targets met or not, then each section."""
    out = [f"# llmgate benchmark report, {meta['started']}", ""]
    out += [f"Command: `{meta['command']}` ({meta['seconds']:.0f} s). {meta['noise']}", ""]
    out += ["## Machine, versions, settings", ""]
    for group in ("machine", "versions", "settings"):
        out.append(f"- **{group}**: " + ", ".join(f"{k} {v}" for k, v in meta[group].items()))
    checks = [c for p in parts for s in p.sections for c in s.checks]
    if checks:
        out += ["", "## Targets", "", *verdicts(checks)]
    for part in parts:
        if part.absent:
            module = MODULES.get(part.module, f"bench.{part.module}")
            out += ["", f"## {part.module}", "", f"Not measured: {module} has no run() yet."]
        elif part.error:
            out += ["", f"## {part.module}", "", "Failed:", "", "```", part.error, "```"]
        for s in part.sections:
            out += ["", f"## {s.title}", "", f"({part.module}: {part.seconds:.0f} s)", ""]
            out += table(s.columns, s.rows, s.fmt)
            if s.notes:
                out += ["", *(f"- {note}" for note in s.notes)]
            if isinstance(s.data.get("settings"), dict):
                items = s.data["settings"].items()
                out += ["", "Settings: " + "; ".join(f"{k} `{json.dumps(v)}`" for k, v in items)]
            for plot in s.plots:
                out += ["", f"![{plot.caption}]({plot.file})", f"*{plot.caption}*"]
    return "\n".join(out) + "\n"


def as_json(parts: list[Part], meta: dict[str, Any]) -> dict[str, Any]:
    sections = {}
    for part in parts:
        for s in part.sections:
            sections[s.key] = {
                "title": s.title,
                "columns": s.columns,
                "rows": s.rows,
                "data": s.data,
                "checks": [
                    {
                        "what": c.what,
                        "op": c.op,
                        "target": c.target,
                        "measured": c.measured,
                        "unit": c.unit,
                        "met": c.met,
                    }
                    for c in s.checks
                ],
                "plots": [p.file for p in s.plots],
            }
    status = {p.module: "absent" if p.absent else "error" if p.error else "ok" for p in parts}
    return {"meta": meta, "modules": status, "sections": sections}
