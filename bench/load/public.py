"""The public method: llmgate measured as the most complete public cross-gateway run measures
gateways (issue 45; docs/performance.md, "Against peers"), on this machine, features off.

- **Added latency at concurrency 1**: one caller, sequential non-stream chat calls against
  the 20 ms mock, 7 rounds of 25 after 15 of warm-up, straight to the simulator and through
  the gateway in turns; the median over rounds of each round's p50 and p99 difference.
- **Sustained req/s against a 20 ms mock**: non-stream chat calls, the concurrency stepped
  (50, 100, 200, 400, 800 callers, each a closed loop on its own keep-alive connection, after
  a warm-up at that load); the figure is the highest req/s of a step with p99 under 1 s and
  under 0.1 % errors. Each step also says whether the queue is fair (p99 within twice
  callers ÷ req/s, the time a caller waits when every caller gets its turn in order), its
  errors by status, and the upstream connections opened per 1,000 calls after the warm-up
  (rounds of two calls a caller until two in a row open none).
- **Stall-free streams held at once**: N streams opened through `make run`'s shape and held
  (pings only) until all are open, then paced at one token a second for ten tokens; a
  stream is stall-free when it got its 200, every token and [DONE], and no gap between two
  reads after its first token was over twice the pace. The figure is the largest step
  (128, 512, 1,000, 2,000, 5,000, 10,000) whose every stream was stall-free. The public run's
  own pacing was not published with its figures; this one is stated here.
- **Translated req/s at 20 ms**: the sustained figure again for chat calls to an
  Anthropic-kind upstream (the gateway translates both ways: docs/providers.md).

Features off (peers publish so): `make run`'s 2 gevent workers and nginx, the cache and the
JSON line per request off, no keys; Server-Timing and the metrics on. The load generator
(bench/kit/loadgen.py, one thread) shares the two cores; the public run had four cores
pinned to the gateway and its mock and load elsewhere.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.kit import loadgen
from bench.kit.loadgen import pct
from bench.kit.report import Check, Config, Section
from bench.load.capacity import stack_options
from bench.load.overhead import sim_accepted, warm_until_quiet
from runner.stack import Stack, StackOptions
from tests.support.calls import raw_chat_request
from tests.support.held import HOLD_BODY, HeldStreams, raise_fd_limit
from tests.support.kinds import kinds_toml
from tests.support.server_timing import stages
from tests.support.sim import start_simulator

UPSTREAM_MS = 20
STEPS = (50, 100, 200, 400, 800)
STREAM_STEPS = (128, 512, 1000, 2000, 5000, 10_000)
P99_BOUND_S = 1.0
ERROR_BOUND = 0.001
PACE_TPS = 1.0
PACE_TOKENS = 10
STALL_PACES = 2.0  # a gap of more than this many token intervals is a stall
PROMPT = [{"role": "user", "content": "Say something short."}]
Address = tuple[str, int]


@dataclass(frozen=True)
class Step:
    """One load of the sustained method."""

    callers: int
    calls: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: dict[str, int]
    new_conns_per_1000: float
    # The gateway's own stages (its Server-Timing, ms) averaged over the calls at or past the
    # step's p99, and their whole time: where the tail's time went.
    tail_ms: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def error_rate(self) -> float:
        done = self.calls + sum(self.errors.values())
        return sum(self.errors.values()) / done if done else 0.0

    @property
    def passes(self) -> bool:
        """Within the public method's bounds: p99 under 1 s, under 0.1 % errors."""
        return self.p99_ms < P99_BOUND_S * 1000 and self.error_rate < ERROR_BOUND

    @property
    def fair_bound_ms(self) -> float:
        """Twice callers ÷ req/s: a caller's wait when every caller gets its turn in order,
        doubled."""
        return 2000 * self.callers / self.rps if self.rps else float("nan")


def chat(model: str = "sim-model", headers: dict[str, str] | None = None) -> bytes:
    """A non-stream chat call answered after the mock's 20 ms."""
    body = {"model": model, "messages": PROMPT, "max_tokens": 16}
    controls = {"x-sim-ttft-ms": str(UPSTREAM_MS), **(headers or {})}
    return loadgen.request_bytes("/v1/chat/completions", body, controls)


def address(url: str) -> Address:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def added_latency(
    gateway: Address, direct: Address, rounds: int = 7, per_round: int = 25, warm: int = 15
) -> dict[str, Any]:
    """Sequential calls through the gateway and straight to the mock, in turns: the median
    over rounds of the p50 and p99 differences, ms."""
    call = chat()
    loadgen.run(*gateway, call, 1, warm)
    loadgen.run(*direct, call, 1, warm)
    p50s, p99s = [], []
    for _ in range(rounds):
        through = loadgen.run(*gateway, call, 1, per_round)
        straight = loadgen.run(*direct, call, 1, per_round)
        p50s.append(pct(through.total, 0.5) - pct(straight.total, 0.5))
        p99s.append(pct(through.total, 0.99) - pct(straight.total, 0.99))
    return {
        "p50_ms": statistics.median(p50s),
        "p99_ms": statistics.median(p99s),
        "rounds_p50": p50s,
        "rounds_p99": p99s,
    }


def step(
    addr: Address, call: bytes, callers: int, count: int, sim_url: str, pooled: bool = True
) -> Step:
    """One load, after a warm-up at it: its figures, and the upstream connections the
    simulator accepted meanwhile. A gateway's warm-up rounds (two calls a caller each) go on
    until two in a row opened no upstream connection (at most eight, as the overhead
    section's): a fresh stack's first burst meets gunicorn accepting nginx's new connections,
    so the gateway's pools see the load's full concurrency only in a later round. Not
    ``pooled`` (the simulator called directly, whose every round opens the callers' own
    connections; or a smoke run): one round."""
    warm_until_quiet(
        lambda: loadgen.run(*addr, call, callers, callers * 2),
        sim_url,
        *(() if pooled else (1, 1)),
    )
    accepted = sim_accepted(sim_url)
    result = loadgen.run(*addr, call, callers, count, keep="Server-Timing")
    opened = sim_accepted(sim_url) - accepted
    done = max(1, len(result.total))
    p99 = pct(result.total, 0.99)
    return Step(
        callers=callers,
        calls=len(result.total),
        rps=result.rps,
        p50_ms=pct(result.total, 0.5),
        p95_ms=pct(result.total, 0.95),
        p99_ms=p99,
        errors=dict(Counter(result.errors)),
        new_conns_per_1000=1000 * opened / done,
        tail_ms=tail_stages(result.kept, p99 / 1000),
    )


def tail_stages(kept: list[tuple[float, str]], p99_s: float) -> dict[str, float]:
    """The mean of each Server-Timing stage (ms) over the answers that took ``p99_s`` or
    more, with their mean whole time as ``total`` (empty: no answer said its stages, e.g.
    the mock's own)."""
    tail = [(total, stages(value)) for total, value in kept if total >= p99_s and value]
    if not tail:
        return {}
    names = {name for _, found in tail for name in found}
    means = {n: sum(found.get(n, 0.0) for _, found in tail) / len(tail) for n in sorted(names)}
    return {**means, "total": 1000 * sum(total for total, _ in tail) / len(tail)}


def sustained(
    cfg: Config, what: str, addr: Address, call: bytes, sim_url: str, steps: tuple[int, ...]
) -> list[Step]:
    out = []
    for callers in steps:
        count = 50 if cfg.smoke else max(3000, callers * 10)
        cfg.progress(f"public: {what}, {callers} callers, {count} calls")
        out.append(step(addr, call, callers, count, sim_url, not cfg.smoke and what != "direct"))
    return out


def best(steps: list[Step]) -> Step | None:
    """The sustained figure's step: the highest req/s within the bounds."""
    passing = [s for s in steps if s.passes]
    return max(passing, key=lambda s: s.rps) if passing else None


def stall_free(
    host: str, port: int, n: int, hold_s: float, tps: float = PACE_TPS, tokens: int = PACE_TOKENS
) -> dict[str, Any]:
    """``n`` streams held at once, then paced (``tokens`` at ``tps``): how many were
    stall-free, and the gaps."""
    raise_fd_limit(n + 1024)
    began = time.monotonic()
    release = began + hold_s + n * 0.006
    body = {**HOLD_BODY, "max_tokens": tokens}
    headers = {
        "x-sim-ttft-ms": str(int((release - began) * 1000)),
        "x-sim-tps": f"{tps:g}",
        "Connection": "close",
    }
    streams = HeldStreams(host, port, batch=3000)
    streams.add([raw_chat_request(host, body, headers) for _ in range(n)])
    streams.run(lambda: not streams.pending, release + tokens / tps + 30 + n * 0.01)
    streams.finish("still open after its last token was due")
    limit = STALL_PACES / tps
    ok = [s for s in streams.streams if s.done and not s.error and s.max_data_gap <= limit]
    gaps = sorted(s.max_data_gap for s in streams.streams if s.first_data_at)
    errors = Counter(s.error.split(":", 1)[0] for s in streams.streams if s.error)
    return {
        "streams": n,
        "held_at_once": streams.peak_held,
        "stall_free": len(ok),
        "stalled": sum(1 for s in streams.streams if s.done and s.max_data_gap > limit),
        "errors": dict(errors),
        "gap_p99_s": gaps[int(0.99 * (len(gaps) - 1))] if gaps else float("nan"),
        "gap_max_s": gaps[-1] if gaps else float("nan"),
    }


@contextmanager
def started(options: StackOptions) -> Iterator[Stack]:
    stack = Stack(options)
    try:
        yield stack.start()
    finally:
        stack.stop()


def options(run_dir: Path, env: dict[str, str] | None = None) -> StackOptions:
    """`make run`'s shape (runner/sizing.py's sizes), the simulator upstream, features off."""
    base = stack_options(run_dir, 15.0)
    features_off = {"LLMGATE_CACHE_MODE": "off", "LLMGATE_LOG_REQUESTS": "false"}
    return dataclasses.replace(
        base, memcached=False, env={**base.env, **features_off, **(env or {})}
    )


def measure(cfg: Config, progress: Callable[[str], None]) -> dict[str, Any]:
    """The four figures and what they are made of."""
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-public-"))
    steps = (20, 50) if cfg.smoke else STEPS
    try:
        with started(options(run_dir / "chat")) as stack:
            gateway, direct = address(stack.url), address(stack.sim_url)
            progress("public: added latency at concurrency 1")
            added = added_latency(gateway, direct, *((2, 5, 3) if cfg.smoke else (7, 25, 15)))
            chat_steps = sustained(cfg, "chat", gateway, chat(), stack.sim_url, steps)
            direct_steps = sustained(cfg, "direct", direct, chat(), stack.sim_url, steps[-1:])
            held = []
            for n in (16,) if cfg.smoke else STREAM_STEPS:
                progress(f"public: {n} streams held, then paced")
                if cfg.smoke:
                    level = stall_free(*gateway, n, hold_s=1.0, tps=20.0, tokens=5)
                else:
                    level = stall_free(*gateway, n, hold_s=3.0)
                held.append(level)
                if level["stall_free"] < n:
                    break  # the next step cannot do better
        # Chat over Anthropic: an upstreams file whose m-anthropic is an Anthropic-kind
        # upstream on a simulator of its own (bench/cpu/translation.py's stack).
        sim, sim_url = start_simulator(run_dir)
        try:
            kinds = run_dir / "kinds.toml"
            kinds.write_text(kinds_toml(sim_url))
            env = {"LLMGATE_CONFIG": str(kinds)}
            translated_options = dataclasses.replace(
                options(run_dir / "kinds", env), upstream_url="http://127.0.0.1:9/v1"
            )
            with started(translated_options) as stack:
                call = chat("m-anthropic")
                translated = sustained(
                    cfg, "chat over anthropic", address(stack.url), call, sim_url, steps
                )
        finally:
            sim.stop()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "added": added,
        "chat": chat_steps,
        "direct": direct_steps,
        "streams": held,
        "translated": translated,
    }


COLUMNS = [
    "what",
    "callers",
    "req/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "fair bound ms",
    "errors",
    "new upstream conns /1000",
    "within p99 < 1 s, < 0.1 % errors",
    "the tail's queue / work / gateway ms",
]


def row(what: str, s: Step, upstream: bool = True) -> list[Any]:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "0"
    conns = s.new_conns_per_1000 if upstream else None  # direct: the callers' own
    tail = s.tail_ms
    stages = (
        f"{tail.get('queue', 0):.1f} / {tail.get('work', 0):.1f} / {tail.get('gateway', 0):.1f}"
        f" of {tail['total']:.0f}"
        if tail
        else None
    )
    verdict = "yes" if s.passes else "no"
    figures = [s.callers, s.rps, s.p50_ms, s.p95_ms, s.p99_ms, s.fair_bound_ms]
    return [what, *figures, errors, conns, verdict, stages]


def section(found: dict[str, Any]) -> Section:
    chat_steps: list[Step] = found["chat"]
    top, translated = best(chat_steps), best(found["translated"])
    held = found["streams"]
    clean = [h["streams"] for h in held if h["stall_free"] == h["streams"]]
    hi = chat_steps[-1]
    rows = [row("chat", s) for s in chat_steps]
    rows += [row("direct (the mock alone)", s, upstream=False) for s in found["direct"]]
    rows += [row("chat over anthropic", s) for s in found["translated"]]
    added = found["added"]
    return Section(
        key="public",
        title="The public method: added p99 at 1 caller, sustained req/s at 20 ms, "
        "stall-free streams, translated req/s",
        columns=COLUMNS,
        rows=rows,
        data={
            "added_latency": added,
            "steps": [dataclasses.asdict(s) for s in chat_steps],
            "direct": [dataclasses.asdict(s) for s in found["direct"]],
            "translated": [dataclasses.asdict(s) for s in found["translated"]],
            "streams": held,
            "figures": {
                "added_p50_ms": added["p50_ms"],
                "added_p99_ms": added["p99_ms"],
                "sustained_rps": top.rps if top else 0.0,
                "sustained_callers": top.callers if top else 0,
                "stall_free_streams": max(clean, default=0),
                "translated_rps": translated.rps if translated else 0.0,
            },
            "settings": {
                "upstream_ms": UPSTREAM_MS,
                "steps": [s.callers for s in chat_steps],
                "pace": f"{PACE_TOKENS} tokens at {PACE_TPS:g}/s, a stall over "
                f"{STALL_PACES:g} intervals",
            },
        },
        checks=[
            Check(
                f"{hi.callers} callers at {UPSTREAM_MS} ms: p99 over callers ÷ req/s",
                "<=",
                2.0,
                hi.p99_ms / (1000 * hi.callers / hi.rps) if hi.rps else float("inf"),
                "x fair share",
            ),
            Check(
                f"{hi.callers} callers: new upstream connections per 1,000 after warm-up",
                "<=",
                0,
                hi.new_conns_per_1000,
            ),
        ],
        notes=[
            f"Added latency at concurrency 1 (median of {len(added['rounds_p50'])} rounds of "
            f"sequential calls, gateway minus the mock straight): p50 {added['p50_ms']:.2f} ms, "
            f"p99 {added['p99_ms']:.2f} ms.",
            "Sustained: "
            + (
                f"{top.rps:,.0f} req/s at {top.callers} callers (p99 {top.p99_ms:.0f} ms)"
                if top
                else "no step within the bounds"
            )
            + "; translated (chat over anthropic): "
            + (f"{translated.rps:,.0f} req/s at {translated.callers}" if translated else "none")
            + ". fair bound: twice callers ÷ req/s, what a caller waits at most when every "
            "caller gets its turn in order (doubled).",
            "Stall-free streams: "
            + "; ".join(
                f"{h['streams']:,}: {h['stall_free']:,} stall-free (held at once "
                f"{h['held_at_once']:,}, longest gap p99 {h['gap_p99_s']:.2f} s, max "
                f"{h['gap_max_s']:.2f} s, errors {h['errors'] or 0})"
                for h in held
            )
            + ".",
            "Features off: `make run`'s shape (2 gevent workers, nginx sized by "
            "runner/sizing.py), cache and log line off, no keys; the load generator on the "
            "same 2 cores.",
        ],
        fmt=".1f",
    )


def run(cfg: Config) -> Section:
    return section(measure(cfg, cfg.progress))
