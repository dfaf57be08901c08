"""The overhead section's table, targets and plots, from bench/load/overhead.py's measurements
(bench/load/overhead_runs.py).

Pure arithmetic over the runs (percentiles, differences to the direct path, ratios) and
three figures: latency CDFs at the highest load, latency and req/s against callers, CPU per
request. The latency, req/s and connection targets are issue 11's; the CPU targets are issue
25's, ratios to the floor measured in the same run (the gateway's CPU per call over the
floor's at the same load), so they hold on any machine and move with the floor's own cuts.
"""

from __future__ import annotations

import math

from bench.kit import loadgen, plots
from bench.kit.loadgen import pct
from bench.kit.report import Cell, Check, Config, Plot, Section
from bench.load.overhead_runs import Measured

PATHS = ("direct", "nginx-only", "floor", "gateway", "gateway+keys")
KINDS = ("stream", "non-stream")
# Issue 25's targets: the path's CPU (nginx + gunicorn) per call at the highest load, at most
# this many times the floor's, for each kind of call. Features off, then on.
CPU_OVER_FLOOR = {"gateway": 1.10, "gateway+keys": 1.25}


def _cell(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def over_floor(by: dict[tuple[str, int, str], Measured], m: Measured) -> float | None:
    """The run's CPU per call over the floor's, same kind and load (None: not measured)."""
    floor = by[(m.kind, m.callers, "floor")].cpu_ms
    return None if m.cpu_ms is None or not floor else m.cpu_ms / floor


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
                over_floor(by, m),
                m.memcached_cpu_ms,
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
        "CPU x floor",
        "Memcached CPU ms/req",
        "new upstream conns /1000",
        "closed upstream conns /1000",
        "errors",
        "generator % core",
        "others % cores",
    ]
    return Section(
        key="overhead",
        title="Relay overhead: direct, nginx-only, the shape's floor, gateway, gateway+keys",
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
            "bench/floor/app.py instead of the gateway, a Flask app that relays the call through "
            "one urllib3 PoolManager per worker and does nothing else: what the shape costs "
            "before any of the gateway's own work. The CPU targets are ratios to it, measured "
            "in the same run (CPU x floor: the path's CPU ms/req over the floor's at the same "
            "load)." + _floor_note(by),
            "gateway: cache off, no keys file. gateway+keys: the same gateway with its features "
            "on: a keys file with one key whose per-key limits (requests and tokens per minute, "
            "tokens per day, open streams) are far above the load, so every call is checked "
            "and counted in Memcached and none refused; the callers send that key. The metrics "
            "are on in both; the JSON line per request is off in gateway "
            "(LLMGATE_LOG_REQUESTS=false) and on in gateway+keys. Its CPU ms/req counts nginx and "
            "gunicorn as for the others; Memcached's own CPU is not in it (it is in "
            "Memcached CPU ms/req, less its idle use).",
            "CPU ms/req: utime + stime of the path's process tree (nginx master and workers; "
            "for the floor and the gateways also gunicorn's master and workers) over the run, "
            "less what the tree uses with no call in flight (idle: "
            + ", ".join(f"{p} {v:.1%} of a core" for p, v in idle.items() if p != "direct")
            + "), per answered request. The simulator and the load generator are not counted.",
            "new upstream conns /1000: TCP connections the simulator accepted during the "
            "measured run, per 1,000 requests. The run follows a warm-up at the same load; "
            "the floor's and the gateways' are repeated until two rounds in a row open no "
            "upstream connection (up to 8 rounds of two calls per caller; the gateways' rounds "
            "are in the settings), "
            "so the figure is the steady state's. A worker's "
            "pool still grows when it meets more streams at once than ever before (accepts "
            "are uneven between workers); closed upstream conns /1000: the connections "
            "opened less the growth of those the path's processes hold to the simulator "
            "(their sockets, read from /proc), i.e. those discarded.",
            "generator % core: the load generator's own CPU over the run's wall time; it is "
            "one thread, so near 100 % it, not the path, would be the bottleneck.",
            "others % cores: the share of all cores that processes other than this benchmark's "
            "(its own, the simulator's, nginx's, gunicorn's and Memcached's) used during the "
            "run: the noise.",
        ],
    )


def _floor_note(by: dict[tuple[str, int, str], Measured]) -> str:
    """The floor's own CPU per call at the highest load (its figure before and after its
    cuts stays visible), beside the gateways' and their ratios to it."""
    hi = max(c for (_, c, _) in by)
    parts = []
    for kind in KINDS:
        floor = by[(kind, hi, "floor")].cpu_ms
        if floor is None:
            return ""
        sides = [f"floor {floor:.2f} ms"]
        for path, target in CPU_OVER_FLOOR.items():
            m = by[(kind, hi, path)]
            ratio = over_floor(by, m)
            if m.cpu_ms is None or ratio is None:
                return ""
            sides.append(
                f"{path} {m.cpu_ms:.2f} ms ({ratio:.2f}x, target ≤ {target:.2f}x"
                + _halves(by[(kind, hi, "floor")], m)
                + ")"
            )
        parts.append(f"{kind}: " + ", ".join(sides))
    return f" At {hi} callers, CPU per call: " + "; ".join(parts) + "."


def _halves(floor: Measured, m: Measured) -> str:
    """Each half's ratio to the floor's same half (run A B C, then C B A): how far the
    ratio moved within the run."""
    if len(m.halves_cpu_ms) != 2 or len(floor.halves_cpu_ms) != 2 or not all(floor.halves_cpu_ms):
        return ""
    ratios = [g / f for g, f in zip(m.halves_cpu_ms, floor.halves_cpu_ms, strict=True)]
    return "; halves " + " and ".join(f"{r:.2f}x" for r in ratios)


def cpu_checks(by: dict[tuple[str, int, str], Measured]) -> list[Check]:
    """Issue 25's: each gateway's CPU per call over the floor's, at the highest load."""
    hi = max(c for (_, c, _) in by)
    found = []
    for path, target in CPU_OVER_FLOOR.items():
        for kind in KINDS:
            ratio = over_floor(by, by[(kind, hi, path)])
            assert ratio is not None, f"{path} {kind}: no CPU measured"
            what = "streamed" if kind == "stream" else kind
            found.append(
                Check(
                    f"{path} CPU per {what} request over the floor's ({hi} callers)",
                    "<=",
                    target,
                    ratio,
                    "x floor",
                )
            )
    return found


def checks(by: dict[tuple[str, int, str], Measured]) -> list[Check]:
    hi = max(c for (_, c, _) in by)

    def get(kind: str, callers: int, path: str = "gateway") -> loadgen.Result:
        return by[(kind, callers, path)].result

    def added(kind: str, callers: int, q: float, ttft: bool) -> float:
        g, d = get(kind, callers), get(kind, callers, "direct")
        return pct(g.ttft, q) - pct(d.ttft, q) if ttft else pct(g.total, q) - pct(d.total, q)

    s, n = get("stream", hi), get("non-stream", hi)
    conns = by[("stream", hi, "gateway")].upstream_per_1000
    assert conns is not None
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
        *cpu_checks(by),
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

    fig, ax = plots.figure(12, 4)
    labels, values, colors = [], [], []
    for m in out:
        if m.cpu_ms is not None:
            labels.append(f"{m.kind}\n{m.callers}\n{m.path}")
            values.append(m.cpu_ms)
            colors.append(plots.color(m.path))
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), labels, fontsize=6)
    ax.set_ylabel("CPU ms per request")
    ax.set_title(
        "CPU per request of the path's processes (green nginx-only, grey floor, orange "
        "gateway, red gateway+keys)",
        fontsize=10,
    )
    cpu = plots.save(fig, cfg.out_dir / "overhead-cpu.png")
    return [
        Plot(cdf, f"Latency CDFs at {hi} callers"),
        Plot(against, "TTFT, latency and req/s against concurrent callers"),
        Plot(
            cpu,
            "CPU per request of nginx-only, the floor and the gateways (nginx + gunicorn)",
        ),
    ]
