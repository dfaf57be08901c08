"""The cost of tracing (`python -m bench.tracing`): the same calls through a gateway with
LLMGATE_OTEL_ENDPOINT unset (off), one exporting every span over OTLP/HTTP to a receiver on
loopback (on), and one sampling 1 trace in 10 (OTEL_TRACES_SAMPLER=parentbased_traceidratio,
argument 0.1).

Three stacks side by side (2 gevent workers each, no Memcached, the simulator answering at
once); the rounds alternate between them so drift on a shared machine hits all alike.
Per call: CPU of the gateway's process tree (gunicorn's master and workers, from /proc:
nginx is the same in both and left out; the receiver runs in this process, also left out)
and wall time at a fixed concurrency. Three kinds of call: a non-stream chat completion
(request span + attempt span), a 50-event stream (+ the stream span), and a cacheable call
answered from the L1 cache (request + lookup + stream spans, no upstream).
Numbers, not asserts: run on a quiet machine.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import urllib3

from bench.kit import proctree
from runner.stack import Stack, StackOptions
from tests.support.otlp import OtlpReceiver

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
PLAIN = {"model": "sim-model", "messages": [{"role": "user", "content": "bench"}], "max_tokens": 16}
STREAM = {**PLAIN, "stream": True, "max_tokens": 50}


def run_many(fn: Callable[[], float], count: int, concurrency: int) -> tuple[list[float], float]:
    """``count`` calls of ``fn`` by ``concurrency`` threads: what each returned, and the wall
    time they took together."""
    started = time.perf_counter()
    if concurrency == 1:
        samples = [fn() for _ in range(count)]
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            samples = list(pool.map(lambda _: fn(), range(count)))
    return samples, time.perf_counter() - started


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (gunicorn's workers)."""
    return proctree.cpu_s(proctree.tree(pid))


class Target:
    def __init__(self, name: str, stack: Stack, concurrency: int) -> None:
        self.name = name
        self.stack = stack
        self.http = urllib3.PoolManager(maxsize=concurrency, retries=False)
        self.pid = stack.proc("gunicorn").popen.pid
        self.cpu_s: dict[str, float] = {}
        self.wall_s: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def call(self, body: dict) -> float:
        resp = self.http.request(
            "POST",
            self.stack.url + "/v1/chat/completions",
            body=json.dumps(body).encode(),
            headers=HEADERS,
            preload_content=False,
        )
        while resp.read1(65536):
            pass
        resp.release_conn()
        if resp.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {resp.status}")
        return 0.0

    def measure(self, kind: str, fn: Callable[[], float], count: int, concurrency: int) -> None:
        cpu0 = tree_cpu_s(self.pid)
        _, wall = run_many(fn, count, concurrency)
        self.cpu_s[kind] = self.cpu_s.get(kind, 0.0) + tree_cpu_s(self.pid) - cpu0
        self.wall_s[kind] = self.wall_s.get(kind, 0.0) + wall
        self.calls[kind] = self.calls.get(kind, 0) + count


def main(requests: int = 2000, concurrency: int = 16, rounds: int = 4) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-"))
    sink = OtlpReceiver(keep=False).__enter__()
    stacks: list[Stack] = []
    try:
        sampled = {
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        }
        setups = {
            "off": {},
            "on": {"LLMGATE_OTEL_ENDPOINT": sink.url},
            "sampled": {"LLMGATE_OTEL_ENDPOINT": sink.url, **sampled},  # 1 trace in 10
        }
        for name, env in setups.items():
            stacks.append(
                Stack(
                    StackOptions(
                        run_dir=run_dir / name,
                        memcached=False,
                        workers=2,
                        env={**env, "LLMGATE_HEARTBEAT_S": "0"},
                        simulator_args=["--ttft-ms", "0", "--tps", "5000"],
                    )
                ).start()
            )
        targets = [Target(name, s, concurrency) for name, s in zip(setups, stacks, strict=True)]
        prompt = [{"role": "user", "content": f"bench {uuid.uuid4().hex}"}]
        cached = {**PLAIN, "temperature": 0, "stream": True, "messages": prompt}
        kinds: dict[str, Callable[[Target], Callable[[], float]]] = {
            "non-stream": lambda t: lambda: t.call(PLAIN),
            "stream (50 events)": lambda t: lambda: t.call(STREAM),
            "cache hit (stream)": lambda t: lambda: t.call(cached),
        }
        for target in targets:  # warm pools, imports, the L1 entry
            run_many(functools.partial(target.call, PLAIN), 100, 4)
            run_many(functools.partial(target.call, cached), 20, 1)
        per_round = max(1, requests // rounds)
        time.sleep(6)  # the warm-up's spans leave within the processor's 5 s schedule
        spans_before = sink.span_count
        for _ in range(rounds):
            for kind, make in kinds.items():
                for target in targets:
                    target.measure(kind, make(target), per_round, concurrency)
        time.sleep(6)  # the last batch leaves within the processor's 5 s schedule
        exported = sink.span_count - spans_before
        calls = sum(targets[1].calls.values()) + sum(targets[2].calls.values())
        print(
            f"\ntracing cost: {per_round * rounds} calls of each kind per gateway, "
            f"concurrency {concurrency}, 2 workers, {rounds} alternating rounds"
        )
        print(f"{'call':<20} {'tracing':<9} {'CPU ms/call':>11} {'+ms':>6} {'req/s':>6} {'-%':>5}")
        off = targets[0]
        for kind in kinds:
            cpu_off = off.cpu_s[kind] / off.calls[kind] * 1000
            rps_off = off.calls[kind] / off.wall_s[kind]
            for target in targets:
                cpu = target.cpu_s[kind] / target.calls[kind] * 1000
                rps = target.calls[kind] / target.wall_s[kind]
                print(
                    f"{kind:<20} {target.name:<9} {cpu:11.3f} {cpu - cpu_off:6.3f} {rps:6.0f} "
                    f"{(1 - rps / rps_off) * 100:5.1f}"
                )
        print(
            f"(CPU: gunicorn's master and workers from /proc; spans the OTLP sink received: "
            f"{exported} for {calls} traced calls, {exported / calls:.2f} per call)"
        )
    finally:
        for stack in stacks:
            stack.stop()
        sink.__exit__(None, None, None)
        shutil.rmtree(run_dir, ignore_errors=True)
