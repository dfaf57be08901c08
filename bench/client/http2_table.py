"""The HTTP/2 section (rows, notes, results.json data) from bench/client/http2.py's waves. No I/O.

A wave is one protocol's streams started at once by one client; what the client saw of each
stream is a ``Stream``. The table pools a protocol's waves of one kind (a new client, or the
same client again on the connections it kept) and sets HTTP/2 against HTTP/1.1: percentiles
of the time to the first data event and to the end, streams per second, connections, and
the CPU of the client and of the gateway's two process trees per stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.kit.loadgen import pct
from bench.kit.report import Cell, Section

H1, H2 = "HTTP/1.1", "HTTP/2"
NEW, KEPT = "new client", "kept connections"


@dataclass(frozen=True)
class Stream:
    """One stream as the client read it; times in seconds from the request's start."""

    ttft_s: float | None  # when the first `data:` line was read; None: none came
    total_s: float | None  # when the body ended; None: it did not (``error`` says why)
    events: int  # `data:` lines before [DONE]
    done: bool  # the last `data:` line was [DONE]
    port: int = 0  # the client's local port: which TCP connection carried it
    error: str = ""  # "" or a kind: "HTTP 502", "cut", "ReadTimeout", "HTTP/1.1 not HTTP/2"


@dataclass(frozen=True)
class Wave:
    protocol: str  # H1 | H2
    kind: str  # NEW | KEPT
    streams: tuple[Stream, ...]
    wall_s: float  # from the first request to the last stream's end
    client_cpu_s: float  # time.process_time() of the client's process over the wave
    opened: int  # TCP connections the client's transport opened during the wave
    nginx_cpu_s: float
    gunicorn_cpu_s: float
    others: float = 0.0  # share of all cores other processes used meanwhile


def order(rounds: int) -> list[str]:
    """The protocols of ``rounds`` rounds each, alternating which goes first (H1 H2 H2 H1
    ...), so a drift in the machine's load is shared by both."""
    out: list[str] = []
    for i in range(rounds):
        out += [H1, H2] if i % 2 == 0 else [H2, H1]
    return out


def summary(waves: list[Wave]) -> dict[str, Any]:
    """One protocol's waves of one kind, pooled: percentiles in ms, rates, per-stream CPU."""
    streams = [s for w in waves for s in w.streams]
    ok = [s for s in streams if not s.error]
    errors: dict[str, int] = {}
    for s in streams:
        if s.error:
            errors[s.error] = errors.get(s.error, 0) + 1
    wall = sum(w.wall_s for w in waves)
    n = max(1, len(streams))
    per_stream = {
        "client": sum(w.client_cpu_s for w in waves),
        "nginx": sum(w.nginx_cpu_s for w in waves),
        "gunicorn": sum(w.gunicorn_cpu_s for w in waves),
    }
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    total = [s.total_s for s in ok if s.total_s is not None]
    events = [s.events for s in ok]
    return {
        "waves": len(waves),
        "streams": len(streams),
        "errors": errors,
        "error_count": sum(errors.values()),
        "done": sum(s.done for s in streams),
        "events_min": min(events, default=0),
        "events_max": max(events, default=0),
        "ttft_p50_ms": pct(ttft, 0.5),
        "ttft_p99_ms": pct(ttft, 0.99),
        "total_p50_ms": pct(total, 0.5),
        "total_p99_ms": pct(total, 0.99),
        "streams_per_s": len(ok) / wall if wall else math.nan,
        # Per wave: connections its transport opened, and distinct ones that carried streams.
        "opened_per_wave": sum(w.opened for w in waves) / max(1, len(waves)),
        "used_per_wave": sum(len({s.port for s in w.streams if s.port}) for w in waves)
        / max(1, len(waves)),
        **{f"{k}_cpu_ms_per_stream": 1000 * v / n for k, v in per_stream.items()},
        "others_cores_share": sum(w.others * w.wall_s for w in waves) / wall if wall else 0.0,
    }


def wave_data(wave: Wave) -> dict[str, Any]:
    """One wave's own figures for results.json: the spread between rounds shows the noise."""
    s = summary([wave])
    keys = ("error_count", "ttft_p50_ms", "total_p50_ms", "opened_per_wave", "used_per_wave")
    return {
        "protocol": wave.protocol,
        "kind": wave.kind,
        "wall_s": wave.wall_s,
        **{k: s[k] for k in keys},
        **{k: s[k] for k in s if k.endswith("_cpu_ms_per_stream")},
        "others_cores_share": wave.others,
    }


COLUMNS = [
    "client",
    "protocol",
    "streams",
    "errors",
    "ended with [DONE]",
    "TCP connections opened / used per wave",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "total p50 ms",
    "total p99 ms",
    "streams/s",
    "client CPU ms/stream",
    "nginx CPU ms/stream",
    "gunicorn CPU ms/stream",
    "others % cores",
]
# The columns a ratio row divides (HTTP/2 over HTTP/1.1); counts are left out.
RATIOS = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "total_p50_ms",
    "total_p99_ms",
    "streams_per_s",
    "client_cpu_ms_per_stream",
    "nginx_cpu_ms_per_stream",
    "gunicorn_cpu_ms_per_stream",
)


def row(kind: str, protocol: str, s: dict[str, Any]) -> list[Cell]:
    return [
        kind,
        protocol,
        s["streams"],
        s["error_count"],
        s["done"],
        f"{s['opened_per_wave']:g} / {s['used_per_wave']:g}",
        *(_finite(s[k]) for k in RATIOS),
        100 * s["others_cores_share"],
    ]


def ratio_row(kind: str, h1: dict[str, Any], h2: dict[str, Any]) -> list[Cell]:
    """HTTP/2 over HTTP/1.1 for the measured columns; None where either is missing or 0."""
    opened = _ratio(h2["opened_per_wave"], h1["opened_per_wave"])
    return [
        kind,
        "HTTP/2 / HTTP/1.1",
        None,
        None,
        None,
        "—" if opened is None else f"{opened:.2f}",
        *(_ratio(h2[k], h1[k]) for k in RATIOS),
        None,
    ]


def section(waves: list[Wave], settings: dict[str, Any]) -> Section:
    rows, summaries = [], {}
    for kind in (NEW, KEPT):
        of = [w for w in waves if w.kind == kind]
        got = {p: summary([w for w in of if w.protocol == p]) for p in (H1, H2)}
        summaries[kind] = got
        rows += [
            row(kind, H1, got[H1]),
            row(kind, H2, got[H2]),
            ratio_row(kind, got[H1], got[H2]),
        ]
    n = settings["streams"]
    return Section(
        key="http2",
        title=f"HTTP/1.1 and HTTP/2 at nginx: {n} concurrent streams from one client",
        columns=COLUMNS,
        rows=rows,
        data={
            "settings": settings,
            "summaries": summaries,
            "waves": [wave_data(w) for w in waves],
        },
        notes=[
            f"One client process, one asyncio loop, httpx2 for both protocols against nginx's "
            f"HTTPS port. A round: a new client starts {n} streams at once, then {n} more on "
            "the connections it kept; one warm-up round each, then alternating rounds.",
            "TTFT: from the request's start to the client reading the first `data:` line "
            "(for a new client this includes the TCP and TLS handshakes); total: to the "
            "body's end. Percentiles over all measured streams of the row.",
            "TCP connections: opened by the client's transport during a wave (httpcore2's "
            "connect_tcp trace) / distinct local ports that carried the wave's streams; "
            "mean per wave. A stream that came back over the other protocol is an error.",
            "streams/s: streams ended per second of the waves' wall time (bursts of "
            f"{n}, not a closed loop). CPU per stream: the client's time.process_time(); "
            "nginx's and gunicorn's trees from /proc (idle use not subtracted).",
            "HTTP/2 / HTTP/1.1: the HTTP/2 row's value over the HTTP/1.1 row's; below 1 is "
            "less time or CPU, above 1 more streams/s.",
        ],
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _ratio(a: float, b: float) -> float | None:
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return None
    return a / b
