"""The relay's overhead: the gateway against the simulator direct and against nginx alone.

Four paths to one simulator, measured back to back for each load so drift on a shared
machine hits them alike:

    direct      caller → simulator
    nginx-only  caller → nginx → simulator             (the same nginx template, no app)
    floor       caller → nginx → gunicorn → simulator  (the same shape, bench/floor_app.py)
    gateway     caller → nginx → gunicorn → simulator  (`make run`'s shape, cache off)

The floor is the gateway's stack with gunicorn serving bench/floor_app.py in its place, an
app that relays the call and does nothing else: what the shape costs before any of the
gateway's own work. A target below the floor cannot be met by cutting that work.

Two kinds of call, as in issue 11's table: a stream (200 ms to the first token, then 50
tokens at 100 tokens/s, each its own SSE event) and a non-stream answer after 50 ms, each at
1, 50 and 200 concurrent callers (bench/loadgen.py: one keep-alive connection per caller,
the next request as soon as the last answer ended). Per path and load: TTFT and total
latency percentiles, req/s, the CPU of the path's process tree per request (/proc: nginx
and gunicorn masters and workers; the simulator and the generator are not counted), the
upstream connections the simulator accepted per 1,000 requests, and the generator's own
CPU. "Added" latency is the path's percentile minus the direct path's at the same load.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import loadgen, machine, proctree
from bench.loadgen import pct
from bench.overhead_table import PATHS, section
from bench.relay import start_nginx_only
from bench.report import Config, Section
from runner.procs import Proc
from runner.stack import Stack, StackOptions

PATH = "/v1/chat/completions"
# The floor path's app, as gunicorn's APP_MODULE argument (bench/floor.py runs it alone).
FLOOR_APP = "bench.floor_app:app"


@dataclass(frozen=True)
class Kind:
    name: str  # "stream" | "non-stream"
    stream: bool
    headers: dict[str, str]  # the simulator's per-request controls (simulator/behaviour.py)
    max_tokens: int
    counts: dict[int, int]  # callers -> requests measured

    def request(self) -> bytes:
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "bench overhead"}],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        }
        return loadgen.request_bytes(PATH, body, self.headers)


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


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "mean": statistics.fmean(samples) * 1000 if samples else math.nan,
        **{f"p{round(q * 100)}": pct(samples, q) for q in (0.5, 0.9, 0.99)},
        "max": max(samples) * 1000 if samples else math.nan,
    }


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


@dataclass
class Measured:
    path: str
    kind: str
    callers: int
    result: loadgen.Result
    cpu_ms: float | None  # per request, the path's process tree
    upstream_per_1000: float | None
    others: float  # the share of all cores other processes used meanwhile
    # Upstream connections closed per 1,000 requests: opened less what the simulator's open
    # count grew by. A pool that keeps every connection it opened closes none.
    closed_per_1000: float | None = None

    def row_data(self) -> dict:
        r = self.result
        return {
            "path": self.path,
            "kind": self.kind,
            "callers": self.callers,
            "requests": len(r.total),
            "errors": len(r.errors),
            "first_errors": r.errors[:3],
            "ttft_ms": summary(r.ttft),
            "total_ms": summary(r.total),
            "rps": r.rps,
            "cpu_ms_per_request": self.cpu_ms,
            "upstream_connections_per_1000": self.upstream_per_1000,
            "upstream_connections_closed_per_1000": self.closed_per_1000,
            "loadgen_core_share": r.load,
            "others_cores_share": self.others,
        }


def sizing(stack: Stack) -> dict[str, int]:
    """The stack's nginx and gunicorn sizes, as started (runner/sizing.py)."""
    found = getattr(stack, "sizing", None)
    keys = ("worker_connections", "streams", "nginx_workers", "nginx_connections")
    return {k: getattr(found, k) for k in keys if hasattr(found, k)}


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
    url: str,
    pids: list[int],
    sim_url: str,
    idle_rate: float,
    ours: list[int],
) -> Measured:
    host, port = url.removeprefix("http://").split(":")
    request = kind.request()
    cfg.progress(f"overhead: {kind.name}, {callers} callers, {path}")
    # Opened: what the simulator accepted meanwhile (only this path runs). Held: what the
    # path's own processes hold to it, from the OS: the simulator's open count also moves
    # when another path's idle connections time out (nginx-only closes its after 15 s,
    # keepalive_timeout in nginx/llmgate.conf.template).
    sim_port = int(sim_url.rsplit(":", 1)[1])
    cpu0, accepted0 = proctree.cpu_s(pids), sim_accepted(sim_url)
    open0 = proctree.connections_to(pids, sim_port)
    others = machine.Others(ours)
    result = loadgen.run(host, int(port), request, callers, count)
    others_share = others.share()
    # What the tree burns with no call (timers, heartbeats of its own) is not per request.
    cpu = proctree.cpu_s(pids) - cpu0 - idle_rate * result.wall
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
    )


def merge(a: Measured, b: Measured) -> Measured:
    """One path's two halves as one run: samples pooled, per-request figures weighted."""
    ra, rb = a.result, b.result
    na, nb = max(1, len(ra.total)), max(1, len(rb.total))

    def mean(x: float | None, y: float | None, wx: float, wy: float) -> float | None:
        return None if x is None or y is None else (x * wx + y * wy) / (wx + wy)

    result = loadgen.Result(
        ra.ttft + rb.ttft,
        ra.total + rb.total,
        ra.errors + rb.errors,
        ra.wall + rb.wall,
        ra.cpu + rb.cpu,
    )
    return Measured(
        a.path,
        a.kind,
        a.callers,
        result,
        mean(a.cpu_ms, b.cpu_ms, na, nb),
        mean(a.upstream_per_1000, b.upstream_per_1000, na, nb),
        mean(a.others, b.others, ra.wall, rb.wall) or 0.0,
        mean(a.closed_per_1000, b.closed_per_1000, na, nb),
    )


def run(cfg: Config) -> Section:
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-overhead-"))
    options = StackOptions(
        run_dir=run_dir, memcached=False, workers=2, env={"LLMGATE_CACHE_MODE": "off"}
    )
    stack = Stack(options)
    floor: Stack | None = None
    nginx_only: Proc | None = None
    try:
        cfg.progress("overhead: starting simulator, gunicorn (2 workers), nginx, nginx-only")
        stack.start()
        cfg.progress("overhead: starting the floor (the same stack serving bench/floor_app.py)")
        floor = Stack(
            dataclasses.replace(
                options,
                run_dir=run_dir / "floor",
                upstream_url=stack.sim_url + "/v1",
                wsgi_app=FLOOR_APP,
            )
        ).start()
        # nginx-only sized as the gateway's nginx, so the two differ by the app alone.
        size = sizing(stack)
        nginx_only, nginx_url = start_nginx_only(
            stack.sim_url,
            run_dir,
            size.get("nginx_workers", 1),
            size.get("nginx_connections", 8192),
        )
        urls = {
            "direct": stack.sim_url,
            "nginx-only": nginx_url,
            "floor": floor.url,
            "gateway": stack.url,
        }
        roots = {
            "direct": [],
            "nginx-only": [nginx_only.popen.pid],
            "floor": [floor.proc("nginx").popen.pid, floor.proc("gunicorn").popen.pid],
            "gateway": [stack.proc("nginx").popen.pid, stack.proc("gunicorn").popen.pid],
        }
        idle = idle_rates(roots, 1.0 if cfg.smoke else 5.0)
        # Ours: the bench itself, the simulator and both paths' trees.
        ours = [os.getpid()] + [
            p
            for proc in [*stack.procs, *floor.procs, nginx_only]
            for p in proctree.tree(proc.popen.pid)
        ]
        out: list[Measured] = []
        warm_rounds: dict[str, int] = {}
        for kind in kinds(cfg.smoke):
            for callers, count in kind.counts.items():
                host_ports = {p: urls[p].removeprefix("http://").split(":") for p in PATHS}
                for path in PATHS:  # warm pools and connections at this load
                    host, port = host_ports[path]
                    warm = max(2, callers * (1 if cfg.smoke else 2))
                    # The gateway's warm-up lasts until rounds open no upstream connection:
                    # a worker's pool grows while it meets a busier moment than before
                    # (accepts are uneven), and the measured run is the steady state after.
                    # One quiet round was not enough (6 new in the 1,400 streams after it).
                    # The floor's pools grow the same way: it is warmed alike.
                    pooled = path in ("floor", "gateway") and not cfg.smoke
                    rounds, quiet_needed = (WARM_ROUNDS, QUIET_ROUNDS) if pooled else (1, 1)
                    done = quiet = 0
                    while done < rounds and quiet < quiet_needed:
                        done += 1
                        accepted = sim_accepted(stack.sim_url)
                        loadgen.run(host, int(port), kind.request(), callers, warm)
                        quiet = quiet + 1 if sim_accepted(stack.sim_url) == accepted else 0
                    if path == "gateway":
                        warm_rounds[f"{kind.name}, {callers} callers"] = done
                # Two halves in the order A B C, C B A: a drift of the machine's load
                # during the three runs is shared out evenly.
                halves: dict[str, list[Measured]] = {p: [] for p in PATHS}
                first = count - count // 2
                for path, n in [(p, first) for p in PATHS] + [
                    (p, count - first) for p in reversed(PATHS)
                ]:
                    if n:
                        pids = [p for root in roots[path] for p in proctree.tree(root)]
                        args = (path, urls[path], pids, stack.sim_url, idle[path], ours)
                        halves[path].append(measure(cfg, kind, callers, n, *args))
                for path in PATHS:
                    one, *rest = halves[path]
                    out.append(merge(one, rest[0]) if rest else one)
        settings = {
            "gunicorn_workers": options.workers,
            # nginx and gunicorn sized as `make run` sizes them (runner/sizing.py)
            "sizing": sizing(stack),
            "LLMGATE_CACHE_MODE": "off",
            "idle_cpu_share": idle,
            "gateway_warm_up_rounds": warm_rounds,
            "kinds": {
                k.name: {
                    "headers": k.headers,
                    "max_tokens": k.max_tokens,
                    "requests_per_callers": k.counts,
                }
                for k in kinds(cfg.smoke)
            },
        }
        return section(cfg, out, settings)
    finally:
        if nginx_only is not None:
            nginx_only.stop()
        if floor is not None:
            floor.stop()
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
