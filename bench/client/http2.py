"""HTTP/1.1 against HTTP/2 at nginx: 100 concurrent streams from one client.

One stack in `make run`'s shape (runner/stack.py: the simulator, 2 gevent workers, nginx
with its HTTPS listener, which speaks HTTP/2 and HTTP/1.1 (ALPN), and the self-signed
certificate of the run directory, runner/tls.py), cache off. The simulator sends overhead's
stream: 200 ms to the first token, then 50 tokens at 100 tokens/s, one SSE event each.

The client is this process: one asyncio loop, one library for both protocols (httpx2 with
h2), trusting exactly the run's certificate. A round is one protocol: a new client starts
100 streams at once (HTTP/1.1: up to 100 connections; HTTP/2: one connection, 100 streams
multiplexed on it), then, when all have ended, 100 more on the connections it kept. One
warm-up round of each protocol is not counted; the measured rounds alternate which protocol
goes first (bench/client/http2_table.py ``order``), so the machine's noise falls on both.

Per stream, as the client read it: the time to its first `data:` line, to its end, the events,
whether it ended with [DONE], and which TCP connection carried it (the client's local port).
Per wave: the connections the client's transport opened (httpcore2's connect_tcp trace), the
client's CPU (time.process_time), and the CPU of nginx's and gunicorn's trees (/proc).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx2

from bench.client import http2_table as table
from bench.client.http2_table import H1, H2, KEPT, NEW, Stream, Wave
from bench.kit import machine, proctree
from bench.kit.report import Config, Section
from bench.load.overhead import kinds
from bench.load.overhead_paths import sizing
from runner.stack import Stack, StackOptions

PATH = "/v1/chat/completions"
STREAMS = 100
ROUNDS = 4  # measured rounds of each protocol, after one warm-up round each


class Client:
    """One protocol's client against the stack's HTTPS port, and the pids whose CPU counts."""

    def __init__(self, stack: Stack, streams: int, kind_headers: dict[str, str], tokens: int):
        self.url = stack.tls_url + PATH
        self.cert = stack.tls_cert
        self.streams = streams
        self.headers = kind_headers
        self.body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "bench http2"}],
            "max_tokens": tokens,
            "stream": True,
        }
        self.nginx = proctree.tree(stack.proc("nginx").popen.pid)
        self.gunicorn = proctree.tree(stack.proc("gunicorn").popen.pid)
        sim = proctree.tree(stack.proc("simulator").popen.pid)
        self.ours = [os.getpid(), *self.nginx, *self.gunicorn, *sim]

    def new(self, protocol: str) -> httpx2.AsyncClient:
        # A context of its own per client: the transport sets its ALPN protocols on it.
        context = ssl.create_default_context(cafile=self.cert)
        limits = httpx2.Limits(max_connections=self.streams, max_keepalive_connections=self.streams)
        return httpx2.AsyncClient(
            http2=protocol == H2, verify=context, limits=limits, timeout=httpx2.Timeout(60.0)
        )

    async def round(self, protocol: str) -> list[Wave]:
        async with self.new(protocol) as client:
            return [await self.wave(client, protocol, kind) for kind in (NEW, KEPT)]

    async def wave(self, client: httpx2.AsyncClient, protocol: str, kind: str) -> Wave:
        opened = 0

        async def trace(name: str, info: dict[str, Any]) -> None:
            nonlocal opened
            opened += name == "connection.connect_tcp.complete"

        others = machine.Others(self.ours)
        nginx0, gunicorn0 = proctree.cpu_s(self.nginx), proctree.cpu_s(self.gunicorn)
        cpu0, began = time.process_time(), time.perf_counter()
        streams = await asyncio.gather(
            *(self.stream(client, protocol, trace) for _ in range(self.streams))
        )
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu0
        return Wave(
            protocol,
            kind,
            tuple(streams),
            wall,
            cpu,
            opened,
            proctree.cpu_s(self.nginx) - nginx0,
            proctree.cpu_s(self.gunicorn) - gunicorn0,
            others.share(),
        )

    async def stream(self, client: httpx2.AsyncClient, protocol: str, trace: Any) -> Stream:
        started = time.perf_counter()
        first: float | None = None
        events, done, port, error = 0, False, 0, ""
        try:
            async with client.stream(
                "POST", self.url, json=self.body, headers=self.headers, extensions={"trace": trace}
            ) as resp:
                network = resp.extensions.get("network_stream")
                address = network.get_extra_info("client_addr") if network else None
                port = address[1] if address else 0
                if resp.status_code != 200:
                    await resp.aread()
                    return Stream(None, None, 0, False, port, f"HTTP {resp.status_code}")
                if resp.http_version != protocol:  # an HTTP/2 client that fell back
                    error = f"{resp.http_version} not {protocol}"
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        first = first or time.perf_counter()
                        done = line[5:].strip() == "[DONE]"
                        events += not done
        except httpx2.HTTPError as exc:
            return Stream(None, None, events, False, port, type(exc).__name__)
        ended = time.perf_counter() - started
        error = error or ("" if done else "cut")
        return Stream(first - started if first else None, ended, events, done, port, error)


async def measure(cfg: Config, client: Client, rounds: int) -> list[Wave]:
    for protocol in (H1, H2):
        cfg.progress(f"http2: warm-up, {protocol}, {client.streams} streams")
        await client.round(protocol)
    waves: list[Wave] = []
    plan = table.order(rounds)
    for i, protocol in enumerate(plan, 1):
        cfg.progress(f"http2: round {i} of {len(plan)}, {protocol}, {client.streams} streams x 2")
        waves += await client.round(protocol)
    return waves


def run(cfg: Config) -> Section:
    stream = next(k for k in kinds(cfg.smoke) if k.stream)
    streams, rounds = (5, 1) if cfg.smoke else (STREAMS, ROUNDS)
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-http2-"))
    options = StackOptions(
        run_dir=run_dir,
        memcached=False,
        workers=2,
        tls_port=0,
        env={"LLMGATE_CACHE_MODE": "off"},
    )
    stack = Stack(options)
    try:
        cfg.progress("http2: starting simulator, gunicorn (2 workers), nginx with HTTPS")
        stack.start()
        client = Client(stack, streams, stream.headers, stream.max_tokens)
        waves = asyncio.run(measure(cfg, client, rounds))
        settings = {
            "streams": streams,
            "rounds_per_protocol": rounds,
            "warm_up_rounds": 1,
            "gunicorn_workers": options.workers,
            "sizing": sizing(stack),
            "LLMGATE_CACHE_MODE": "off",
            "simulator": stream.headers,
            "max_tokens": stream.max_tokens,
            "client": f"httpx2 {version('httpx2')}, h2 {version('h2')}, one asyncio loop",
        }
    finally:
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return table.section(waves, settings)
