"""A keyed call at low concurrency, against the same call without a key: `python -m
bench.load.keyed_few`.

Issue 45's fourth point: with few callers a key's Memcached round trips are on the call's
path. Two stacks run side by side (two gevent workers behind nginx each, the simulator
answering at once, the cache off, one Memcached): one with a keys file of two keys,
bench/load/compare.py's with four limits counted in Memcached and one with none, the other
without keys. The three calls' rounds take turns (the order turned each round), so they see
the same machine (shared: only same-run ratios mean anything); each round is ``--calls``
non-stream chat calls by ``--callers`` callers. Beside p50 and calls/s: the CPU each call
cost (gunicorn and nginx, Memcached's own apart) and how busy the cores were (every
process's use, from /proc/stat).

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

from app.tenancy.keyring import hash_key
from bench.kit import loadgen, proctree
from bench.kit.machine import _ticks
from bench.load.compare import INSTANT, request, write_keys
from runner.stack import Stack, StackOptions
from tests.support.faultproxy import FaultProxy
from tests.support.memcached import start_memcached

SECRET = "llmg-bench-keyed-few"
BARE = "llmg-bench-keyed-few-bare"  # a key without limits: nothing counted
AUTH = {"Authorization": f"Bearer {SECRET}"}


def _keys(run_dir: Path) -> Path:
    keys = write_keys(run_dir, SECRET)
    with keys.open("a") as out:
        out.write(f'\n[[keys]]\nname = "bare"\nsha256 = "{hash_key(BARE)}"\n')
    return keys


def _start(run_dir: Path, env: dict[str, str]) -> Stack:
    options = StackOptions(
        run_dir=run_dir,
        workers=2,
        simulator_args=INSTANT,
        memcached=False,
        env={"LLMGATE_CACHE_MODE": "off", **env},
    )
    return Stack(options).start()


def _address(stack: Stack) -> tuple[str, int]:
    host, port = stack.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _pids(stack: Stack) -> list[int]:
    return [p for n in ("nginx", "gunicorn") for p in proctree.tree(stack.proc(n).popen.pid)]


def waits_on_path(run_dir: Path, keys: Path, mc_port: int, delay_s: float) -> float:
    """Sequential keyed calls' p50 with Memcached's replies delayed, less without, in delays."""
    with FaultProxy("127.0.0.1", mc_port) as proxy:
        stack = _start(
            run_dir,
            {"LLMGATE_KEYS_FILE": str(keys), "LLMGATE_MEMCACHED": f"127.0.0.1:{proxy.port}"},
        )
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


def _stage(kept: list[tuple[float, str]], stage: str) -> float:
    """The median of one Server-Timing stage over the answers (ms; 0 where it is absent)."""
    found = []
    for _, header in kept:
        durations = dict(part.strip().partition(";dur=")[::2] for part in header.split(","))
        found.append(float(durations.get(stage) or 0))
    return statistics.median(found) if found else 0.0


def _round(
    address: tuple[str, int], call: bytes, pids: list[int], mc_pid: int, args: argparse.Namespace
) -> tuple[tuple[float, ...], str]:
    """One round of one call: (p50 ms, calls/s, µs CPU a call, Memcached's µs), its line."""
    cpu, mc_cpu, ticks = proctree.cpu_s(pids), proctree.cpu_s([mc_pid]), _ticks()
    done = loadgen.run(*address, call, args.callers, args.calls, keep="Server-Timing")
    used, after = proctree.cpu_s(pids) - cpu, _ticks()
    cached = proctree.cpu_s([mc_pid]) - mc_cpu
    busy = (after[0] - ticks[0]) / max(1, after[1] - ticks[1])
    n = max(1, len(done.total))
    row = (loadgen.pct(done.total, 0.5), done.rps, used / n * 1e6, cached / n * 1e6)
    errors = f" {len(done.errors)} errors: {done.errors[0]}" if done.errors else ""
    said = (
        f"{row[0]:.2f} | {row[1]:.0f} | {row[2]:.0f} + {row[3]:.0f} | "
        f"{_stage(done.kept, 'auth'):.1f} | {busy:.0%} |{errors}"
    )
    return row, said


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.load.keyed_few", description=__doc__)
    parser.add_argument("--callers", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-keyed-few-"))
    mc, mc_port = start_memcached(run_dir)
    keys = _keys(run_dir)
    memcached = f"127.0.0.1:{mc_port}"
    stacks: list[Stack] = []
    try:
        keyed = _start(
            run_dir / "keyed", {"LLMGATE_KEYS_FILE": str(keys), "LLMGATE_MEMCACHED": memcached}
        )
        stacks.append(keyed)
        plain = _start(run_dir / "plain", {"LLMGATE_MEMCACHED": memcached})
        stacks.append(plain)
        bare = {"Authorization": f"Bearer {BARE}"}
        sides = {
            "keyed": (_address(keyed), request("chat", False, AUTH), _pids(keyed)),
            "no limits": (_address(keyed), request("chat", False, bare), _pids(keyed)),
            "no key": (_address(plain), request("chat", False, {}), _pids(plain)),
        }
        for address, call, _ in sides.values():
            loadgen.run(*address, call, args.callers, 300)
        seen: dict[str, list[tuple[float, ...]]] = {name: [] for name in sides}
        print(
            f"{args.callers} callers, {args.calls} non-stream chat calls a round; µs CPU a call:"
            " gunicorn and nginx, + Memcached's; auth: Server-Timing's, the key and its grant;"
            " busy: every core, every process"
        )
        print("| round | call | p50 ms | calls/s | µs CPU | auth ms | busy |")
        print("|---|---|---|---|---|---|---|")
        for turn in range(args.rounds):
            for name in list(sides)[turn % 3 :] + list(sides)[: turn % 3]:
                row, said = _round(*sides[name], mc.popen.pid, args)
                seen[name].append(row)
                print(f"| {turn + 1} | {name} | {said}")
        for name in ("keyed", "no limits"):
            pairs = list(zip(seen[name], seen["no key"], strict=True))
            p50 = statistics.median(k[0] / p[0] for k, p in pairs)
            rate = statistics.median(k[1] / p[1] for k, p in pairs)
            cpu = statistics.median((k[2] + k[3]) / (p[2] + p[3]) for k, p in pairs)
            print(
                f"{name}, the median of the rounds' ratios to no key: p50 {p50:.2f}x, "
                f"calls/s {rate:.2f}x, CPU a call {cpu:.2f}x"
            )
        for stack in stacks:
            stack.stop()
        stacks.clear()
        waits = waits_on_path(run_dir / "delayed", keys, mc_port, args.delay_ms / 1000)
        print(
            f"a keyed call waits for Memcached {waits:.2f} times before its caller has the "
            f"answer ({args.delay_ms:.0f} ms a reply, one caller)"
        )
    finally:
        for stack in stacks:
            stack.stop()
        mc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
