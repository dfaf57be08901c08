"""The overhead section's table, targets and plots, from bench/overhead.py's measurements.

Pure arithmetic over the runs (percentiles, differences to the direct path, ratios) and
three figures: latency CDFs at the highest load, latency and req/s against callers, CPU per
request. The targets are issue 11's; the measured values are the runs'.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bench import loadgen, plots
from bench.loadgen import pct
from bench.report import Cell, Check, Config, Plot, Section

if TYPE_CHECKING:
    from bench.overhead import Measured

PATHS = ("direct", "nginx-only", "floor", "gateway")
# Issue 11's targets for the gateway's CPU (nginx + gunicorn) per call at the highest load.
CPU_TARGETS_MS = {"stream": 3.0, "non-stream": 0.7}


def _cell(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def section(cfg: Config, out: list[Measured], settings: dict) -> Section:
    idle = settings["idle_cpu_share"]
    by = {(m.kind, m.callers, m.path): m for m in out}
    rows: list[list[Cell]] = []
    for m in out:
        direct = by[(m.kind, m.callers, "direct")].result
        nginx = by[(m.kind, m.callers, "nginx-only")].result
        r = m.result
        stream = m.kind == "stream"
        main, main_nginx = (r.ttft, nginx.ttft) if stream else (r.total, nginx.total)
        rows.append(
            [
                m.kind,
                m.callers,
                m.path,
                _cell(pct(r.ttft, 0.5)) if stream else None,
                pct(r.total, 0.5),
                _cell(pct(r.ttft, 0.5) - pct(direct.ttft, 0.5)) if stream else None,
                _cell(pct(r.ttft, 0.99) - pct(direct.ttft, 0.99)) if stream else None,
                pct(r.total, 0.5) - pct(direct.total, 0.5),
                pct(r.total, 0.99) - pct(direct.total, 0.99),
                pct(main, 0.5) - pct(main_nginx, 0.5),
                r.rps,
                r.rps / direct.rps if direct.rps else None,
                r.rps / nginx.rps if nginx.rps else None,
                m.cpu_ms,
                m.upstream_per_1000,
                m.closed_per_1000,
                len(r.errors),
                r.load * 100,
                m.others * 100,
            ]
        )
    columns = [
        "kind",
        "callers",
        "path",
        "TTFT p50 ms",
        "total p50 ms",
        "+TTFT p50",
        "+TTFT p99",
        "+total p50",
        "+total p99",
        "+p50 vs nginx-only",
        "req/s",
        "req/s x direct",
        "req/s x nginx-only",
        "CPU ms/req",
        "new upstream conns /1000",
        "closed upstream conns /1000",
        "errors",
        "generator % core",
        "others % cores",
    ]
    return Section(
        key="overhead",
        title="Relay overhead: direct, nginx-only, the shape's floor, gateway",
        columns=columns,
        rows=rows,
        data={"settings": settings, "runs": [m.row_data() for m in out]},
        checks=checks(by),
        plots=draw(cfg, out, by),
        notes=[
            "+… columns: the path's percentile minus the direct path's at the same load, ms "
            "(TTFT for streams; total = the whole answer). `+p50 vs nginx-only`: TTFT p50 for "
            "streams, total p50 otherwise, minus nginx-only's.",
            "floor: the gateway's stack (nginx, gunicorn with 2 gevent workers) serving "
            "bench/floor_app.py instead of the gateway, a Flask app that relays the call through "
            "one urllib3 PoolManager per worker and does nothing else: what the shape costs "
            "before any of the gateway's own work. A target below the floor's figure cannot be "
            "met by cutting the gateway's work." + _floor_note(by),
            "CPU ms/req: utime + stime of the path's process tree (nginx master and workers; "
            "for the floor and the gateway also gunicorn's master and workers) over the run, "
            "less what the tree uses with no call in flight (idle: "
            + ", ".join(f"{p} {v:.1%} of a core" for p, v in idle.items() if p != "direct")
            + "), per answered request. The simulator and the load generator are not counted.",
            "new upstream conns /1000: TCP connections the simulator accepted during the "
            "measured run, per 1,000 requests. The run follows a warm-up at the same load; "
            "the gateway's is repeated until two rounds in a row open no upstream connection "
            "(up to 8 rounds of two calls per caller; the rounds used are in the settings), "
            "so the figure is the steady state's. A worker's "
            "pool still grows when it meets more streams at once than ever before (accepts "
            "are uneven between workers); closed upstream conns /1000: the connections "
            "opened less the growth of those the path's processes hold to the simulator "
            "(their sockets, read from /proc), i.e. those discarded.",
            "generator % core: the load generator's own CPU over the run's wall time; it is "
            "one thread, so near 100 % it, not the path, would be the bottleneck.",
            "others % cores: the share of all cores that processes other than this benchmark's "
            "(its own, the simulator's, nginx's and gunicorn's) used during the run: the noise.",
        ],
    )


def _floor_note(by: dict[tuple[str, int, str], Measured]) -> str:
    """The floor's CPU per call at the highest load, beside the gateway's and the targets."""
    hi = max(c for (_, c, _) in by)
    parts = []
    for kind, target in CPU_TARGETS_MS.items():
        floor, gateway = by[(kind, hi, "floor")].cpu_ms, by[(kind, hi, "gateway")].cpu_ms
        if floor is None or gateway is None:
            return ""
        parts.append(
            f"{kind}: floor {floor:.2f} ms, gateway {gateway:.2f} ms, target {target:g} ms"
        )
    return f" At {hi} callers, CPU per call: " + "; ".join(parts) + "."


def checks(by: dict[tuple[str, int, str], Measured]) -> list[Check]:
    hi = max(c for (_, c, _) in by)

    def get(kind: str, callers: int, path: str = "gateway") -> loadgen.Result:
        return by[(kind, callers, path)].result

    def added(kind: str, callers: int, q: float, ttft: bool) -> float:
        g, d = get(kind, callers), get(kind, callers, "direct")
        return pct(g.ttft, q) - pct(d.ttft, q) if ttft else pct(g.total, q) - pct(d.total, q)

    s, n = get("stream", hi), get("non-stream", hi)
    stream_cpu = by[("stream", hi, "gateway")].cpu_ms
    plain_cpu = by[("non-stream", hi, "gateway")].cpu_ms
    conns = by[("stream", hi, "gateway")].upstream_per_1000
    assert stream_cpu is not None and plain_cpu is not None and conns is not None
    return [
        Check("stream, 1 caller: added TTFT p50", "<=", 1.5, added("stream", 1, 0.5, True), "ms"),
        Check(
            f"stream, {hi} callers: added TTFT p50", "<=", 5, added("stream", hi, 0.5, True), "ms"
        ),
        Check(
            f"stream, {hi} callers: added TTFT p99", "<=", 20, added("stream", hi, 0.99, True), "ms"
        ),
        Check(
            f"stream, {hi} callers: req/s over direct's",
            ">=",
            0.98,
            s.rps / get("stream", hi, "direct").rps,
            "x direct",
        ),
        Check(f"non-stream, {hi} callers: req/s", ">=", 1500, n.rps, "req/s"),
        Check(
            f"non-stream, {hi} callers: added total p50",
            "<=",
            15,
            added("non-stream", hi, 0.5, False),
            "ms",
        ),
        Check(
            f"gateway CPU per streamed request ({hi} callers)",
            "<=",
            CPU_TARGETS_MS["stream"],
            stream_cpu,
            "ms",
        ),
        Check(
            f"gateway CPU per non-stream request ({hi} callers)",
            "<=",
            CPU_TARGETS_MS["non-stream"],
            plain_cpu,
            "ms",
        ),
        Check(f"new upstream connections per 1,000 streams, {hi} callers", "<=", 0, conns, ""),
    ]


def draw(cfg: Config, out: list[Measured], by: dict[tuple[str, int, str], Measured]) -> list[Plot]:
    hi = max(m.callers for m in out)
    fig, (left, right) = plots.figure(11, 4, ncols=2)
    plots.cdf(
        left,
        {p: [v * 1000 for v in by[("stream", hi, p)].result.ttft] for p in PATHS},
        "TTFT, ms",
        f"stream TTFT, {hi} callers",
    )
    plots.cdf(
        right,
        {p: [v * 1000 for v in by[("non-stream", hi, p)].result.total] for p in PATHS},
        "latency, ms",
        f"non-stream latency, {hi} callers",
    )
    cdf = plots.save(fig, cfg.out_dir / "overhead-cdf.png")

    callers = sorted({m.callers for m in out})
    fig, (ttft, lat, rps) = plots.figure(15, 4, ncols=3)

    def series(kind: str, value) -> dict[str, tuple[list[float], list[float]]]:
        return {
            f"{p} {label}": ([float(c) for c in callers], [fn(by[(kind, c, p)]) for c in callers])
            for p in PATHS
            for label, fn in value
        }

    plots.lines(
        ttft,
        series(
            "stream",
            [
                ("p50", lambda m: pct(m.result.ttft, 0.5)),
                ("p99", lambda m: pct(m.result.ttft, 0.99)),
            ],
        ),
        "concurrent callers",
        "TTFT, ms",
        "stream TTFT against callers",
    )
    plots.lines(
        lat,
        series(
            "non-stream",
            [
                ("p50", lambda m: pct(m.result.total, 0.5)),
                ("p99", lambda m: pct(m.result.total, 0.99)),
            ],
        ),
        "concurrent callers",
        "latency, ms",
        "non-stream latency against callers",
    )
    plots.lines(
        rps,
        {
            f"{kind} {p}": (
                [float(c) for c in callers],
                [by[(kind, c, p)].result.rps for c in callers],
            )
            for kind in ("stream", "non-stream")
            for p in PATHS
        },
        "concurrent callers",
        "req/s",
        "req/s against callers",
    )
    against = plots.save(fig, cfg.out_dir / "overhead-callers.png")

    fig, ax = plots.figure(8, 4)
    labels, values, colors = [], [], []
    for m in out:
        if m.cpu_ms is not None:
            labels.append(f"{m.kind}\n{m.callers} {m.path}")
            values.append(m.cpu_ms)
            colors.append(plots.color(m.path))
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), labels, fontsize=6)
    ax.set_ylabel("CPU ms per request")
    ax.set_title(
        "CPU per request of the path's processes (green nginx-only, grey floor, orange gateway)",
        fontsize=10,
    )
    cpu = plots.save(fig, cfg.out_dir / "overhead-cpu.png")
    return [
        Plot(cdf, f"Latency CDFs at {hi} callers"),
        Plot(against, "TTFT, latency and req/s against concurrent callers"),
        Plot(cpu, "CPU per request of nginx-only, the floor and the gateway (nginx + gunicorn)"),
    ]
