"""A keyed call at low concurrency, against the same call without a key: `python -m
bench.load.keyed_few`, and the report's ``keyed`` part (`python -m bench --only keyed`).

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
The report's smoke run (`make bench-smoke`) makes one short round and leaves it out.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from app.tenancy.keyring import hash_key
from bench.kit import loadgen, proctree
from bench.kit.machine import _ticks
from bench.kit.report import Check, Config, Section
from bench.load.compare import INSTANT, request, write_keys
from runner.stack import Stack, StackOptions
from tests.support.faultproxy import FaultProxy
from tests.support.memcached import start_memcached

SECRET = "llmg-bench-keyed-few"
BARE = "llmg-bench-keyed-few-bare"  # a key without limits: nothing counted
AUTH = {"Authorization": f"Bearer {SECRET}"}
CALLS = ("keyed", "no limits", "no key")
# Issue 45's goal at 10 callers: a keyed call's p50 and calls/s over the same call's without a key.
P50_AT_MOST, RATE_AT_LEAST = 1.15, 0.9
Row = tuple[float, float, float, float, float, float]  # p50 ms, calls/s, µs CPU, Memcached µs,
# Server-Timing's auth ms, the cores' busy share


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
    address: tuple[str, int], call: bytes, pids: list[int], mc_pid: int, callers: int, calls: int
) -> Row:
    """One round of one call."""
    cpu, mc_cpu, ticks = proctree.cpu_s(pids), proctree.cpu_s([mc_pid]), _ticks()
    done = loadgen.run(*address, call, callers, calls, keep="Server-Timing")
    used, after = proctree.cpu_s(pids) - cpu, _ticks()
    cached = proctree.cpu_s([mc_pid]) - mc_cpu
    busy = (after[0] - ticks[0]) / max(1, after[1] - ticks[1])
    if done.errors:
        raise RuntimeError(f"{len(done.errors)} errors, e.g. {done.errors[0]}")
    n = max(1, len(done.total))
    p50 = loadgen.pct(done.total, 0.5)
    return p50, done.rps, used / n * 1e6, cached / n * 1e6, _stage(done.kept, "auth"), busy


def ratios(seen: dict[str, list[Row]], name: str) -> tuple[float, float, float]:
    """``name``'s p50, calls/s and CPU a call (Memcached's with it) over no key's: the median
    of the rounds' ratios, each round's pair measured one after the other."""
    pairs = list(zip(seen[name], seen["no key"], strict=True))
    return (
        statistics.median(k[0] / p[0] for k, p in pairs),
        statistics.median(k[1] / p[1] for k, p in pairs),
        statistics.median((k[2] + k[3]) / (p[2] + p[3]) for k, p in pairs),
    )


def measure(
    callers: int, calls: int, rounds: int, delay_s: float | None, progress: Callable[[str], None]
) -> tuple[dict[str, list[Row]], float | None]:
    """Each call's rounds, and the waits on a keyed call's path (None: not measured)."""
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
        bare = request("chat", False, {"Authorization": f"Bearer {BARE}"})
        sides = {
            "keyed": (_address(keyed), request("chat", False, AUTH), _pids(keyed)),
            "no limits": (_address(keyed), bare, _pids(keyed)),
            "no key": (_address(plain), request("chat", False, {}), _pids(plain)),
        }
        for address, call, _ in sides.values():
            loadgen.run(*address, call, callers, max(30, calls // 5))
        seen: dict[str, list[Row]] = {name: [] for name in CALLS}
        for turn in range(rounds):
            for name in CALLS[turn % 3 :] + CALLS[: turn % 3]:
                progress(f"keyed: round {turn + 1}, {name}")
                seen[name].append(_round(*sides[name], mc.popen.pid, callers, calls))
        for stack in stacks:
            stack.stop()
        stacks.clear()
        if delay_s is None:
            return seen, None
        progress("keyed: the waits on the path")
        return seen, waits_on_path(run_dir / "delayed", keys, mc_port, delay_s)
    finally:
        for stack in stacks:
            stack.stop()
        mc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def run(cfg: Config) -> Section:
    """The report's part: the three calls at 10 callers, the goal's two checks."""
    callers, calls, rounds = (10, 60, 1) if cfg.smoke else (10, 1500, 9)
    delay_s = None if cfg.smoke else 0.02
    seen, waits = measure(callers, calls, rounds, delay_s, cfg.progress)
    rows: list[list[float | str | None]] = []
    for name in CALLS:
        medians = [statistics.median(row[i] for row in seen[name]) for i in range(6)]
        over = ratios(seen, name) if name != "no key" else (None, None, None)
        rows.append([name, *medians[:5], *over])
    p50, rate, _ = ratios(seen, "keyed")
    checks = [
        Check(f"keyed non-stream call, {callers} callers: p50", "<=", P50_AT_MOST, p50, "x no key"),
        Check(
            f"keyed non-stream call, {callers} callers: calls/s",
            ">=",
            RATE_AT_LEAST,
            rate,
            "x no key",
        ),
    ]
    busy = [row[5] for rows_ in seen.values() for row in rows_]
    notes = [
        f"{rounds} rounds of {calls} non-stream chat calls by {callers} callers, the three calls"
        " in turns (the order turned each round), an instant upstream, the cache off; each"
        " figure the median over the rounds, a ratio the median of the rounds' ratios.",
        f"The cores were {min(busy):.0%} to {max(busy):.0%} busy (every process, /proc/stat).",
        "The waits for Memcached on a keyed call's path are not measured in the smoke run."
        if waits is None
        else f"A keyed call waits for Memcached {waits:.2f} times before its caller has the"
        " whole answer (one caller, each of Memcached's replies 20 ms late).",
    ]
    columns = [
        "call",
        "p50 ms",
        "calls/s",
        "µs CPU a call",
        "Memcached µs a call",
        "auth ms",
        "p50 x no key",
        "calls/s x no key",
        "CPU x no key",
    ]
    return Section(
        key="keyed",
        title="A keyed call at 10 callers: a key with four limits, a key without, no key",
        columns=columns,
        rows=rows,
        data={
            "rounds": seen,
            "waits_on_path": waits,
            "settings": {"callers": callers, "calls": calls, "rounds": rounds, "workers": 2},
        },
        checks=checks,
        notes=notes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.load.keyed_few", description=__doc__)
    parser.add_argument("--callers", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    seen, waits = measure(args.callers, args.calls, args.rounds, args.delay_ms / 1000, print)
    print(
        f"{args.callers} callers, {args.calls} non-stream chat calls a round; µs CPU a call:"
        " gunicorn and nginx, + Memcached's; auth: Server-Timing's, the key and its grant;"
        " busy: every core, every process"
    )
    print("| round | call | p50 ms | calls/s | µs CPU | auth ms | busy |")
    print("|---|---|---|---|---|---|---|")
    for turn in range(args.rounds):
        for name in CALLS[turn % 3 :] + CALLS[: turn % 3]:
            p50, rate, cpu, cached, auth, busy = seen[name][turn]
            print(
                f"| {turn + 1} | {name} | {p50:.2f} | {rate:.0f} | {cpu:.0f} + {cached:.0f} | "
                f"{auth:.1f} | {busy:.0%} |"
            )
    for name in ("keyed", "no limits"):
        p50x, ratex, cpux = ratios(seen, name)
        print(
            f"{name}, the median of the rounds' ratios to no key: p50 {p50x:.2f}x, "
            f"calls/s {ratex:.2f}x, CPU a call {cpux:.2f}x"
        )
    print(
        f"a keyed call waits for Memcached {waits:.2f} times before its caller has the "
        f"answer ({args.delay_ms:.0f} ms a reply, one caller)"
    )


if __name__ == "__main__":
    main()
