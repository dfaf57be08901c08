"""Cache hits through nginx → gunicorn: the report's section (bench/kit/report.py).

Rows, at 64 concurrent callers on the raw-socket generator (bench/kit/loadgen.py): the
simulator direct (a realistic answer: 300 ms to the first token, 100 tokens/s), a gateway
hit served by the worker's L1, a streamed L1 hit, one served by Memcached (L2, with the L1
disabled), and the shape's floor answering from a dict in its worker; with the gateway's CPU
per hit. The L1 hits and the floor's are taken in turns, the best round of each. Issue 25's
target: L1 hits at least 0.9x the floor's hits per second, both measured in the same run;
issue 11's p50 stays.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

from bench.floor import FLOOR_APP
from bench.kit import loadgen, machine, proctree
from bench.kit.loadgen import pct
from bench.kit.report import Cell, Check, Config, Section
from runner.stack import Stack, StackOptions
from tests.support.sim import sim_stats

SIM = ["--ttft-ms", "300", "--tps", "100"]
# The rows the targets compare (column 0), and where the rate and the p50 are in a row.
HIT, FLOOR = "HIT l1", "floor: hit"
RPS, P50 = 6, 4
# Issue 25: the gateway's L1 hits per second at least this share of the floor's.
HITS_OVER_FLOOR = 0.9
# Rounds of the L1 hits and of the floor's, in turns; each side's best is its row.
ROUNDS = 3


def cache_header(host: str, port: int, request: bytes) -> str:
    """X-LLMGate-Cache of one answer to ``request`` (raw bytes, as the generator sends it)."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                break
            head += data
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-llmgate-cache":
            return value.strip().decode()
    return ""


def _measure(
    cfg: Config, name: str, stack: Stack, url: str, request: bytes, callers: int, count: int
) -> list[Cell]:
    host, port = url.removeprefix("http://").split(":")
    pids = [
        p for name_ in ("nginx", "gunicorn") for p in proctree.tree(stack.proc(name_).popen.pid)
    ]
    # Warm up and fill, until a round reaches the upstream no more: each worker keeps its own
    # L1 (and the floor's app its own dict), and accepts may leave a worker out of a round.
    for _ in range(5):
        before = _sim_requests(stack.sim_url)
        loadgen.run(host, int(port), request, callers, min(count, callers * 4))
        if _sim_requests(stack.sim_url) == before:
            break
    outcome = cache_header(host, int(port), request)
    if stack.options.wsgi_app:
        pass  # the floor's app names no cache outcome (tests/integration/test_bench_floor.py)
    elif not outcome.startswith("HIT"):
        raise RuntimeError(f"{name}: the gateway answered X-LLMGate-Cache {outcome!r}, not a hit")
    cfg.progress(f"cache: {name}, {callers} callers")
    ours = [os.getpid()] + [p for proc in stack.procs for p in proctree.tree(proc.popen.pid)]
    upstream_calls = _sim_requests(stack.sim_url)  # every answer of the run must be a hit
    cpu0, others = proctree.cpu_s(pids), machine.Others(ours)
    r = loadgen.run(host, int(port), request, callers, count)
    if _sim_requests(stack.sim_url) != upstream_calls:
        raise RuntimeError(f"{name}: calls reached the upstream during the hits' run")
    cpu = (proctree.cpu_s(pids) - cpu0) / max(1, len(r.total)) * 1000
    return _row(name, callers, r, cpu, others.share() * 100)


def _sim_requests(sim_url: str) -> int:
    """The simulator's own count of the API calls it answered."""
    return int(sim_stats(sim_url)["requests"])


def _row(
    name: str, callers: int, r: loadgen.Result, cpu: float | None, others: float | None
) -> list[Cell]:
    """One table row: the run's counts, latency, rate, the gateway's CPU per call, the
    generator's load and what other processes took (None: not measured)."""
    return [
        name,
        callers,
        len(r.total),
        len(r.errors),
        pct(r.total, 0.5),
        pct(r.total, 0.99),
        r.rps,
        cpu,
        r.load * 100,
        others,
    ]


def run(cfg: Config) -> Section:
    """Hits through nginx at 64 callers: L1 (the default), a streamed L1 hit, L2 only; the
    L1 hits and the floor's in turns, the best round of each."""
    callers = 8 if cfg.smoke else 64
    hits = 40 if cfg.smoke else 12000
    rounds = 1 if cfg.smoke else ROUNDS
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-cache-"))
    common = {
        "model": "sim-model",
        "max_tokens": 50,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"bench {uuid.uuid4().hex}"}],
    }
    auth = {"Authorization": "Bearer sk-bench"}
    plain = loadgen.request_bytes("/v1/chat/completions", common, auth)
    stream = loadgen.request_bytes("/v1/chat/completions", {**common, "stream": True}, auth)
    bypass = {**common, "temperature": 0.9}
    rows: list[list[Cell]] = []
    # The shape's floor for a hit (bench/load/overhead.py's floor path, its answers kept in a
    # dict in each worker): what the fixed parts cost to answer from memory. Up beside the
    # gateway, so that their rounds take turns: a run of a few seconds each, one after the
    # other, moved with the machine by up to a third.
    floor_options = StackOptions(
        run_dir=run_dir / "c", simulator_args=SIM, memcached=False, wsgi_app=FLOOR_APP
    )
    try:
        cfg.progress("cache: starting memcached, simulator, gunicorn, nginx, and the floor")
        with (
            Stack(StackOptions(run_dir=run_dir / "a", simulator_args=SIM)) as stack,
            Stack(floor_options) as floor,
        ):
            direct = loadgen.request_bytes("/v1/chat/completions", bypass, auth)
            cfg.progress(f"cache: direct to the simulator, {callers} callers")
            host, port = stack.sim_url.removeprefix("http://").split(":")
            r = loadgen.run(host, int(port), direct, callers, callers * 2)
            rows.append(_row("direct (no cache)", callers, r, None, None))
            turns: dict[str, list[list[Cell]]] = {HIT: [], FLOOR: []}
            for _ in range(rounds):
                turns[HIT].append(_measure(cfg, HIT, stack, stack.url, plain, callers, hits))
                turns[FLOOR].append(_measure(cfg, FLOOR, floor, floor.url, plain, callers, hits))
            rates = {side: [float(r[RPS] or 0) for r in each] for side, each in turns.items()}
            rows.append(best(turns[HIT]))
            rows.append(_measure(cfg, "HIT l1, stream", stack, stack.url, stream, callers, hits))
        # The L1 refuses values above 1/8 of its size: at 1 KiB every answer goes to L2.
        l2_only = {"LLMGATE_CACHE_L1_BYTES": "1024"}
        options = StackOptions(run_dir=run_dir / "b", simulator_args=SIM, env=l2_only)
        cfg.progress("cache: starting a gateway with the L1 off (hits from Memcached)")
        with Stack(options) as stack:
            rows.append(_measure(cfg, "HIT l2 (memcached)", stack, stack.url, plain, callers, hits))
        rows.append(best(turns[FLOOR]))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return section(rows, callers, hits, rounds, rates)


def best(turns: list[list[Cell]]) -> list[Cell]:
    """The round with the most answers a second: a round is slowed by what else the machine
    does, never sped up."""
    return max(turns, key=lambda row: float(row[RPS] or 0))


def checks(rows: list[list[Cell]], callers: int) -> list[Check]:
    """Issue 25's hits against the floor's, from the same run, and issue 11's p50."""
    by = {row[0]: row for row in rows}
    hit, floor = by[HIT], by[FLOOR]
    floor_rps = float(floor[RPS] or 0)
    ratio = float(hit[RPS] or 0) / floor_rps if floor_rps else float("nan")
    return [
        Check(
            f"cache hits through nginx, {callers} callers: req/s over the floor's",
            ">=",
            HITS_OVER_FLOOR,
            ratio,
            "x floor",
        ),
        Check(
            f"cache hits through nginx, {callers} callers: p50",
            "<=",
            15,
            float(hit[P50] or 0),
            "ms",
        ),
    ]


def section(
    rows: list[list[Cell]],
    callers: int,
    hits: int,
    rounds: int = 1,
    rates: dict[str, list[float]] | None = None,
) -> Section:
    """The table (each row's req/s over direct's and over the floor's), targets and notes."""
    found = checks(rows, callers)
    by = {row[0]: row for row in rows}
    base, floor = float(rows[0][RPS] or 0), float(by[FLOOR][RPS] or 0)
    for row in rows:
        rps = float(row[RPS] or 0)
        row[RPS + 1 : RPS + 1] = [rps / base if base else None, rps / floor if floor else None]
    notes = []
    if rates is not None:  # every round, so a run shows its own spread
        taken = [f"{side} " + ", ".join(f"{r:.0f}" for r in each) for side, each in rates.items()]
        notes.append("Each round's hits a second, in the order taken: " + "; ".join(taken) + ".")
    return Section(
        key="cache",
        title=f"Cache hits through nginx, {callers} callers",
        columns=[
            "path",
            "callers",
            "answers",
            "errors",
            "p50 ms",
            "p99 ms",
            "req/s",
            "req/s x direct",
            "req/s x floor",
            "gateway CPU ms/answer",
            "generator % core",
            "others % cores",
        ],
        rows=rows,
        data={
            "rows": rows,
            "settings": {
                "simulator": SIM,
                "answer_tokens": 50,
                "hits_per_row": hits,
                "callers": callers,
                "rounds_in_turns": rounds,
            },
            "rounds_rps": rates,
        },
        checks=found,
        notes=[
            "direct: the same call answered by the simulator (300 ms to the first token, "
            "50 tokens at 100 tokens/s), no cache. A hit is a 50-token answer stored by a "
            "first call (temperature 0, LLMGATE_CACHE_MODE=deterministic, the default).",
            "gateway CPU: nginx and gunicorn (masters and workers); Memcached is not counted. "
            "others % cores: what processes other than this benchmark's used meanwhile.",
            "floor: hit: the same stack serving bench/floor/app.py in the gateway's place (the "
            "overhead section's floor), which answers a repeated request from a dict in its "
            "worker: what nginx, gunicorn and Flask cost to answer from memory, before any of "
            "the gateway's own work. The hits' target is a ratio to it (req/s x floor), "
            "measured in the same run: at least 0.9x the floor's hits per second. Its stack "
            f"is up beside the gateway's, and the two take turns: {rounds} rounds each (HIT "
            "l1, floor, HIT l1, ...), each row the best of its side's rounds.",
            *notes,
        ],
    )
