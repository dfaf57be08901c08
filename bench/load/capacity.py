"""Capacity: 1,000 / 5,000 / 10,000 streams held at once through `make run`, heartbeats on.

Each level gets a fresh stack built exactly as `make run` builds it (``runner.__main__
.options_from_env``: memcached, the simulator, 2 gevent workers, nginx sized by
runner/sizing.py) with ``LLMGATE_HEARTBEAT_S`` short, in its own run directory on free ports.
One thread (tests/support/held.py ``HeldStreams``, raw sockets and a selector) opens the
streams; each asks the simulator for its first token at one common moment (``x-sim-ttft-ms``
counted down to it), so every stream is held, silent but for the gateway's pings, until all
of them are open and a few heartbeats more; then each gets 3 tokens and ``[DONE]``.

Per level: streams established (a 200 head), held at once, errors (connect: refused or reset
before a head; status: not 200; cut: closed before ``[DONE]``; timeout: still open at the
end), heartbeats on time (every gap between two reads of a held stream within 1.5
heartbeats), RSS per held stream of gunicorn's workers and of nginx (at the moment all were
held, against the same stack idle), the gateway's CPU per stream opened and while holding
them, and the load generator's own CPU.
"""

from __future__ import annotations

import dataclasses
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.kit import proctree
from bench.kit.report import Check, Config, Section
from runner.__main__ import options_from_env, parse_args
from runner.stack import Stack, StackOptions
from tests.support.calls import raw_chat_request
from tests.support.held import HOLD_BODY, HeldStreams, raise_fd_limit

LEVELS = (1000, 5000, 10_000)
HEARTBEAT_S = 5.0
# A gap between two reads of a held stream counts as on time up to this many heartbeats:
# the gateway pings after one heartbeat of silence, plus its own and nginx's scheduling.
TOLERANCE = 1.5


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_REAL_UPSTREAM = ("LLMGATE_UPSTREAM_URL", "LLMGATE_UPSTREAM_API_KEY", "LLMGATE_CONFIG")


def stack_options(run_dir: Path, heartbeat_s: float) -> StackOptions:
    """make run's shape and the caller's sizing settings, but always the simulator (never a
    real upstream named in the environment: this holds thousands of streams) and free ports
    only (no HTTPS listener on make run's fixed 8443)."""
    base = options_from_env(parse_args([]))
    env = {k: v for k, v in base.env.items() if k not in _REAL_UPSTREAM}
    return dataclasses.replace(
        base,
        run_dir=run_dir,
        port=0,
        app_bind="",
        upstream_url="",
        tls_port=None,
        logs_to_stdout=False,
        env={**env, "LLMGATE_HEARTBEAT_S": str(heartbeat_s)},
    )


def hold(n: int, heartbeat_s: float, progress: Any = print) -> dict[str, Any]:
    """Hold ``n`` streams through a fresh `make run` stack; the level's numbers."""
    raise_fd_limit(n + 1024)
    run_dir = Path(tempfile.mkdtemp(prefix=f"llmgate-bench-capacity-{n}-"))
    stack = Stack(stack_options(run_dir, heartbeat_s))
    try:
        progress(f"capacity: {n} streams: starting make run's stack")
        stack.start()
        assert stack.sizing is not None
        host, port = stack.url.removeprefix("http://").split(":")
        workers = proctree.children(stack.proc("gunicorn").popen.pid)
        nginx = proctree.tree(stack.proc("nginx").popen.pid)
        gateway = proctree.tree(stack.proc("gunicorn").popen.pid) + nginx
        time.sleep(1)
        idle = proctree.rss_kb(workers), proctree.rss_kb(nginx)
        # Room for the opening (about 4 ms a stream on a busy 2-core machine; a few hundred
        # streams, the smoke run's, open in well under 2 s), then three heartbeats with every
        # stream held.
        began = time.monotonic()
        release = began + (10 if n >= 1000 else 2) + n * 0.006 + 3 * heartbeat_s
        streams = HeldStreams(host, int(port), batch=3000)
        streams.add(
            [
                raw_chat_request(
                    host,
                    HOLD_BODY,
                    {"x-sim-ttft-ms": str(int((release - began) * 1000)), "Connection": "close"},
                )
                for _ in range(n)
            ]
        )
        cpu0, gen0 = proctree.cpu_s(gateway), _self_cpu_s()
        progress(f"capacity: {n} streams: opening (first tokens in {release - began:.0f} s)")
        streams.run(lambda: bool(streams.all_held_at) or not streams.pending, release)
        opened_s = time.monotonic() - began
        cpu1, held_at = proctree.cpu_s(gateway), time.monotonic()
        rss = proctree.rss_kb(workers), proctree.rss_kb(nginx)
        per_worker = [_connections(pid) for pid in workers]
        progress(f"capacity: {n} streams: {streams.peak_held} held after {opened_s:.0f} s")
        streams.run(lambda: not streams.pending, release)
        cpu2, held_for = proctree.cpu_s(gateway), time.monotonic() - held_at
        streams.run(lambda: not streams.pending, time.monotonic() + 60 + n * 0.01)
        streams.finish("still open 60 s after the first tokens")
        gen_cpu = _self_cpu_s() - gen0
        cpu_total = proctree.cpu_s(gateway) - cpu0
    finally:
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return _numbers(
        streams,
        n=n,
        heartbeat_s=heartbeat_s,
        opened_s=opened_s,
        rss_kb=(rss[0] - idle[0], rss[1] - idle[1]),
        cpu_open_s=cpu1 - cpu0,
        cpu_held=(cpu2 - cpu1) / held_for if held_for > 0.5 else float("nan"),
        cpu_total_s=cpu_total,
        gen_cpu_s=gen_cpu,
        per_worker=per_worker,
        capacity=stack.sizing.stream_capacity,
    )


def _connections(pid: int) -> int:
    """Open descriptors of one process (a worker's callers and upstream connections)."""
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return 0


def _numbers(streams: HeldStreams, **level: Any) -> dict[str, Any]:
    n, heartbeat_s = level["n"], level["heartbeat_s"]
    errors: dict[str, int] = {}
    for s in streams.streams:
        if s.error:
            kind = s.error.split(":", 1)[0]
            errors[kind] = errors.get(kind, 0) + 1
    established = [s for s in streams.streams if s.status == 200]
    gaps = sorted(s.max_gap for s in established)
    # Held long enough to owe a ping: the hold outlasted two heartbeats.
    owed = [s for s in established if (s.first_data_at or s.ended_at) - s.head_at > 2 * heartbeat_s]
    late = [s for s in established if s.max_gap > TOLERANCE * heartbeat_s]
    pingless = [s for s in owed if s.pings == 0]
    held = max(1, streams.peak_held)
    return {
        **{k: v for k, v in level.items() if k not in ("rss_kb",)},
        "established": len(established),
        "held_at_once": streams.peak_held,
        "errors": errors,
        "error_count": sum(errors.values()),
        "heartbeats_on_time": len(established) - len(late) - len(pingless),
        "late": len(late),
        "pingless": len(pingless),
        "gap_p50_s": gaps[len(gaps) // 2] if gaps else float("nan"),
        "gap_p99_s": gaps[int(0.99 * (len(gaps) - 1))] if gaps else float("nan"),
        "gap_max_s": gaps[-1] if gaps else float("nan"),
        "rss_workers_kb_per_stream": level["rss_kb"][0] / held,
        "rss_nginx_kb_per_stream": level["rss_kb"][1] / held,
        "cpu_ms_per_stream_opened": 1000 * level["cpu_open_s"] / max(1, n),
        "examples": sorted({s.error for s in streams.streams if s.error})[:5],
    }


COLUMNS = [
    "streams",
    "established",
    "held at once",
    "errors",
    "heartbeats on time",
    "longest gap p99 (s)",
    "opened in (s)",
    "gunicorn workers KB/stream",
    "nginx KB/stream",
    "gateway CPU ms/stream opened",
    "gateway CPU held (cores)",
    "load generator CPU (s)",
]


def row(level: dict[str, Any]) -> list[Any]:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(level["errors"].items())) or "0"
    return [
        level["n"],
        level["established"],
        level["held_at_once"],
        errors,
        f"{level['heartbeats_on_time']} of {level['established']}",
        level["gap_p99_s"],
        level["opened_s"],
        level["rss_workers_kb_per_stream"],
        level["rss_nginx_kb_per_stream"],
        level["cpu_ms_per_stream_opened"],
        level["cpu_held"],
        level["gen_cpu_s"],
    ]


def run(cfg: Config) -> Section:
    levels = (200,) if cfg.smoke else LEVELS
    heartbeat = 1.0 if cfg.smoke else HEARTBEAT_S
    results = [hold(n, heartbeat, cfg.progress) for n in levels]
    top = results[-1]
    clean = top["error_count"] == 0 and top["heartbeats_on_time"] == top["n"]
    return Section(
        key="capacity",
        title="Open streams held through `make run`",
        columns=COLUMNS,
        rows=[row(r) for r in results],
        data={"levels": results, "heartbeat_s": heartbeat, "tolerance": TOLERANCE},
        checks=[
            Check(
                "open streams held through `make run`, zero errors, heartbeats on time",
                ">=",
                10_000,
                float(top["held_at_once"] if clean else 0),
                "streams",
            )
        ],
        notes=[
            f"A fresh `make run` stack per level (runner.__main__.options_from_env, "
            f"LLMGATE_HEARTBEAT_S={heartbeat:g}); every stream is held silent but for pings "
            "until all are open and 3 heartbeats more, then gets 3 tokens and [DONE].",
            f"Heartbeats on time: every gap between two reads of a held stream at most "
            f"{TOLERANCE:g} heartbeats, and a ping in every hold longer than two.",
            "KB/stream: VmRSS when all were held minus the same stack idle, over the streams "
            "held; gunicorn's workers (not the master) and nginx (master and workers).",
            "Gateway CPU: nginx and gunicorn trees from /proc; held = cores used while "
            "every stream was open (pings only).",
        ],
        fmt=".1f",
    )


def main(levels: tuple[int, ...] = LEVELS, heartbeat_s: float = HEARTBEAT_S) -> list[list[Any]]:
    """Print the table (`python -m bench.load.capacity [N ...]`); returns its rows."""
    rows = [row(hold(n, heartbeat_s)) for n in levels]
    print(" | ".join(COLUMNS))
    for r in rows:
        print(" | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in r))
    return rows


if __name__ == "__main__":
    import sys

    main(tuple(int(a) for a in sys.argv[1:]) or LEVELS)
