"""What a cache hit costs the app itself: `python -m bench.cpu.hit_cpu [A B] [--calls 10000]
[--rounds 5]`.

bench/cpu/ab.py measures a whole stack (nginx, gunicorn, the sockets), whose runs spread by
about ±5 % on a 2-core VM shared with other engineers' tests: a cut of a few microseconds
on a 0.5 ms hit is lost in it. This measures only what the revision's own code adds: its
app (`create_app`, the cache on, the simulator as the upstream) called as a WSGI callable in
this process, with the environ gunicorn would pass for the request nginx sends, one
answer stored by the first call and given again from the worker's L1 to every later one.
The garbage collector is set up as a worker's is (gunicorn.conf.py, post_worker_init:
collected, then frozen). Each round times ``calls`` hits by this process's CPU; a round is
slowed by what else the machine does, never sped up, so the best round is the figure, with
every round listed, and the collector's share (its passes, timed).

With two revisions, each is exported as bench/cpu/ab.py exports it (this tree's bench/ in
place of its own) and measured in a process of its own, in turns, A, B, A, B: the best of
each side and B over A.
Without, the working tree alone. The whole hit through gunicorn and nginx, and the floor
beside it, stay bench.ab's and bench.floor's.

``--floor`` measures bench/floor/app.py's hit the same way (Flask, and the answer kept in a
dict by the request's bytes): the least a hit costs an app of this shape, beside the gateway's.

``--instructions N`` counts instead of timing: the same process run under valgrind's
cachegrind twice, once with N hits more than the other, and the difference in instructions
executed divided by N (start-up and warm-up cancel out; PYTHONHASHSEED fixed). Slow (a
minute or two a revision), and other processes barely change it: two counts of one tree
differed by up to 1.3 %, where a timed round beside other engineers' tests moved by 10 %.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.cpu.ab import KINDS, export

# bench/cpu/ab.py's hit kind: a deterministic chat call of 50 tokens, the simulator's first
# token after 10 ms (NGINX_HEADERS' x-sim-ttft-ms).
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "ab"}], **KINDS["hit"][0]}
# What nginx sends gunicorn for it (nginx/llmgate.conf.template's proxy_set_header lines).
NGINX_HEADERS = {
    "HTTP_HOST": "bench",
    "HTTP_X_REQUEST_ID": "0123456789abcdef0123456789abcdef",
    "HTTP_X_FORWARDED_FOR": "127.0.0.1",
    "HTTP_X_REAL_IP": "127.0.0.1",
    "HTTP_X_FORWARDED_PROTO": "http",
    "HTTP_X_SIM_TTFT_MS": "10",
}


def environ_for(body: bytes, headers: dict[str, str] = NGINX_HEADERS) -> dict[str, Any]:
    """The WSGI environ of one call, as gunicorn builds it (its own keys aside), with the
    request's ``headers`` (as WSGI names them; nginx's by default)."""
    return {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/v1/chat/completions",
        "RAW_URI": "/v1/chat/completions",
        "QUERY_STRING": "",
        "SERVER_NAME": "bench",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "40000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        **headers,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def call_once(
    app: Callable[..., Iterable[bytes]], body: bytes, headers: dict[str, str] = NGINX_HEADERS
) -> tuple[str, dict[str, str]]:
    """One request through the WSGI callable, its body read and closed: (status, headers)."""
    seen: list[tuple[str, dict[str, str]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen.append((status, dict(headers)))

    answer = app(environ_for(body, headers), start_response)
    try:
        for _ in answer:
            pass
    finally:
        close = getattr(answer, "close", None)
        if close is not None:
            close()
    return seen[0]


class CollectorClock:
    """The garbage collector's passes and the time they took, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.passes = 0
        self.seconds = 0.0
        self._began = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.passes += 1
            self.seconds += time.perf_counter() - self._began


def measure(calls: int, rounds: int, *, floor: bool = False) -> dict[str, Any]:
    """This tree's hits: the best round's CPU per hit, every round, the collector's share."""
    from gevent import monkey

    monkey.patch_all()  # as gunicorn's gevent worker does before it loads the app
    from runner.procs import Proc, free_port

    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-hit-cpu-"))
    argv = [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port)]
    sim = Proc("simulator", argv, log_path=run_dir / "simulator.log")
    try:
        sim.wait_http(f"http://127.0.0.1:{port}/healthz")
        upstream = f"http://127.0.0.1:{port}/v1"
        app = _floor_app(upstream) if floor else _gateway_app(upstream, run_dir / "metrics")
        return _timed_hits(app, upstream, calls, rounds)
    finally:
        sim.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


App = Callable[..., Iterable[bytes]]


def _gateway_app(upstream: str, metrics_dir: Path) -> App:
    metrics_dir.mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    # The status page's sampler runs by the clock, not by the call (a sample every 10 s, about
    # 1.5 ms each): off, or the rounds would count it against whichever calls their time held.
    env = {"LLMGATE_UPSTREAM_URL": upstream, "LLMGATE_CACHE_MODE": "deterministic",
           "LLMGATE_STATUS_SAMPLE_S": "0"}  # fmt: skip
    from app.factory import create_app

    # Each hit's log line is written to stderr, as in a worker: the caller sends it to a file.
    return create_app(environ=env)


def _floor_app(upstream: str) -> App:
    os.environ["LLMGATE_UPSTREAM_URL"] = upstream  # read as the module is imported
    from bench.floor.app import app

    return app


def _timed_hits(app: App, upstream: str, calls: int, rounds: int) -> dict[str, Any]:
    body = json.dumps(BODY).encode()
    call_once(app, body)  # the miss that stores the answer
    status, headers = call_once(app, body)
    cache = headers.get("X-LLMGate-Cache", "HIT (the floor's dict)")
    asked = json.loads(urllib.request.urlopen(upstream.removesuffix("/v1") + "/sim/stats").read())
    if not (status.startswith("200") and cache.startswith("HIT")) or asked["requests"] != 1:
        raise SystemExit(f"the second call was not a hit: {status} {cache!r}, {asked}")
    for _ in range(1000):  # the same for any ``calls``: --instructions subtracts two runs
        call_once(app, body)
    gc.collect()
    gc.freeze()
    collector = CollectorClock()
    per_hit = []
    for _ in range(rounds):
        began = time.process_time()
        for _ in range(calls):
            call_once(app, body)
        per_hit.append((time.process_time() - began) / calls * 1e6)
    hits = calls * rounds
    return {"us": min(per_hit), "rounds": per_hit, "cache": cache,
            "gc_us": collector.seconds / hits * 1e6, "gc_passes": collector.passes}  # fmt: skip


def summarize(results: dict[str, list[dict[str, Any]]], unit: str = "hit") -> list[str]:
    """Each side's best CPU per ``unit`` with its runs; B over A when there are two."""
    lines = []
    for rev, runs in results.items():
        rounds = ", ".join(f"{r:.1f}" for run in runs for r in run["rounds"])
        gc_us = min(run["gc_us"] for run in runs)
        lines.append(
            f"{rev:12} {min(run['us'] for run in runs):6.1f} us/{unit} (best)  [{rounds}]"
            f"  collector {gc_us:.1f} us/{unit}"
        )
    if len(results) == 2:
        (a, runs_a), (b, runs_b) = results.items()
        best_a, best_b = min(r["us"] for r in runs_a), min(r["us"] for r in runs_b)
        lines.append(f"{b} / {a}: {best_b / best_a:.3f} ({best_b - best_a:+.1f} us/{unit})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.hit_cpu", description=__doc__)
    parser.add_argument("revs", nargs="*", help="two git revisions, e.g. HEAD~1 HEAD")
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=2, help="processes per revision")
    parser.add_argument(
        "--instructions", type=int, metavar="N", help="instructions per hit over N hits, counted"
    )
    parser.add_argument("--floor", action="store_true", help="bench/floor/app.py's hits")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.calls, args.rounds, floor=args.floor)))
        return
    if len(args.revs) not in (0, 2):
        parser.error("give two revisions, or none for the working tree")

    work = Path(tempfile.mkdtemp(prefix="llmgate-hit-cpu-trees-"))
    try:
        here = "floor" if args.floor else "working tree"
        trees = {here: Path.cwd()} if not args.revs else {
            rev: export(rev, work / str(i)) for i, rev in enumerate(args.revs)
        }  # fmt: skip
        if args.instructions:
            hits = args.instructions
            counted = {
                rev: instructions_per_hit(tree, hits, floor=args.floor)
                for rev, tree in trees.items()
            }
            print("\n".join(counted_lines(counted)))
            return
        measure_argv = ["--calls", str(args.calls), "--rounds", str(args.rounds),
                        *(["--floor"] if args.floor else [])]  # fmt: skip
        print("\n".join(in_turns("bench.cpu.hit_cpu", trees, measure_argv, args.turns, "hit")))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def in_turns(
    module: str, trees: dict[str, Path], measure_argv: list[str], turns: int, unit: str
) -> list[str]:
    """Each tree measured by ``python -m module --measure *measure_argv`` in a process of
    its own, in turns; the summary (bench/cpu/call_cpu.py measures its calls this way too)."""
    results: dict[str, list[dict[str, Any]]] = {rev: [] for rev in trees}
    for turn in range(1, turns + 1):
        for rev, tree in trees.items():
            argv = [sys.executable, "-m", module, "--measure", *measure_argv]
            run = json.loads(_run(argv, tree).splitlines()[-1])
            results[rev].append(run)
            print(f"turn {turn}: {rev} {run['us']:.1f} us/{unit} (best of its rounds)", flush=True)
    return summarize(results, unit)


def counted_lines(counted: dict[str, float], unit: str = "hit") -> list[str]:
    """Each revision's instructions per hit (or call), and B over A when there are two."""
    lines = [f"{rev:12} {n / 1000:8.1f} thousand instructions/{unit}" for rev, n in counted.items()]
    if len(counted) == 2:
        (a, n_a), (b, n_b) = counted.items()
        lines.append(f"{b} / {a}: {n_b / n_a:.3f} ({(n_b - n_a) / 1000:+.1f} thousand/{unit})")
    return lines


def instructions_per_hit(tree: Path, hits: int, *, floor: bool = False) -> float:
    """What one hit executes, in instructions (valgrind's cachegrind; see the docstring)."""
    return instructions_per_call(tree, "bench.cpu.hit_cpu", hits, ["--floor"] if floor else [])


def instructions_per_call(
    tree: Path, module: str, calls: int, measure_argv: list[str], base: int = 200
) -> float:
    """What one call of ``python -m module --measure`` executes, in instructions: the process
    counted by valgrind's cachegrind with ``base`` calls and with ``base + calls``, the
    difference over ``calls``. Its children (the simulator, Memcached) are not counted."""
    counts = []
    for n in (base, base + calls):
        with tempfile.NamedTemporaryFile("r", prefix="llmgate-cachegrind-") as report:
            argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                    "--cachegrind-out-file=/dev/null", f"--log-file={report.name}",
                    sys.executable, "-m", module, "--measure", "--calls", str(n),
                    "--rounds", "1", *measure_argv]  # fmt: skip
            _run(argv, tree, {"PYTHONHASHSEED": "0"})
            counts.append(instructions_in(report.read()))
    return (counts[1] - counts[0]) / calls


def _run(argv: list[str], tree: Path, env: dict[str, str] | None = None) -> str:
    """``argv``'s output, run in ``tree``; its stderr (a log line per hit) to a file, whose
    end is shown if it fails."""
    with tempfile.TemporaryFile("w+") as stderr:
        done = subprocess.run(argv, cwd=tree, env={**os.environ, **(env or {})},
                              stdout=subprocess.PIPE, stderr=stderr, text=True)  # fmt: skip
        if done.returncode:
            stderr.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed:\n{stderr.read()[-3000:]}")
        return done.stdout


def instructions_in(report: str) -> int:
    """The instructions executed, from cachegrind's summary ("==12== I   refs:  4,059,731")."""
    found = re.search(r"I\s+refs:\s+([\d,]+)", report)
    if found is None:
        raise SystemExit("valgrind gave no instruction count:\n" + report[-2000:])
    return int(found.group(1).replace(",", ""))


if __name__ == "__main__":
    main()
