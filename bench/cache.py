"""Cache hits against the upstream: latency and throughput through nginx → gunicorn.

Rows: the simulator direct (a realistic answer: 300 ms to the first token, 100 tokens/s),
the gateway passing the call through (BYPASS), a gateway hit served by the worker's L1, and
one served by Memcached (L2, with the L1 disabled). Ratios are against direct.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import urllib3

from bench.relay import percentile, run_many
from runner.stack import Stack, StackOptions

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
SIM = ["--ttft-ms", "300", "--tps", "100"]


def _call(http: urllib3.PoolManager, url: str, payload: bytes) -> tuple[float, str]:
    started = time.perf_counter()
    resp = http.request("POST", url + "/v1/chat/completions", body=payload, headers=HEADERS)
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.data[:200]!r}")
    return time.perf_counter() - started, resp.headers.get("X-LLMGate-Cache", "")


def main(requests: int = 400, concurrency: int = 16) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-"))
    http = urllib3.PoolManager(maxsize=concurrency, retries=False)
    common = {
        "model": "sim-model",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": f"bench {uuid.uuid4().hex}"}],
    }
    cached = json.dumps({**common, "temperature": 0}).encode()
    bypass = json.dumps({**common, "temperature": 0.9}).encode()
    rows = []
    try:
        with Stack(StackOptions(run_dir=run_dir / "a", simulator_args=SIM)) as stack:
            direct, _ = run_many(lambda: _call(http, stack.sim_url, bypass)[0], 20, 1)
            passed, _ = run_many(lambda: _call(http, stack.url, bypass)[0], 20, 1)
            _call(http, stack.url, cached)  # MISS: stores the answer
            hits, _ = run_many(lambda: _call(http, stack.url, cached)[0], requests, 1)
            _, wall = run_many(lambda: _call(http, stack.url, cached)[0], requests, concurrency)
            rows += [
                ("direct (simulator)", direct, None),
                ("gateway BYPASS", passed, None),
                ("gateway HIT l1", hits, requests / wall),
            ]
        # The L1 refuses values above 1/8 of its size: at 1 KiB every answer goes to L2.
        l2_only = {"LLMGATE_CACHE_L1_BYTES": "1024"}
        with Stack(StackOptions(run_dir=run_dir / "b", simulator_args=SIM, env=l2_only)) as stack:
            _call(http, stack.url, cached)
            hits, _ = run_many(lambda: _call(http, stack.url, cached)[0], requests, 1)
            _, wall = run_many(lambda: _call(http, stack.url, cached)[0], requests, concurrency)
            level = _call(http, stack.url, cached)[1]
            rows.append((f"gateway HIT {level.split('=')[-1]}", hits, requests / wall))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    base = percentile(rows[0][1], 0.5)
    print(
        f"\ncache benchmark: 50-token answer, simulator TTFT 300 ms at 100 tok/s; "
        f"{requests} hits sequential, then {requests} at concurrency {concurrency}"
    )
    print(f"{'path':<20} {'p50 ms':>8} {'p99 ms':>8} {'p50 x direct':>13} {'hits/s':>8}")
    for name, samples, rps in rows:
        p50 = percentile(samples, 0.5)
        print(
            f"{name:<20} {p50 * 1e3:8.2f} {percentile(samples, 0.99) * 1e3:8.2f} "
            f"{p50 / base:13.4f} {rps or float('nan'):8.0f}"
        )
