"""Memory against open streams: the resident memory of the gateway's processes per held stream.

`make run`'s shape (2 gevent workers behind one nginx, cache off) holds slow streams (the
simulator sends one token every 5 s) opened in steps by one selector thread
(tests/support/calls.py ``ManyStreams``), each read to its first event and then left open.
At each step: the VmRSS of gunicorn's workers and of nginx (master and workers), against
the same after a warm-up with no stream open. Per stream: (RSS now - idle RSS) / streams
open; the slope between the first and the last step is the marginal cost, without what
the first streams paid once (greenlet pools, buffers that stay allocated).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

from bench import loadgen, plots, proctree
from bench.overhead_paths import sizing
from bench.report import Cell, Check, Config, Plot, Section
from runner.stack import Stack, StackOptions
from tests.support.calls import ManyStreams, chat_body, raw_chat_request

SLOW = {"x-sim-tps": "0.2", "x-sim-ttft-ms": "0"}
# A last step opens streams asked with a prompt of this size: what a held stream costs when
# the prompt is a real one (the gateway needs it only until the upstream has the request).
PROMPT_BYTES = 20 * 1024


def steps(smoke: bool) -> list[int]:
    return [10, 20] if smoke else [250, 500, 1000, 1500]


def run(cfg: Config, *, wsgi_app: str = "") -> Section:
    """The section; with ``wsgi_app`` the same measurement of another app in the gateway's
    place (bench/floor.py's floor)."""
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-memory-"))
    options = StackOptions(
        run_dir=run_dir,
        memcached=False,
        workers=2,
        env={"LLMGATE_CACHE_MODE": "off"},
        wsgi_app=wsgi_app,
    )
    held: list[ManyStreams] = []
    stack = Stack(options)
    try:
        cfg.progress("memory: starting simulator, gunicorn (2 workers), nginx")
        stack.start()
        host, port = stack.url.removeprefix("http://").split(":")
        gunicorn = stack.proc("gunicorn").popen.pid
        nginx = stack.proc("nginx").popen.pid
        # Warm-up: imports, pools and the first greenlets exist before the idle reading.
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "warm"}]}
        warm = loadgen.request_bytes(
            "/v1/chat/completions",
            {**body, "max_tokens": 5, "stream": True},
            {"x-sim-ttft-ms": "0", "x-sim-tps": "1000"},
        )
        loadgen.run(host, int(port), warm, 20, 40 if cfg.smoke else 200)
        time.sleep(1)

        def reading() -> tuple[int, int]:
            return proctree.rss_kb(proctree.children(gunicorn)), proctree.rss_kb(
                proctree.tree(nginx)
            )

        idle_workers, idle_nginx = reading()
        points = []
        run_id = uuid.uuid4().hex[:6]

        def hold(prompts: list[str]) -> ManyStreams:
            """Slow streams asked with these prompts, opened and held; then a second's rest."""
            streams = ManyStreams(host, int(port))
            bodies = [chat_body(p, 1000, stream=True, temperature=None) for p in prompts]
            streams.open([raw_chat_request(host, b, SLOW) for b in bodies], timeout=120)
            held.append(streams)
            time.sleep(1)
            return streams

        opened = 0
        for target in steps(cfg.smoke):
            cfg.progress(f"memory: opening streams up to {target}")
            hold([f"{run_id} {i}" for i in range(opened, target)])
            opened = target
            workers, nginx_kb = reading()
            streaming = sum(m.streaming for m in held)
            failed = sum(len(m.failures) for m in held)
            points.append((target, streaming, failed, workers, nginx_kb))
        count = 10 if cfg.smoke else 250
        cfg.progress(f"memory: {count} more streams, each with a {PROMPT_BYTES // 1024} KiB prompt")
        before, _ = reading()
        prompted = hold([f"{run_id} p{i} " + "p" * PROMPT_BYTES for i in range(count)])
        after, _ = reading()
        with_prompt = (after - before) / max(1, prompted.streaming)
        return section(cfg, stack, idle_workers, idle_nginx, points, with_prompt)
    finally:
        for streams in held:
            streams.close_all()
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def section(
    cfg: Config,
    stack: Stack,
    idle_workers: int,
    idle_nginx: int,
    points: list[tuple[int, int, int, int, int]],
    with_prompt: float,
) -> Section:
    rows: list[list[Cell]] = []
    for target, streaming, failed, workers, nginx_kb in points:
        n = max(1, streaming)
        rows.append(
            [
                target,
                streaming,
                failed,
                workers / 1024,
                (workers - idle_workers) / n,
                nginx_kb / 1024,
                (nginx_kb - idle_nginx) / n,
            ]
        )
    first, last = points[0], points[-1]
    span = max(1, last[1] - first[1])
    slope_workers = (last[3] - first[3]) / span
    slope_nginx = (last[4] - first[4]) / span
    per_stream = (last[3] - idle_workers) / max(1, last[1])
    fig, ax = plots.figure(7, 4)
    xs = [0.0] + [float(p[1]) for p in points]
    ax.plot(
        xs, [idle_workers / 1024] + [p[3] / 1024 for p in points], "-o", label="gunicorn workers"
    )
    ax.plot(xs, [idle_nginx / 1024] + [p[4] / 1024 for p in points], "-o", label="nginx")
    ax.set_xlabel("open streams")
    ax.set_ylabel("RSS, MiB")
    ax.set_title("Resident memory against open streams", fontsize=10)
    ax.legend(fontsize=8)
    plot = plots.save(fig, cfg.out_dir / "memory.png")
    return Section(
        key="memory",
        title="Memory against open streams",
        columns=[
            "streams asked",
            "streaming",
            "failed",
            "workers RSS MiB",
            "workers KB/stream",
            "nginx RSS MiB",
            "nginx KB/stream",
        ],
        rows=rows,
        data={
            "idle_rss_kb": {"gunicorn_workers": idle_workers, "nginx": idle_nginx},
            "points": [
                dict(
                    zip(("asked", "streaming", "failed", "workers_kb", "nginx_kb"), p, strict=True)
                )
                for p in points
            ],
            "marginal_kb_per_stream": {"gunicorn_workers": slope_workers, "nginx": slope_nginx},
            "workers_kb_per_stream_with_prompt": {str(PROMPT_BYTES): with_prompt},
            "settings": {
                "gunicorn_workers": stack.options.workers,
                "sizing": sizing(stack),
                "simulator": SLOW,
            },
        },
        checks=[
            Check(f"worker memory per open stream ({last[1]} streams)", "<=", 40, per_stream, "KB")
        ],
        plots=[Plot(plot, "Resident memory of gunicorn's workers and nginx against open streams")],
        notes=[
            f"Idle (after a warm-up, no stream open): workers {idle_workers / 1024:.1f} MiB, "
            f"nginx {idle_nginx / 1024:.1f} MiB. KB/stream: (RSS - idle) / streams open.",
            f"Marginal, between {first[1]} and {last[1]} streams: workers "
            f"{slope_workers:.1f} KB, nginx {slope_nginx:.1f} KB per stream.",
            f"Streams asked with a {PROMPT_BYTES // 1024} KiB prompt, opened last: workers "
            f"{with_prompt:.1f} KB per stream (a kept prompt would add about "
            f"{PROMPT_BYTES / 1024:.0f} KB to the marginal figure).",
            "RSS counts shared pages in each process; gunicorn's master is left out (it "
            "holds no stream).",
        ],
        fmt=".1f",
    )
