"""Memory against open streams: the resident memory of the gateway's processes per held stream,
beside the shape's floor's.

`make run`'s shape (2 gevent workers behind one nginx, cache off) holds slow streams (the
simulator sends one token every 5 s) opened in steps by one selector thread
(tests/support/calls.py ``ManyStreams``), each read to its first event and then left open.
At each step: the VmRSS of gunicorn's workers and of nginx (master and workers), against
the same after a warm-up with no stream open. Per stream: (RSS now - idle RSS) / streams
open; the slope between the first and the last step is the marginal cost, without what
the first streams paid once (greenlet pools, buffers that stay allocated). The same is
measured with the floor's app (bench/floor/app.py) in the gateway's place, and issue 25's
target is the difference: the gateway's workers hold at most 10 KB per stream more than the
floor's, both measured in the same run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.floor import FLOOR_APP
from bench.kit import loadgen, plots, proctree
from bench.kit.report import Cell, Check, Config, Plot, Section
from bench.load.overhead_paths import sizing
from runner.stack import Stack, StackOptions
from tests.support.calls import ManyStreams, chat_body, raw_chat_request

SLOW = {"x-sim-tps": "0.2", "x-sim-ttft-ms": "0"}
# A last step opens streams asked with a prompt of this size: what a held stream costs when
# the prompt is a real one (the gateway needs it only until the upstream has the request).
PROMPT_BYTES = 20 * 1024
# Issue 25: the gateway's workers at most this many KB per held stream above the floor's.
KB_OVER_FLOOR = 10
# One reading: streams asked, streaming, failed, workers' RSS KB, nginx's RSS KB.
Point = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class Held:
    """One app's memory against held streams, as one run read it (KB)."""

    idle_workers: int
    idle_nginx: int
    points: list[Point]
    with_prompt: float  # the workers' growth per stream asked with a PROMPT_BYTES prompt
    workers: int  # gunicorn's
    sizing: dict[str, int]

    @property
    def per_stream(self) -> float:
        """The workers' (RSS - idle) / streams open, at the last step."""
        last = self.points[-1]
        return (last[3] - self.idle_workers) / max(1, last[1])

    def marginal(self, column: int) -> float:
        """KB per stream between the first and the last step (3: workers, 4: nginx)."""
        first, last = self.points[0], self.points[-1]
        return (last[column] - first[column]) / max(1, last[1] - first[1])


def steps(smoke: bool) -> list[int]:
    return [10, 20] if smoke else [250, 500, 1000, 1500]


def measure(cfg: Config, *, wsgi_app: str = "") -> Held:
    """The gateway's readings; with ``wsgi_app`` those of another app in its place (the
    floor)."""
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
        name = "floor" if wsgi_app else "gateway"
        cfg.progress(f"memory, {name}: starting simulator, gunicorn (2 workers), nginx")
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
            cfg.progress(f"memory, {name}: opening streams up to {target}")
            hold([f"{run_id} {i}" for i in range(opened, target)])
            opened = target
            workers, nginx_kb = reading()
            streaming = sum(m.streaming for m in held)
            failed = sum(len(m.failures) for m in held)
            points.append((target, streaming, failed, workers, nginx_kb))
        count = 10 if cfg.smoke else 250
        kib = PROMPT_BYTES // 1024
        cfg.progress(f"memory, {name}: {count} more streams, each with a {kib} KiB prompt")
        before, _ = reading()
        prompted = hold([f"{run_id} p{i} " + "p" * PROMPT_BYTES for i in range(count)])
        after, _ = reading()
        with_prompt = (after - before) / max(1, prompted.streaming)
        return Held(idle_workers, idle_nginx, points, with_prompt, options.workers, sizing(stack))
    finally:
        for streams in held:
            streams.close_all()
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def run(cfg: Config) -> Section:
    """The section: the gateway's readings, then the floor's."""
    return section(cfg, measure(cfg), measure(cfg, wsgi_app=FLOOR_APP))


def rows(name: str, held: Held) -> list[list[Cell]]:
    out: list[list[Cell]] = []
    for target, streaming, failed, workers, nginx_kb in held.points:
        n = max(1, streaming)
        out.append(
            [
                name,
                target,
                streaming,
                failed,
                workers / 1024,
                (workers - held.idle_workers) / n,
                nginx_kb / 1024,
                (nginx_kb - held.idle_nginx) / n,
            ]
        )
    return out


def checks(gateway: Held, floor: Held) -> list[Check]:
    """Issue 25's: the gateway's workers' KB per held stream less the floor's."""
    streams = gateway.points[-1][1]
    return [
        Check(
            f"worker memory per open stream over the floor's ({streams} streams)",
            "<=",
            KB_OVER_FLOOR,
            gateway.per_stream - floor.per_stream,
            "KB over the floor",
        )
    ]


def draw(cfg: Config, sides: dict[str, Held]) -> Plot:
    fig, ax = plots.figure(7, 4)
    for name, held in sides.items():
        xs = [0.0] + [float(p[1]) for p in held.points]
        for label, column, idle in (
            ("workers", 3, held.idle_workers),
            ("nginx", 4, held.idle_nginx),
        ):
            ys = [idle / 1024] + [p[column] / 1024 for p in held.points]
            style = "-o" if label == "workers" else "--o"
            ax.plot(xs, ys, style, label=f"{name} {label}", color=plots.color(name))
    ax.set_xlabel("open streams")
    ax.set_ylabel("RSS, MiB")
    ax.set_title("Resident memory against open streams", fontsize=10)
    ax.legend(fontsize=8)
    return Plot(
        plots.save(fig, cfg.out_dir / "memory.png"),
        "Resident memory of gunicorn's workers and nginx against open streams, the gateway "
        "and the floor",
    )


def _data(held: Held) -> dict:
    keys = ("asked", "streaming", "failed", "workers_kb", "nginx_kb")
    return {
        "idle_rss_kb": {"gunicorn_workers": held.idle_workers, "nginx": held.idle_nginx},
        "points": [dict(zip(keys, p, strict=True)) for p in held.points],
        "workers_kb_per_stream": held.per_stream,
        "marginal_kb_per_stream": {"gunicorn_workers": held.marginal(3), "nginx": held.marginal(4)},
        "workers_kb_per_stream_with_prompt": {str(PROMPT_BYTES): held.with_prompt},
    }


def section(cfg: Config, gateway: Held, floor: Held) -> Section:
    sides = {"gateway": gateway, "floor": floor}
    first, last = gateway.points[0][1], gateway.points[-1][1]
    notes = [
        f"{name}: idle (after a warm-up, no stream open) workers "
        f"{held.idle_workers / 1024:.1f} MiB, nginx {held.idle_nginx / 1024:.1f} MiB; workers "
        f"{held.per_stream:.1f} KB per stream at {held.points[-1][1]} streams; marginal, "
        f"between {held.points[0][1]} and {held.points[-1][1]}: workers "
        f"{held.marginal(3):.1f} KB, nginx {held.marginal(4):.1f} KB per stream; streams asked "
        f"with a {PROMPT_BYTES // 1024} KiB prompt, opened last: workers "
        f"{held.with_prompt:.1f} KB per stream."
        for name, held in sides.items()
    ]
    return Section(
        key="memory",
        title="Memory against open streams, the gateway and the floor",
        columns=[
            "path",
            "streams asked",
            "streaming",
            "failed",
            "workers RSS MiB",
            "workers KB/stream",
            "nginx RSS MiB",
            "nginx KB/stream",
        ],
        rows=rows("gateway", gateway) + rows("floor", floor),
        data={
            **{name: _data(held) for name, held in sides.items()},
            "settings": {
                "gunicorn_workers": gateway.workers,
                "sizing": gateway.sizing,
                "simulator": SLOW,
            },
        },
        checks=checks(gateway, floor),
        plots=[draw(cfg, sides)],
        notes=[
            "KB/stream: (RSS - idle) / streams open. floor: the same stack serving "
            "bench/floor/app.py in the gateway's place (the overhead section's floor), which "
            "relays each stream and keeps nothing: what nginx, gunicorn, Flask and urllib3 "
            "hold per stream. The target is the difference, both measured in this run: the "
            f"gateway's workers at most {KB_OVER_FLOOR} KB per stream above the floor's "
            f"(at {last} streams; the first step is {first}).",
            *notes,
            f"A kept prompt would add about {PROMPT_BYTES / 1024:.0f} KB per stream to the "
            "prompted figure over the marginal one.",
            "RSS counts shared pages in each process; gunicorn's master is left out (it "
            "holds no stream).",
        ],
        fmt=".1f",
    )
