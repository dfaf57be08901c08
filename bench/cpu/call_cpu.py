"""What a call that goes upstream costs the app itself: `python -m bench.call_cpu [A B]
[--kind non-stream|stream] [--keys] [--callers N] [--floor]`.

bench/cpu/hit_cpu.py's way for a call the cache does not answer: the app (`create_app`, the
cache off, the simulator as the upstream, answering at once: no time to the first token, a
million tokens a second) called as a WSGI callable in this process with the environ gunicorn
would pass, by one greenlet after another or by ``--callers`` greenlets at once (a gevent-
patched process, as a worker is). Each round times ``calls`` calls by this process's CPU:
the app's work and its side of the sockets to the simulator (and to Memcached), not the
simulator's; the best round is the figure, every round listed. Lines of the request log are
off, as in the overhead section's features-off row. Every call must be answered 200 and
the simulator must count as many requests as calls were made, or the run stops: an error
answer costs less, and timing it would say nothing of a call.

``--keys`` is the features-on row's call: a keys file whose one key has per-key limits far
above the load (requests and tokens a minute, tokens a day, concurrent streams;
bench/cpu/ab.py's KEY_LIMITS), counted in a Memcached of the run's own, and each call's log line
written (to a file). ``--floor`` measures bench/floor/app.py the same way (it ignores the
key). What each feature adds, one at a time: ``--log`` writes the log line without a key,
``--keys --no-limits`` presents a key that has no limits (nothing counted), ``--traces``
exports every call's spans (LLMGATE_OTEL_ENDPOINT) to a receiver in another process
(bench/tracing/trace_latency.py ``Sink``, not counted).

With two revisions, each is exported as bench/cpu/ab.py exports it (this tree's bench/ in
place of its own) and measured in a process of its own, in turns; without, the working tree. The
whole call through gunicorn and nginx stays bench.ab's and bench.floor's.

``--tps N`` paces a stream's events (the simulator's x-sim-tps, N tokens a second; the
default, a million, sends them all at once): at a worker's pace (bench/load/overhead.py streams at
100) each event is a read of its own and goes through the relay alone, so the per-event work
the default's few large reads hide is in the figure. Each stream then lasts 50/N seconds:
give ``--callers`` enough for a round to end soon.

``--instructions N`` counts a call instead of timing it, as bench/cpu/hit_cpu.py
counts a hit: the process under valgrind's cachegrind with N calls more in one run than in
the other (the simulator and Memcached not counted), the difference over N. The system
calls' own work is not in it, and with ``--callers`` above 1 the greenlets' interleaving
under valgrind is not a worker's: a count of one caller's calls is the steady measure of a
cut a few microseconds big, where a timed round on a shared VM moves by 10-20 %. A stream is
counted only paced and by one caller (``--kind stream --tps N``, N at most ``COUNTED_TPS``):
then each event is a read of its own, under valgrind as in a worker, and counts of one tree
agree within about 1 % at 50 tokens a second on a busy machine, 5 % at 200 (bench/HISTORY.md,
"2026-12-08: a paced stream's per-event work, profiled and cut"); both runs warm up with
``PACED_WARM_UP`` streams, so their difference is the N streams alone. An unpaced stream's
count is refused (``STREAM_NOT_COUNTED`` says why); so is a paced one's by many callers.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.cpu.ab import KEY_LIMITS, export
from bench.cpu.hit_cpu import (
    BODY,
    NGINX_HEADERS,
    App,
    CollectorClock,
    call_once,
    counted_lines,
    in_turns,
    instructions_per_call,
)

KEY_SECRET = "sk-bench-call-cpu"
FAST_TPS = 1_000_000.0  # the simulator's pace by default: a stream's events all at once
WARM_UP = 500  # calls made before the rounds (fewer when a round is fewer)
STREAM_NOT_COUNTED = (
    "--instructions counts a stream only paced (--tps, at most 100) and by one caller: "
    "unpaced, a stream's count depends on how many events each read finds, and valgrind slows "
    "the reader, not the simulator (two counts of one tree differed by 8 %); time it instead"
)
COUNTED_TPS = 100.0  # the fastest pace counted: faster, valgrind's reader falls behind
PACED_WARM_UP = 10  # a counted stream's warm-up, the same in both runs: few, for each is slow


def measure(
    kind: str,
    calls: int,
    rounds: int,
    callers: int,
    *,
    keys: bool = False,
    floor: bool = False,
    log: bool = False,
    limits: bool = True,
    traces: bool = False,
    tps: float = FAST_TPS,
    warm_up: int = WARM_UP,
) -> dict[str, Any]:
    """This tree's calls: the best round's CPU per call, every round (after at most
    ``warm_up`` calls)."""
    from gevent import monkey

    monkey.patch_all()  # as gunicorn's gevent worker does before it loads the app
    from runner.procs import Proc, free_port

    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-call-cpu-"))
    procs = []
    sink = None
    try:
        port = free_port()
        argv = [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port)]
        procs.append(Proc("simulator", argv, log_path=run_dir / "simulator.log"))
        procs[-1].wait_http(f"http://127.0.0.1:{port}/healthz")
        # The status page's sampler runs by the clock, not by the call: off (hit_cpu.py).
        env = {"LLMGATE_UPSTREAM_URL": f"http://127.0.0.1:{port}/v1",
               "LLMGATE_CACHE_MODE": "off", "LLMGATE_LOG_REQUESTS": str(log).lower(),
               "LLMGATE_STATUS_SAMPLE_S": "0"}  # fmt: skip
        headers = {**NGINX_HEADERS, "HTTP_X_SIM_TTFT_MS": "0", "HTTP_X_SIM_TPS": f"{tps:g}"}
        if traces:
            from bench.tracing.trace_latency import Sink

            sink = Sink()
            env["LLMGATE_OTEL_ENDPOINT"] = sink.url
        if keys:
            mc_port = free_port()
            argv = ["memcached", "-l", "127.0.0.1", "-p", str(mc_port), "-U", "0", "-m", "64"]
            argv += ["-u", "nobody"] if os.geteuid() == 0 else []
            procs.append(Proc("memcached", argv, log_path=run_dir / "memcached.log"))
            procs[-1].wait_port(mc_port)
            digest = hashlib.sha256(KEY_SECRET.encode()).hexdigest()
            keys_file = run_dir / "keys.toml"
            limited = KEY_LIMITS if limits else ""
            keys_file.write_text(f'[[keys]]\nname = "bench"\nsha256 = "{digest}"\n{limited}')
            env |= {"LLMGATE_KEYS_FILE": str(keys_file), "LLMGATE_LOG_REQUESTS": "true",
                    "LLMGATE_MEMCACHED": f"127.0.0.1:{mc_port}"}  # fmt: skip
            headers["HTTP_AUTHORIZATION"] = f"Bearer {KEY_SECRET}"
        app = _app(env, run_dir, floor)
        body = json.dumps({**BODY, "stream": kind == "stream"}).encode()
        found = _timed_calls(app, body, headers, calls, rounds, callers, warm_up)
        if traces:  # every span exported before the receiver stops: counted in the run
            app.extensions["llmgate"].tracer.shutdown()  # type: ignore[attr-defined]
        stats = urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/stats").read()
        found["upstream_calls"] = json.loads(stats)["requests"]
        if found["upstream_calls"] != found["calls"]:  # each call went upstream, once
            raise SystemExit(f"{found['calls']} calls made, the simulator served {stats!r}")
        return found
    finally:
        if sink is not None:
            sink.stop()
        for proc in procs:
            proc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def _app(env: dict[str, str], run_dir: Path, floor: bool) -> App:
    os.environ.update(env)  # the floor reads its upstream as its module is imported
    if floor:
        from bench.floor.app import app

        return app
    (run_dir / "metrics").mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(run_dir / "metrics")
    from app.factory import create_app

    return create_app(environ=env)


def _timed_calls(
    app: App,
    body: bytes,
    headers: dict[str, str],
    calls: int,
    rounds: int,
    callers: int,
    warm_up: int = WARM_UP,
) -> dict[str, Any]:
    import gevent

    made = 0

    def caller(n: int) -> None:
        nonlocal made
        for _ in range(n):
            status, _ = call_once(app, body, headers)
            made += 1
            if not status.startswith("200"):  # an error answer costs less: not this measure
                raise SystemExit(f"a call was answered {status}")

    def run(n: int) -> None:
        if callers == 1:
            caller(n)
        else:
            greenlets = [gevent.spawn(caller, n // callers) for _ in range(callers)]
            gevent.joinall(greenlets, raise_error=True)

    run(min(warm_up, calls))
    gc.collect()
    gc.freeze()
    collector = CollectorClock()
    per_call = []
    wall = time.monotonic()
    for _ in range(rounds):
        began = time.process_time()
        run(calls)
        per_call.append((time.process_time() - began) / (calls // callers * callers) * 1e6)
    wall = time.monotonic() - wall
    gc_us = collector.seconds / (calls * rounds) * 1e6
    return {"us": min(per_call), "rounds": per_call, "calls": made, "gc_us": gc_us,
            "gc_passes": collector.passes, "rounds_s": wall}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.call_cpu", description=__doc__)
    parser.add_argument("revs", nargs="*", help="two git revisions, e.g. HEAD~1 HEAD")
    parser.add_argument("--kind", choices=("non-stream", "stream"), default="non-stream")
    parser.add_argument("--keys", action="store_true", help="a gateway key with its limits")
    parser.add_argument("--no-limits", action="store_true", help="with --keys: a key without")
    parser.add_argument("--log", action="store_true", help="each call's log line (--keys: on)")
    parser.add_argument("--traces", action="store_true", help="every call's spans exported")
    parser.add_argument("--callers", type=int, default=1, help="greenlets calling at once")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=2, help="processes per revision")
    parser.add_argument("--floor", action="store_true", help="bench/floor/app.py's calls")
    parser.add_argument("--tps", type=float, default=FAST_TPS, help="a stream's tokens a second")
    parser.add_argument(
        "--instructions", type=int, metavar="N", help="instructions per call over N calls, counted"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", type=int, default=WARM_UP, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.no_limits and not args.keys:
        parser.error("--no-limits is a key's: give --keys too")
    if args.tps != FAST_TPS and (args.kind != "stream" or args.tps <= 0):
        parser.error("--tps paces a stream's events: give --kind stream and a pace above 0")
    if args.measure:
        found = measure(args.kind, args.calls, args.rounds, args.callers, keys=args.keys,
                        floor=args.floor, log=args.log, limits=not args.no_limits,
                        traces=args.traces, tps=args.tps, warm_up=args.warm_up)  # fmt: skip
        print(json.dumps(found))
        return
    if len(args.revs) not in (0, 2):
        parser.error("give two revisions, or none for the working tree")
    paced_alone = args.tps <= COUNTED_TPS and args.callers == 1
    if args.instructions and args.kind == "stream" and not paced_alone:
        parser.error(STREAM_NOT_COUNTED)

    work = Path(tempfile.mkdtemp(prefix="llmgate-call-cpu-trees-"))
    try:
        here = "floor" if args.floor else "working tree"
        trees = {here: Path.cwd()} if not args.revs else {
            rev: export(rev, work / str(i)) for i, rev in enumerate(args.revs)
        }  # fmt: skip
        call_argv = ["--kind", args.kind, "--callers", str(args.callers),
                     *(["--keys"] if args.keys else []),
                     *(["--floor"] if args.floor else []),
                     *(["--log"] if args.log else []),
                     *(["--no-limits"] if args.no_limits else []),
                     *(["--traces"] if args.traces else []),
                     *(["--tps", f"{args.tps:g}"] if args.tps != FAST_TPS else [])]  # fmt: skip
        if args.instructions:
            # Both counts past the same warm-up: they differ by the N calls alone.
            base = PACED_WARM_UP if args.kind == "stream" else WARM_UP
            counted = {
                rev: instructions_per_call(
                    tree,
                    "bench.cpu.call_cpu",
                    args.instructions,
                    [*call_argv, "--warm-up", str(base)],
                    base=base,
                )
                for rev, tree in trees.items()
            }
            print("\n".join(counted_lines(counted, "call")))
            return
        measure_argv = [*call_argv, "--calls", str(args.calls), "--rounds", str(args.rounds)]
        print("\n".join(in_turns("bench.cpu.call_cpu", trees, measure_argv, args.turns, "call")))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
