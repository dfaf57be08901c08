"""Relay overhead: the gateway against the simulator direct and against nginx alone.

Three targets, one process, the same simulator behind each:

    direct      client → simulator
    nginx-only  client → nginx → simulator            (same nginx template, no app)
    gateway     client → nginx → gunicorn → simulator (the full llmgate path)

Printed: latency percentiles and their ratio to direct, throughput at a fixed concurrency,
time to first token of a stream, upstream connections opened per request (pool reuse) and
memory per open stream in the gunicorn workers. Numbers, not asserts: run on a quiet machine
and compare ratios, not absolute values.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import urllib3

from app.core.config import Settings
from runner.nginx import NginxParams, start_nginx
from runner.procs import Proc, free_port
from runner.stack import Stack, StackOptions

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "bench"}], "max_tokens": 16}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_nginx_only(
    sim_url: str, run_dir: Path, workers: int = 1, connections: int = 8192
) -> tuple[Proc, str]:
    """The same nginx template with the simulator in place of gunicorn."""
    port = free_port()
    params = NginxParams.for_settings(
        Settings(),
        listen=f"127.0.0.1:{port}",
        app_servers=[sim_url.removeprefix("http://")],
        worker_processes=workers,
        worker_connections=connections,
    )
    proc = start_nginx(
        run_dir / "nginx-only",
        params,
        log_path=run_dir / "logs" / "nginx-only.log",
        name="nginx-only",
    )
    return proc, f"http://127.0.0.1:{port}"


class Target:
    def __init__(self, name: str, url: str, concurrency: int) -> None:
        self.name = name
        self.url = url
        self.http = urllib3.PoolManager(maxsize=concurrency, retries=False)

    def chat(self, stream: bool = False, headers: dict[str, str] | None = None) -> float:
        """Seconds to the full answer (non-stream) or to the first content event (stream)."""
        body = json.dumps({**CHAT, "stream": stream}).encode()
        started = time.perf_counter()
        resp = self.http.request(
            "POST",
            self.url + "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", **(headers or {})},
            preload_content=False,
        )
        first = None
        seen = b""
        while chunk := resp.read1(65536):
            seen += chunk
            if first is None and b'"content":"' in seen.replace(b'"content":""', b""):
                first = time.perf_counter() - started
        resp.release_conn()
        if resp.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {resp.status}")
        total = time.perf_counter() - started
        return first if stream and first is not None else total


def run_many(fn: Callable[[], float], count: int, concurrency: int) -> tuple[list[float], float]:
    started = time.perf_counter()
    if concurrency == 1:
        samples = [fn() for _ in range(count)]
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            samples = list(pool.map(lambda _: fn(), range(count)))
    return samples, time.perf_counter() - started


def sim_stats(http: urllib3.PoolManager, sim_url: str) -> dict:
    return json.loads(http.request("GET", sim_url + "/sim/stats").data)


def worker_rss_kb(gunicorn: Proc) -> int:
    """Resident memory of gunicorn's workers (children of the master)."""
    total = 0
    master = gunicorn.popen.pid
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("PPid", "").strip() == str(master):
            total += int(fields.get("VmRSS", "0 kB").split()[0])
    return total


def hold_streams(url: str, count: int) -> list[socket.socket]:
    """Open ``count`` slow streams and read their first bytes; return the open sockets."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 1000}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"x-sim-tps: 0.2\r\nx-sim-ttft-ms: 0\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    socks = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(request)
        socks.append(sock)
    for sock in socks:
        sock.settimeout(30)
        sock.recv(4096)
    return socks


def main(requests: int = 2000, concurrency: int = 16, streams: int = 1000) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-"))
    stack = Stack(
        StackOptions(
            run_dir=run_dir,
            memcached=False,
            workers=2,
            simulator_args=["--ttft-ms", "0", "--tps", "5000"],
        )
    ).start()
    nginx_only, nginx_url = start_nginx_only(stack.sim_url, run_dir)
    http = urllib3.PoolManager()
    try:
        targets = [
            Target("direct", stack.sim_url, concurrency),
            Target("nginx-only", nginx_url, concurrency),
            Target("gateway", stack.url, concurrency),
        ]
        for target in targets:  # warm pools and caches
            run_many(target.chat, 50, 4)
        rows = []
        for target in targets:
            before = sim_stats(http, stack.sim_url)["connections_accepted"]
            lat, _ = run_many(target.chat, requests // 4, 1)
            ttft, _ = run_many(functools.partial(target.chat, stream=True), requests // 4, 1)
            _, wall = run_many(target.chat, requests, concurrency)
            opened = sim_stats(http, stack.sim_url)["connections_accepted"] - before
            rows.append((target.name, lat, ttft, requests / wall, opened))
        base = rows[0]
        print(f"\nrelay benchmark: {requests} requests, concurrency {concurrency}, 2 workers")
        print(
            f"{'target':<11} {'p50 ms':>7} {'p99 ms':>7} {'p50 x':>6} {'ttft p50':>9} "
            f"{'ttft x':>7} {'req/s':>7} {'req/s x':>8} {'new upstream conns':>19}"
        )
        for name, lat, ttft, rps, opened in rows:
            print(
                f"{name:<11} {percentile(lat, 0.5) * 1e3:7.2f} {percentile(lat, 0.99) * 1e3:7.2f} "
                f"{percentile(lat, 0.5) / percentile(base[1], 0.5):6.2f} "
                f"{percentile(ttft, 0.5) * 1e3:9.2f} "
                f"{percentile(ttft, 0.5) / percentile(base[2], 0.5):7.2f} {rps:7.0f} "
                f"{rps / base[3]:8.2f} {opened:>19}"
            )
        print(
            f"(p50 of {requests // 4} sequential calls; 'new upstream conns' counts TCP "
            f"connections the simulator accepted during {requests * 3 // 2} calls)"
        )

        gunicorn = stack.proc("gunicorn")
        idle_kb = worker_rss_kb(gunicorn)
        socks = hold_streams(stack.url, streams)
        time.sleep(1.0)
        held = sim_stats(http, stack.sim_url)
        busy_kb = worker_rss_kb(gunicorn)
        for sock in socks:
            sock.close()
        print(
            f"\n{streams} open streams through the gateway: workers {idle_kb / 1024:.0f} MB → "
            f"{busy_kb / 1024:.0f} MB, {(busy_kb - idle_kb) / streams:.1f} KB per stream; "
            f"simulator sees {held['streams_started'] - held['streams_completed']} live"
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            stats = sim_stats(http, stack.sim_url)
            if stats["streams_abandoned"] >= streams:
                break
            time.sleep(0.2)
        print(f"after the callers left: {stats['streams_abandoned']} abandoned upstream streams")
    finally:
        nginx_only.stop()
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
