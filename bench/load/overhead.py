"""The relay's overhead: the gateway against the simulator direct, nginx alone and the floor.

Five paths to one simulator (bench/load/overhead_paths.py), measured back to back for each load so
drift on a shared machine hits them alike: direct, nginx-only, the floor (the gateway's stack
serving bench/floor/app.py, an app that relays the call and does nothing else: what the shape
costs before any of the gateway's own work), the gateway (`make run`'s shape, cache off) and
gateway+keys (the same with a keys file and per-key limits counted in Memcached). The
gateway's targets are ratios to the floor measured in the same run (bench/load/overhead_table.py).

Two kinds of call, as in issue 11's table: a stream (200 ms to the first token, then 50
tokens at 100 tokens/s, each its own SSE event) and a non-stream answer after 50 ms, each at
1, 50 and 200 concurrent callers (bench/kit/loadgen.py: one keep-alive connection per caller,
the next request as soon as the last answer ended). Per path and load: TTFT and total
latency percentiles, req/s, the CPU of the path's process tree per request (/proc: nginx
and gunicorn masters and workers; the simulator and the generator are not counted, and
Memcached's is given apart), the upstream connections the simulator accepted per 1,000
requests, and the generator's own CPU. "Added" latency is the path's percentile minus the
direct path's at the same load.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.kit import loadgen, machine, proctree
from bench.kit.report import Config, Section
from bench.load import overhead_paths
from bench.load.overhead_paths import Route, sizing
from bench.load.overhead_runs import Measured, merge
from bench.load.overhead_table import PATHS, section
from runner.stack import StackOptions

PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Kind:
    name: str  # "stream" | "non-stream"
    stream: bool
    headers: dict[str, str]  # the simulator's per-request controls (simulator/behaviour.py)
    max_tokens: int
    counts: dict[int, int]  # callers -> requests measured

    def request(self, headers: dict[str, str] | None = None) -> bytes:
        """The call's raw bytes; ``headers`` are the caller's own (a key) beside the
        simulator's controls."""
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "bench overhead"}],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        }
        return loadgen.request_bytes(PATH, body, {**self.headers, **(headers or {})})


def kinds(smoke: bool) -> list[Kind]:
    if smoke:  # the same paths, short answers, a handful of calls
        return [
            Kind("stream", True, {"x-sim-ttft-ms": "20", "x-sim-tps": "1000"}, 10, {1: 3, 8: 24}),
            Kind("non-stream", False, {"x-sim-ttft-ms": "5"}, 16, {1: 5, 8: 40}),
        ]
    return [
        Kind(
            "stream",
            True,
            {"x-sim-ttft-ms": "200", "x-sim-tps": "100"},
            50,
            {1: 25, 50: 400, 200: 1400},
        ),
        Kind("non-stream", False, {"x-sim-ttft-ms": "50"}, 16, {1: 100, 50: 2000, 200: 6000}),
    ]


# The gateway's warm-up ends after QUIET_ROUNDS rounds in a row that opened no upstream
# connection, or after WARM_ROUNDS rounds in all (each two calls per caller).
WARM_ROUNDS = 8
QUIET_ROUNDS = 2


def sim_accepted(sim_url: str) -> int:
    """The simulator's count of accepted connections (those that begin with a control
    request, this query's own among them, are not counted: simulator/server.py)."""
    host, port = sim_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/sim/stats")
        return int(json.loads(conn.getresponse().read())["connections_accepted"])
    finally:
        conn.close()


def idle_rates(roots: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """CPU seconds per second each path's process tree uses with no call in flight."""
    pids = {path: [p for root in r for p in proctree.tree(root)] for path, r in roots.items()}
    before = {path: proctree.cpu_s(p) for path, p in pids.items()}
    time.sleep(seconds)
    return {path: (proctree.cpu_s(p) - before[path]) / seconds for path, p in pids.items()}


def measure(
    cfg: Config,
    kind: Kind,
    callers: int,
    count: int,
    path: str,
    route: Route,
    sim_url: str,
    idle: dict[str, float],
    ours: list[int],
) -> Measured:
    host, port = route.url.removeprefix("http://").split(":")
    request = kind.request(route.headers)
    pids = [p for root in route.roots for p in proctree.tree(root)]
    memcached = [p for root in route.memcached for p in proctree.tree(root)]
    cfg.progress(f"overhead: {kind.name}, {callers} callers, {path}")
    # Opened: what the simulator accepted meanwhile (only this path runs). Held: what the
    # path's own processes hold to it, from the OS: the simulator's open count also moves
    # when another path's idle connections time out (nginx-only closes its after 15 s,
    # keepalive_timeout in nginx/llmgate.conf.template).
    sim_port = int(sim_url.rsplit(":", 1)[1])
    cpu0, memcached0 = proctree.cpu_s(pids), proctree.cpu_s(memcached)
    accepted0, open0 = sim_accepted(sim_url), proctree.connections_to(pids, sim_port)
    others = machine.Others(ours)
    result = loadgen.run(host, int(port), request, callers, count)
    others_share = others.share()
    # What the tree burns with no call (timers, heartbeats of its own) is not per request.
    cpu = proctree.cpu_s(pids) - cpu0 - idle.get(path, 0.0) * result.wall
    memcached_idle = idle.get(f"{path} memcached", 0.0) * result.wall
    memcached_cpu = proctree.cpu_s(memcached) - memcached0 - memcached_idle
    accepted, still_open = sim_accepted(sim_url), proctree.connections_to(pids, sim_port)
    opened = accepted - accepted0
    closed = opened - (still_open - open0)
    done = max(1, len(result.total))
    upstream = path != "direct"
    return Measured(
        path,
        kind.name,
        callers,
        result,
        cpu / done * 1000 if pids else None,
        opened / done * 1000 if upstream else None,
        others_share,
        closed / done * 1000 if upstream else None,
        memcached_cpu / done * 1000 if memcached else None,
    )


def warm_up(cfg: Config, kind: Kind, callers: int, path: str, route: Route, sim_url: str) -> int:
    """Calls at this load before the measured run; the rounds it took."""
    host, port = route.url.removeprefix("http://").split(":")
    warm = max(2, callers * (1 if cfg.smoke else 2))
    # The gateway's warm-up lasts until rounds open no upstream connection: a worker's pool
    # grows while it meets a busier moment than before (accepts are uneven), and the
    # measured run is the steady state after. One quiet round was not enough (6 new in the
    # 1,400 streams after it). The floor's and gateway+keys' pools grow the same way: they
    # are warmed alike.
    pooled = path in ("floor", "gateway", "gateway+keys") and not cfg.smoke
    rounds, quiet_needed = (WARM_ROUNDS, QUIET_ROUNDS) if pooled else (1, 1)
    call = kind.request(route.headers)
    return warm_until_quiet(
        lambda: loadgen.run(host, int(port), call, callers, warm), sim_url, rounds, quiet_needed
    )


def warm_until_quiet(
    run_round: Callable[[], object],
    sim_url: str,
    rounds: int = WARM_ROUNDS,
    quiet_needed: int = QUIET_ROUNDS,
) -> int:
    """Warm-up rounds until ``quiet_needed`` in a row opened no upstream connection (the
    simulator's count), at most ``rounds``; the rounds it took."""
    done = quiet = 0
    while done < rounds and quiet < quiet_needed:
        done += 1
        accepted = sim_accepted(sim_url)
        run_round()
        quiet = quiet + 1 if sim_accepted(sim_url) == accepted else 0
    return done


def run(cfg: Config) -> Section:
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-overhead-"))
    options = StackOptions(
        run_dir=run_dir,
        memcached=False,
        workers=2,
        env={"LLMGATE_CACHE_MODE": "off", "LLMGATE_LOG_REQUESTS": "false"},
    )
    try:
        with overhead_paths.started(cfg, run_dir, options) as paths:
            routes, sim_url = paths.routes, paths.gateway.sim_url
            roots = {path: route.roots for path, route in routes.items()}
            aside = {f"{p} memcached": r.memcached for p, r in routes.items() if r.memcached}
            idle = idle_rates({**roots, **aside}, 1.0 if cfg.smoke else 5.0)
            # Ours: the bench itself, the simulator and every path's trees.
            ours = [os.getpid()] + [
                p for proc in paths.procs for p in proctree.tree(proc.popen.pid)
            ]
            out: list[Measured] = []
            warm_rounds: dict[str, dict[str, int]] = {"gateway": {}, "gateway+keys": {}}
            for kind in kinds(cfg.smoke):
                for callers, count in kind.counts.items():
                    for path in PATHS:  # warm pools and connections at this load
                        done = warm_up(cfg, kind, callers, path, routes[path], sim_url)
                        if path in warm_rounds:
                            warm_rounds[path][f"{kind.name}, {callers} callers"] = done
                    # Two halves in the order A B C, C B A: a drift of the machine's load
                    # during the runs is shared out evenly.
                    halves: dict[str, list[Measured]] = {p: [] for p in PATHS}
                    first = count - count // 2
                    for path, n in [(p, first) for p in PATHS] + [
                        (p, count - first) for p in reversed(PATHS)
                    ]:
                        if n:
                            args = (path, routes[path], sim_url, idle, ours)
                            halves[path].append(measure(cfg, kind, callers, n, *args))
                    for path in PATHS:
                        one, *rest = halves[path]
                        out.append(merge(one, rest[0]) if rest else one)
            return section(cfg, out, settings(cfg, options, paths, idle, warm_rounds))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def settings(
    cfg: Config,
    options: StackOptions,
    paths: overhead_paths.Paths,
    idle: dict[str, float],
    warm_rounds: dict[str, dict[str, int]],
) -> dict:
    """What the section's runs were, printed under its table."""
    return {
        "gunicorn_workers": options.workers,
        # nginx and gunicorn sized as `make run` sizes them (runner/sizing.py)
        "sizing": sizing(paths.gateway),
        "LLMGATE_CACHE_MODE": "off",
        "gateway+keys": "LLMGATE_KEYS_FILE (one key, per-key limits) and LLMGATE_MEMCACHED",
        "idle_cpu_share": idle,
        "warm_up_rounds": warm_rounds,
        "kinds": {
            k.name: {
                "headers": k.headers,
                "max_tokens": k.max_tokens,
                "requests_per_callers": k.counts,
            }
            for k in kinds(cfg.smoke)
        },
    }
