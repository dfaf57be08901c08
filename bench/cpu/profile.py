"""Where a gateway worker's CPU goes: py-spy on one gunicorn worker under a steady load.

`python -m bench.cpu.profile [stream|chat|hit] [--seconds 15] [--callers 32]` starts a `make
run`-shaped stack with one worker and the cache off, keeps ``callers`` requests in flight
(streams of 50 events at 1,000 tokens/s, so the per-event path dominates, or 50 ms non-stream
answers; ``hit``: the cache on, one stored answer given again from the worker's L1), and
samples the worker with py-spy (``pip install py-spy``; not a requirement of the repository).
It prints the worker's CPU per request, read from /proc, and the functions with the most
samples, by their own time and with their callees. The raw samples stay in the run directory:
flame graphs are for reading, not for the repository (docs/performance.md keeps the
conclusions).

``--upstream anthropic|gemini|openai`` (and ``--door chat|messages``) asks the same calls
of bench/cpu/translation.py's stack instead, whose upstreams file has one upstream of each kind
(one worker here too): the profile of a translated call beside its pass-through's.
``--gil`` samples only while the worker holds the GIL (py-spy's own option): the samples
then follow its Python CPU rather than its waits. ``--tps N`` paces a stream's events at N
tokens a second instead of 1,000: at the overhead section's 100 each event is a read and a
write of its own, as in a worker under that load. ``--keys``: the calls carry a gateway key
with bench.ab's limits, counted in Memcached (bench.ab's ``-keys`` kinds).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.cpu import ab, translation
from bench.cpu.translation_table import Case
from bench.kit import loadgen, proctree
from runner.stack import Stack, StackOptions

CALLS = {
    "stream": ({"stream": True, "max_tokens": 50}, {"x-sim-ttft-ms": "20", "x-sim-tps": "1000"}),
    "chat": ({"max_tokens": 16}, {"x-sim-ttft-ms": "50"}),
    # A cache hit: one 50-token answer stored by the first call, every later call answered
    # from the worker's L1 (cache on, no Memcached): issue 25's hits against the floor.
    "hit": ({"max_tokens": 50, "temperature": 0}, {"x-sim-ttft-ms": "10"}),
}


def top(samples: Path, count: int = 25) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(total samples, functions by own samples, functions by samples with their callees),
    from py-spy's raw (collapsed) output: one ``frame;frame;...;leaf N`` line per stack."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in samples.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [_function(f) for f in stack.split(";")]
        total += int(n)
        own[frames[-1]] += int(n)
        for frame in set(frames):
            inclusive[frame] += int(n)
    return total, own.most_common(count), inclusive.most_common(count)


def _function(frame: str) -> str:
    """``name (path:line)`` without the line: one row per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.profile", description=__doc__)
    parser.add_argument("kind", nargs="?", default="stream", choices=sorted(CALLS))
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--upstream", choices=("openai", "anthropic", "gemini"))
    parser.add_argument("--door", choices=("chat", "messages"), default="chat")
    parser.add_argument("--gil", action="store_true", help="py-spy --gil")
    parser.add_argument("--keys", action="store_true", help="a gateway key with limits")
    parser.add_argument("--tps", type=int, help="a stream's tokens a second (default 1,000)")
    args = parser.parse_args()
    if args.tps is not None and (args.kind != "stream" or args.tps <= 0):
        parser.error("--tps paces a stream's events: give the stream kind and a pace above 0")
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-profile-"))
    fields, headers = CALLS[args.kind]
    if args.tps is not None:
        headers = {**headers, "x-sim-tps": str(args.tps)}
    if args.upstream:
        stack, _ = translation.launch(run_dir, workers=1)
        case = Case(args.door, args.upstream, args.kind == "stream", fields["max_tokens"])
        request = translation.request(case, headers)
    else:
        cache = "deterministic" if args.kind == "hit" else "off"
        env = {"LLMGATE_CACHE_MODE": cache}
        if args.keys:
            keys = run_dir / "keys.toml"
            digest = hashlib.sha256(ab.KEY_SECRET.encode()).hexdigest()
            keys.write_text(f'[[keys]]\nname = "ab"\nsha256 = "{digest}"\n{ab.KEY_LIMITS}')
            env["LLMGATE_KEYS_FILE"] = str(keys)
            headers = {**headers, "Authorization": f"Bearer {ab.KEY_SECRET}"}
        stack = Stack(StackOptions(run_dir=run_dir, workers=1, memcached=args.keys,
                                   env=env)).start()  # fmt: skip
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "p"}], **fields}
        request = loadgen.request_bytes("/v1/chat/completions", body, headers)
    try:
        host, port = stack.url.removeprefix("http://").rsplit(":", 1)
        gunicorn = next(p for p in stack.procs if p.name.startswith("gunicorn"))
        worker = proctree.tree(gunicorn.popen.pid)[1]
        results: list[loadgen.Result] = []
        count = 1_000_000  # the load runs until the timeout: longer than the profile
        load = threading.Thread(target=lambda: results.append(loadgen.run(
            host, int(port), request, args.callers, count, timeout=args.seconds + 4)))  # fmt: skip
        load.start()
        time.sleep(2)
        samples = run_dir / f"{args.kind}.txt"
        before = proctree.cpu_s([worker])
        subprocess.run([py_spy, "record", "-p", str(worker), "-d", str(int(args.seconds)),
                        "-r", "200", "-f", "raw", "-o", str(samples), "--nonblocking",
                        *(["--gil"] if args.gil else [])],
                       check=True, capture_output=True)  # fmt: skip
        cpu = proctree.cpu_s([worker]) - before
        load.join()
        result = results[0]
        rate = len(result.total) / result.wall if result.wall else 0.0
        total, own, inclusive = top(samples)
        print(f"{args.kind}: ~{rate:.0f} requests/s, worker CPU {cpu:.1f} s over the profile "
              f"(~{1000 * cpu / max(1.0, rate * args.seconds):.2f} ms per request), "
              f"{total} samples in {samples}")  # fmt: skip
        for title, rows in (("own time", own), ("with callees", inclusive)):
            print(f"\n-- by {title}")
            for name, n in rows:
                print(f"{100 * n / total:5.1f}%  {name[-100:]}")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
