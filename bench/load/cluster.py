"""The numbers of docs/scaling.md, measured on `make run-cluster`'s shape on loopback.

`python -m bench.load.cluster`: 3 instances (1 gevent worker each) behind one nginx, 2 Memcached
nodes, the simulator. Prints: Memcached bytes per 1,000 cached answers; throughput and the
gateway's CPU per call; what calls in flight and CPU say while slow streams are held (the
autoscaling signal); memory per instance holding those streams.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import urllib3

from bench.kit import proctree
from bench.kit.proctree import cpu_s, tree
from runner.stack import Stack, StackOptions
from tests.support.calls import ManyStreams, call, chat_body, raw_chat_request

http = urllib3.PoolManager(maxsize=128, retries=False)


def mc_stats(addr: str) -> dict[str, int]:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"stats\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            buf += sock.recv(65536)
    return {
        p[1]: int(p[2])
        for p in (line.split() for line in buf.decode().splitlines())
        if len(p) == 3 and p[2].isdigit()
    }


def rss_mib(pids: list[int]) -> float:
    return proctree.rss_kb(pids) / 1024


def gateway_pids(stack: Stack) -> list[list[int]]:
    return [tree(stack.proc(stack.instance_name(i)).popen.pid) for i in range(3)]


def in_flight(stack: Stack) -> float:
    total = 0.0
    for url in stack.app_urls:
        text = http.request("GET", url + "/metrics", headers={"Connection": "close"}).data
        for line in text.decode().splitlines():
            if line.startswith('llmgate_admission_in_flight{kind="requests"}'):
                total += float(line.split()[-1])
    return total


def memcached_per_1000(stack: Stack, tokens: int, stream: bool) -> tuple[float, float]:
    before = [mc_stats(a) for a in stack.memcached_addrs]
    run = uuid.uuid4().hex[:6]

    def one(i: int) -> None:
        out = call(http, stack.url, f"{run} {i}", tokens, stream=stream, temperature=0)
        assert out.kind == "ok", str(out)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(1000)))
    after = [mc_stats(a) for a in stack.memcached_addrs]
    items = sum(a["curr_items"] - b["curr_items"] for a, b in zip(after, before, strict=True))
    data = sum(a["bytes"] - b["bytes"] for a, b in zip(after, before, strict=True))
    return items, data / items * 1000 / 2**20


def throughput(stack: Stack, n: int = 3000, concurrency: int = 32) -> tuple[float, float]:
    pids = [p for group in gateway_pids(stack) for p in group]
    run = uuid.uuid4().hex[:6]
    cpu0, t0 = cpu_s(pids), time.monotonic()

    def one(i: int) -> None:  # not cacheable: every call goes upstream
        out = call(http, stack.url, f"{run} {i}", 8, stream=False, headers={"x-sim-ttft-ms": "0"})
        assert out.kind == "ok", str(out)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(n)))
    took = time.monotonic() - t0
    return n / took, (cpu_s(pids) - cpu0) / n * 1000


def held_streams(stack: Stack, count: int) -> None:
    host, port = stack.url.removeprefix("http://").split(":")
    streams = ManyStreams(host, int(port))
    run = uuid.uuid4().hex[:6]
    slow = {"x-sim-tps": "1", "x-sim-ttft-ms": "0"}
    requests = [
        raw_chat_request(host, chat_body(f"{run} {i}", 60, stream=True, temperature=None), slow)
        for i in range(count)
    ]
    streams.open(requests, timeout=60)
    groups = gateway_pids(stack)
    pids = [p for g in groups for p in g]
    cpu0 = cpu_s(pids)
    time.sleep(5)
    cpu = (cpu_s(pids) - cpu0) / 5 * 100
    print(
        f"  {streams.streaming} streams held: calls in flight (sum of llmgate_admission_in_flight"
        f'{{kind="requests"}}) {in_flight(stack):.0f}; gateway CPU {cpu:.1f} % of one core; '
        f"RSS per instance (master + worker) {[round(rss_mib(g)) for g in groups]} MiB"
    )
    for conn in streams.conns:
        conn.sock.close()


def main() -> None:
    threading.stack_size(512 * 1024)
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-cluster-"))
    options = StackOptions(run_dir=run_dir, instances=3, memcached_nodes=2, workers=1)
    with Stack(options) as stack:
        groups = gateway_pids(stack)
        print(f"idle RSS per instance: {[round(rss_mib(g)) for g in groups]} MiB")
        for tokens, stream in ((100, False), (100, True), (500, False)):
            items, mib = memcached_per_1000(stack, tokens, stream)
            kind = "stream" if stream else "completion"
            print(f"memcached: {items:.0f} {kind} answers of {tokens} tokens: {mib:.2f} MiB/1000")
        rate, cpu_ms = throughput(stack)
        print(f"non-stream calls, 32 concurrent, 3 x 1 worker: {rate:.0f}/s, {cpu_ms:.2f} ms CPU")
        idle_cpu0 = cpu_s([p for g in gateway_pids(stack) for p in g])
        time.sleep(3)
        idle = (cpu_s([p for g in gateway_pids(stack) for p in g]) - idle_cpu0) / 3 * 100
        print(f"idle: calls in flight {in_flight(stack):.0f}, gateway CPU {idle:.1f} %")
        for count in (300, 900):
            held_streams(stack, count)
            time.sleep(2)


if __name__ == "__main__":
    main()
