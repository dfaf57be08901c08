"""What one call with a gateway key costs Memcached: `python -m bench.cpu.counter_trips`.

A stack with a keys file whose key has per-key limits (bench/load/compare.py's "features on":
requests and tokens a minute, tokens a day, concurrent streams), the cache off, so every
Memcached command is the limit counters'. Memcached sits behind a counting proxy of this
file's, so both numbers come from outside the gateway:

- **commands**, from Memcached's own ``stats`` before and after (incr, decr, touch, add as
  ``cmd_set``, get);
- **round trips**, from the proxy: a worker's send that follows a reply on its connection
  (or opens it) is one wait for Memcached. A send that follows a send with no reply between
  (a command sent ``noreply``) is not a wait, and is counted under ``sends`` only.

Sequential calls, one caller, after a warm-up (the windows' counters exist by then: the
first call of a window also creates them); ``--callers N``: N callers at once, whose counts a
worker sends together when they come while a batch is out (app/store/counters.py), so a
call's share of the round trips falls below two.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.kit import loadgen
from bench.load.compare import write_keys
from runner.stack import Stack, StackOptions
from tests.support.memcached import memcached_stats, start_memcached
from tests.support.trips import TripCounter

SECRET = "llmg-bench-counter-trips"
STATS = ("incr_hits", "incr_misses", "decr_hits", "decr_misses", "cmd_touch", "cmd_set",
         "cmd_get")  # fmt: skip


def measure(
    stack: Stack, proxy: TripCounter, mc_port: int, body: dict, calls: int, callers: int = 1
) -> str:
    host, port = stack.url.removeprefix("http://").rsplit(":", 1)
    headers = {"Authorization": f"Bearer {SECRET}", "x-sim-ttft-ms": "0", "x-sim-tps": "100000"}
    request = loadgen.request_bytes("/v1/chat/completions", body, headers)
    loadgen.run(host, int(port), request, callers, 10 * callers)
    time.sleep(0.5)  # the warm-up's settlements
    before, trips = memcached_stats(mc_port), proxy.counts()
    done = loadgen.run(host, int(port), request, callers, calls)
    time.sleep(0.5)
    after, trips_after = memcached_stats(mc_port), proxy.counts()
    n = max(1, len(done.total))
    parts = [f"{name} {(after[name] - before[name]) / n:.2f}" for name in STATS]
    sends, waits = (b - a for a, b in zip(trips, trips_after, strict=True))
    return (f"{n} calls, {len(done.errors)} errors; per call: round trips {waits / n:.2f}, "
            f"sends {sends / n:.2f}; " + ", ".join(parts))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.counter_trips", description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--callers", type=int, default=1)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-trips-"))
    keys = write_keys(run_dir, SECRET)
    mc, mc_port = start_memcached(run_dir)
    proxy = TripCounter(("127.0.0.1", mc_port))
    env = {"LLMGATE_CACHE_MODE": "off", "LLMGATE_KEYS_FILE": str(keys),
           "LLMGATE_MEMCACHED": f"127.0.0.1:{proxy.port}"}  # fmt: skip
    stack = Stack(StackOptions(run_dir=run_dir / "stack", memcached=False, env=env)).start()
    try:
        base = {"model": "sim-model", "messages": [{"role": "user", "content": "trips"}]}
        for kind, extra in (("non-stream", {"max_tokens": 16}),
                            ("stream", {"max_tokens": 16, "stream": True})):  # fmt: skip
            found = measure(stack, proxy, mc_port, {**base, **extra}, args.calls, args.callers)
            print(f"{kind}: {found}")
    finally:
        stack.stop()
        mc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
