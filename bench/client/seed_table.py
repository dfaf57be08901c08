"""The seed table's rows and what a run's numbers become: the report's three sections
(bench/kit/report.py) and two plots. bench/client/seed.py measures; nothing here starts or times
anything.

A run's numbers (``measure_all`` in bench/client/seed.py) are one dict: ``rows`` maps each row's key
to its client's JSON (bench/client/seed_client.py) plus the TLS handshakes the front saw,
``scaling`` holds (a) and (b) again at other RTTs and TLS versions, and the rest is context
(TLS versions seen upstream, load average).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from bench.client.seed_math import (
    HANDSHAKE_RTTS,
    claim_lines,
    ratio,
    saving_in_rtts,
    slope,
    summary,
)
from bench.kit import plots
from bench.kit.report import Plot, Section


@dataclass(frozen=True)
class Options:
    rtt_ms: float = 100.0
    requests: int = 50  # sequential calls per row, then as many at ``concurrency``
    concurrency: int = 8
    # (a) and (b) again at these RTTs; 0 shows what a new connection costs without a WAN.
    scaling_rtts_ms: tuple[float, ...] = (0.0, 50.0, 150.0)
    tls12: bool = True  # also (a) and (b) against a TLS 1.2-only front, at 0 and rtt_ms
    ttft_ms: float = 50.0  # the simulator's answer: TTFT, then max_tokens at tps
    tps: float = 200.0
    max_tokens: int = 20
    trace_calls: int = 5  # calls per row with tracemalloc on (untimed)

    @property
    def generation_ms(self) -> float:
        """When a stream's last token leaves the simulator, counted from the request."""
        return self.ttft_ms + (self.max_tokens - 1) * 1000 / self.tps


SMOKE = Options(
    rtt_ms=20.0,
    requests=3,
    concurrency=2,
    scaling_rtts_ms=(),
    tls12=False,
    trace_calls=1,
)


@dataclass(frozen=True)
class RowSpec:
    key: str
    name: str
    via_gateway: bool
    client: str  # "naive" or "pooled"
    stream: bool = False
    cached: bool = False


ROWS = (
    RowSpec("a", "naive client, new HTTPS connection per call", False, "naive"),
    RowSpec("b", "pooled client (one Session)", False, "pooled"),
    RowSpec("c", "pooled client, streaming", False, "pooled", stream=True),
    RowSpec("d", "naive client through llmgate", True, "naive"),
    RowSpec("e", "naive client through llmgate, streaming", True, "naive", stream=True),
    RowSpec("f", "naive client through llmgate, cache hit", True, "naive", cached=True),
)


def _ms(samples: list[float] | None) -> list[float]:
    return [v * 1000 for v in samples or []]


def _mib(kib: float | None) -> float | None:
    return None if kib is None else kib / 1024


def seed_section(res: dict[str, Any], opts: Options) -> Section:
    rows = res["rows"]
    base = summary(_ms(rows["a"]["total_s"]))["mean"]
    table: list[list[Any]] = []
    for spec in ROWS:
        out = rows[spec.key]
        total = summary(_ms(out["total_s"]))
        first = summary(_ms(out["first_s"]))["mean"] if out["first_s"] else None
        concurrent = out.get("concurrent")
        table.append(
            [
                f"({spec.key}) {spec.name}",
                total["mean"],
                total["p50"],
                total["p95"],
                total["p99"],
                ratio(total["mean"], base),
                first,
                ratio(first, base),
                opts.requests / out["wall_s"],
                opts.requests / concurrent["wall_s"] if concurrent else None,
                _mib(out["peak_rss_kib"]),
                f"{out['handshakes']} / {out['calls']}",
                ", ".join(f"{k} {v}" for k, v in sorted(out["cache"].items())),
            ]
        )
    client_tls = rows["a"]["tls_version"]
    upstream_tls = ", ".join(f"{v} {n}" for v, n in sorted(res["upstream_tls_versions"].items()))
    d_minus_b = (
        summary(_ms(rows["d"]["total_s"]))["p50"] - summary(_ms(rows["b"]["total_s"]))["p50"]
    )
    return Section(
        key="seed",
        title=f"The seed table: RTT {opts.rtt_ms:g} ms, {client_tls}, simulator over TLS",
        columns=[
            "row",
            "mean ms",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "x (a)",
            "first token mean ms",
            "first token x (a)",
            "QPS",
            f"QPS at {opts.concurrency}",
            "client peak RSS MiB",
            "TLS handshakes / calls",
            "X-LLMGate-Cache",
        ],
        rows=table,
        data={"options": opts.__dict__, "results": res},
        notes=[
            f"{opts.requests} sequential calls per row, then {opts.requests} at concurrency "
            f"{opts.concurrency} (QPS at {opts.concurrency}), then {opts.trace_calls} untimed "
            "with tracemalloc on; each row a fresh client process (requests "
            f"{requests.__version__}). x (a): the row's mean over (a)'s.",
            f"WAN: the fault proxy adds {opts.rtt_ms / 2:g} ms each way and {opts.rtt_ms:g} ms "
            "before a new connection's first bytes (its TCP handshake). The simulator answers "
            f"after {opts.ttft_ms:g} ms with {opts.max_tokens} tokens at {opts.tps:g} tokens/s.",
            f"TLS: the direct client's handshake used {client_tls} (ssl.SSLSocket.version()); "
            f"the TLS front saw, over the whole table, {upstream_tls}. The gateway's handshakes "
            f"all came while its pools were warmed before the timed calls "
            f"({sum(res['gateway_warm_handshakes'].values())} for 2 workers).",
            "Through llmgate the client talks plain HTTP to nginx on loopback, a new connection "
            "per call; the gateway's pooled TLS connections cross the WAN. A naive client "
            f"through llmgate gets the pooled client's latency: (d) - (b) = {d_minus_b:.1f} ms "
            "at p50 is the gateway's own cost.",
            f"Load average (1, 5, 15 min) {_load(res['load']['before'])} before and "
            f"{_load(res['load']['after'])} after: 2 cores shared with whatever else ran.",
        ],
    )


def _load(avg: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in avg)


def rtt_points(res: dict[str, Any], opts: Options) -> list[dict[str, Any]]:
    """Each measured (RTT, TLS) pair: saving = (a) - (b) at p50, and the TLS actually used."""
    rows = res["rows"]
    measured = [{"rtt_ms": opts.rtt_ms, "a": rows["a"], "b": rows["b"]}, *res["scaling"]]
    points = []
    for m in measured:
        naive = summary(_ms(m["a"]["total_s"]))["p50"]
        pooled = summary(_ms(m["b"]["total_s"]))["p50"]
        points.append(
            {
                "rtt_ms": m["rtt_ms"],
                "tls": m["a"]["tls_version"],
                "naive_ms": naive,
                "pooled_ms": pooled,
                "saving_ms": naive - pooled,
                "handshakes": f"{m['a']['handshakes']} / {m['a']['calls']}",
            }
        )
    return sorted(points, key=lambda p: (p["tls"], p["rtt_ms"]))


def rtt_section(res: dict[str, Any], opts: Options) -> Section:
    points = rtt_points(res, opts)
    at_zero = {p["tls"]: p["saving_ms"] for p in points if p["rtt_ms"] == 0}
    table: list[list[Any]] = []
    for p in points:
        table.append(
            [
                p["rtt_ms"],
                p["tls"],
                p["naive_ms"],
                p["pooled_ms"],
                p["saving_ms"],
                saving_in_rtts(p["saving_ms"], p["rtt_ms"], at_zero.get(p["tls"], 0.0)),
                HANDSHAKE_RTTS.get(p["tls"]),
                p["handshakes"],
            ]
        )
    slopes = []
    for tls in sorted({p["tls"] for p in points}):
        fitted = slope([(p["rtt_ms"], p["saving_ms"]) for p in points if p["tls"] == tls])
        if fitted is not None:
            slopes.append(f"{tls} {fitted:.2f} (expected {HANDSHAKE_RTTS.get(tls)})")
    arithmetic = ", ".join(
        f"{rtt:g} ms → {2 * rtt:g} / {3 * rtt:g} ms" for rtt in (10, 20, 50, 100, 150, 300)
    )
    zero = "; ".join(f"{tls} {ms:.1f} ms" for tls, ms in sorted(at_zero.items()))
    notes = [
        "A new connection costs TCP's round trip plus TLS's (1 with TLS 1.3, 2 with TLS "
        "1.2's full handshake) before the request leaves; the request's own round trip and "
        "the server's time are paid either way. So reuse saves 2 RTTs with TLS 1.3 and 3 "
        "with TLS 1.2. Saving: (a) - (b) at p50 (the pooled client's first call pays the "
        "handshake once; the mean would carry it).",
    ]
    if zero:
        notes.append(
            f"At RTT 0 a new connection still costs {zero} of the client's and the TLS "
            "front's CPU (a Session, the roots read per connection, the handshake's crypto); "
            "'saving in RTTs' counts what is left after it."
        )
    if slopes:
        notes.append("Least-squares saving per ms of RTT: " + "; ".join(slopes) + ".")
    notes += [
        f"Arithmetic for other RTTs (TLS 1.3 / TLS 1.2 saving per call): {arithmetic}.",
        *(f"The claim, {line}" for line in claim_lines()),
    ]
    return Section(
        key="seed_rtt",
        title="What connection reuse saves, by RTT and TLS version",
        columns=[
            "RTT ms",
            "TLS (measured)",
            "(a) naive p50 ms",
            "(b) pooled p50 ms",
            "saving ms",
            "saving in RTTs",
            "expected RTTs",
            "(a) TLS handshakes / calls",
        ],
        rows=table,
        data={"points": points},
        notes=notes,
        fmt=".1f",
    )


def memory_section(res: dict[str, Any], opts: Options) -> Section:
    table: list[list[Any]] = []
    for spec in ROWS:
        out = res["rows"][spec.key]
        top = [f"{t['kib']:.1f} KiB {t['where']}" for t in out.get("top_allocations", [])]
        concurrent = out.get("concurrent") or {}
        table.append(
            [
                f"({spec.key}) {spec.name}",
                _mib(out["peak_rss_kib"]),
                _mib(concurrent.get("peak_rss_kib")),
                out.get("traced_peak_kib"),
                *(top + [None] * 3)[:3],
            ]
        )
    return Section(
        key="seed_memory",
        title="The seed table's client memory",
        columns=[
            "row",
            "peak RSS MiB",
            f"peak RSS MiB after {opts.concurrency} concurrent",
            "tracemalloc peak KiB",
            "top 1",
            "top 2",
            "top 3",
        ],
        rows=table,
        notes=[
            "Peak RSS (ru_maxrss) of the row's client process, after its sequential calls and "
            "again after the concurrent ones; Python, requests and OpenSSL are most of it.",
            f"tracemalloc ran over {opts.trace_calls} more calls: its peak, and the top 3 lines "
            "by size held at the end of the last call, its session and connection still open. "
            "OpenSSL's own memory (the roots loaded per connection) is outside tracemalloc.",
        ],
        fmt=".1f",
    )


def draw(res: dict[str, Any], opts: Options, out_dir: Path) -> tuple[list[Plot], list[Plot]]:
    fig, ax = plots.figure()
    for spec in ROWS:
        out = res["rows"][spec.key]
        for label, samples in ((spec.key, out["total_s"]), (f"{spec.key} first", out["first_s"])):
            if samples:
                ordered = sorted(_ms(samples))
                ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
                ax.step(ordered, ys, where="post", label=label)
    ax.set_xlabel("ms per call")
    ax.set_ylabel("fraction of calls")
    ax.set_title(f"seed table, RTT {opts.rtt_ms:g} ms", fontsize=10)
    ax.legend(fontsize=8)
    table = [
        Plot(plots.save(fig, out_dir / "seed_cdf.png"), "Latency CDF per row of the seed table")
    ]
    fig, ax = plots.figure()
    rtts = [0.0, max([opts.rtt_ms, *opts.scaling_rtts_ms]) * 1.2]
    for tls, rtts_per in HANDSHAKE_RTTS.items():
        ax.plot(rtts, [r * rtts_per for r in rtts], "--", label=f"{rtts_per} RTT ({tls})")
    for tls in HANDSHAKE_RTTS:
        pts = [(p["rtt_ms"], p["saving_ms"]) for p in rtt_points(res, opts) if p["tls"] == tls]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o", label=f"measured, {tls}")
    ax.set_xlabel("RTT ms")
    ax.set_ylabel("(a) - (b) at p50, ms")
    ax.set_title("connection reuse saves round trips", fontsize=10)
    ax.legend(fontsize=8)
    rtt = [Plot(plots.save(fig, out_dir / "seed_rtt.png"), "Reuse saving against RTT")]
    return table, rtt


def sections(res: dict[str, Any], opts: Options, out_dir: Path | None) -> list[Section]:
    found = [seed_section(res, opts), rtt_section(res, opts), memory_section(res, opts)]
    if out_dir is not None:
        found[0].plots, found[1].plots = draw(res, opts, out_dir)
    return found


def print_section(section: Section) -> None:
    def cell(value: Any) -> str:
        if value is None:
            return "—"
        return format(value, section.fmt) if isinstance(value, float) else str(value)

    print(f"\n{section.title}\n")
    print("| " + " | ".join(section.columns) + " |")
    print("|" + "---|" * len(section.columns))
    for row in section.rows:
        print("| " + " | ".join(cell(v) for v in row) + " |")
    for note in section.notes:
        print(f"- {note}")
