"""A keyed call at low concurrency, against the same call without a key: `python -m
bench.load.keyed_few`.

Issue 45's fourth point: with few callers a key's Memcached round trips are on the call's
path. Two stacks run side by side (two gevent workers behind nginx each, the simulator
answering at once, the cache off, one Memcached): one with bench/load/compare.py's keys file
(a key with four limits, counted in Memcached), one without keys. Their rounds alternate,
the first side changing each round, so both see the same machine (shared: only same-run
ratios mean anything); each round is ``--calls`` non-stream chat calls by ``--callers``
callers. Beside p50 and calls/s: the CPU each call cost (gunicorn, nginx and Memcached) and
how busy the cores were (every process's use, from /proc/stat).

Then a third stack, keyed, whose Memcached sits behind a fault proxy
(tests/support/faultproxy.py) that delays every reply by ``--delay-ms``: how much longer a
sequential call takes, in delays, is how many times it waits for Memcached before its
caller has the whole answer (its grant, and its settlement while that holds the answer).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from bench.kit import loadgen, proctree
from bench.kit.machine import _ticks
from bench.load.compare import INSTANT, request, write_keys
from runner.stack import Stack, StackOptions
from tests.support.faultproxy import FaultProxy
from tests.support.memcached import start_memcached

SECRET = "llmg-bench-keyed-few"
AUTH = {"Authorization": f"Bearer {SECRET}"}


def _start(run_dir: Path, env: dict[str, str]) -> Stack:
    options = StackOptions(run_dir=run_dir, workers=2, simulator_args=INSTANT, memcached=False,
                           env={"LLMGATE_CACHE_MODE": "off", **env})  # fmt: skip
    return Stack(options).start()


def _address(stack: Stack) -> tuple[str, int]:
    host, port = stack.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _pids(stack: Stack) -> list[int]:
    return [p for n in ("nginx", "gunicorn") for p in proctree.tree(stack.proc(n).popen.pid)]


def waits_on_path(run_dir: Path, keys: Path, mc_port: int, delay_s: float) -> float:
    """Sequential keyed calls' p50 with Memcached's replies delayed, less without, in delays."""
    with FaultProxy("127.0.0.1", mc_port) as proxy:
        stack = _start(run_dir, {"LLMGATE_KEYS_FILE": str(keys),
                                 "LLMGATE_MEMCACHED": f"127.0.0.1:{proxy.port}"})  # fmt: skip
        try:
            address, call = _address(stack), request("chat", False, AUTH)
            loadgen.run(*address, call, 1, 20)
            plain = loadgen.pct(loadgen.run(*address, call, 1, 30).total, 0.5)
            proxy.latency(delay_s)
            loadgen.run(*address, call, 1, 3)
            slow = loadgen.pct(loadgen.run(*address, call, 1, 30).total, 0.5)
        finally:
            stack.stop()
    return (slow - plain) / (delay_s * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.load.keyed_few", description=__doc__)
    parser.add_argument("--callers", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-keyed-few-"))
    mc, mc_port = start_memcached(run_dir)
    keys = write_keys(run_dir, SECRET)
    memcached = f"127.0.0.1:{mc_port}"
    stacks: list[Stack] = []
    try:
        keyed = _start(run_dir / "keyed", {"LLMGATE_KEYS_FILE": str(keys), "LLMGATE_MEMCACHED": memcached})
        stacks.append(keyed)
        plain = _start(run_dir / "plain", {"LLMGATE_MEMCACHED": memcached})
        stacks.append(plain)
        sides = {
            "keyed": (_address(keyed), request("chat", False, AUTH), _pids(keyed) + [mc.popen.pid]),
            "no key": (_address(plain), request("chat", False, {}), _pids(plain)),
        }  # fmt: skip
        for address, call, _ in sides.values():
            loadgen.run(*address, call, args.callers, 300)
        seen: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in sides}
        print(f"{args.callers} callers, {args.calls} non-stream chat calls a round; CPU: gunicorn,"
              " nginx (and Memcached, keyed) per call; busy: every core, every process")  # fmt: skip
        print("| round | keyed p50 ms | calls/s | µs CPU | busy | no key p50 ms | calls/s | "
              "µs CPU | busy | p50 × | calls/s × |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for turn in range(args.rounds):
            order = list(sides) if turn % 2 == 0 else list(reversed(sides))
            for name in order:
                address, call, pids = sides[name]
                cpu, ticks = proctree.cpu_s(pids), _ticks()
                done = loadgen.run(*address, call, args.callers, args.calls)
                used, after = proctree.cpu_s(pids) - cpu, _ticks()
                busy = (after[0] - ticks[0]) / max(1, after[1] - ticks[1])
                n = max(1, len(done.total))
                seen[name].append((loadgen.pct(done.total, 0.5), done.rps, used / n * 1e6, busy))
                if done.errors:
                    print(f"{name}: {len(done.errors)} errors, e.g. {done.errors[0]}")
            k, p = seen["keyed"][-1], seen["no key"][-1]
            print(f"| {turn + 1} | {k[0]:.2f} | {k[1]:.0f} | {k[2]:.0f} | {k[3]:.0%} | {p[0]:.2f} "
                  f"| {p[1]:.0f} | {p[2]:.0f} | {p[3]:.0%} | {k[0] / p[0]:.2f} | {k[1] / p[1]:.2f} |")  # fmt: skip
        pairs = list(zip(seen["keyed"], seen["no key"], strict=True))
        p50 = statistics.median(k[0] / p[0] for k, p in pairs)
        rate = statistics.median(k[1] / p[1] for k, p in pairs)
        cpu = statistics.median(k[2] / p[2] for k, p in pairs)
        print(f"median of the rounds: keyed p50 {p50:.2f}×, calls/s {rate:.2f}×, CPU a call "
              f"{cpu:.2f}× the call without a key")  # fmt: skip
        for stack in stacks:
            stack.stop()
        stacks.clear()
        waits = waits_on_path(run_dir / "delayed", keys, mc_port, args.delay_ms / 1000)
        print(f"a keyed call waits for Memcached {waits:.2f} times before its caller has the "
              f"answer ({args.delay_ms:.0f} ms a reply, one caller)")  # fmt: skip
    finally:
        for stack in stacks:
            stack.stop()
        mc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
