"""The CPU of a key's grant and settlement alone: `python -m bench.cpu.grant_cpu`.

One gevent-patched process (as a worker is) runs ``Access.admit`` then ``Access.settle`` for
a gateway key with bench.compare's limits (requests and tokens a minute, tokens a day,
concurrent streams), the counters in a Memcached of its own on loopback, and prints this
process's CPU per call (``time.process_time``), best of ``--rounds``. It measures the
limit-counting part of a call without the rest of the stack's noise: a few tens of
microseconds, below what the end-to-end runs of bench.ab can tell apart.

``--instructions N`` counts a non-stream grant and settlement instead of timing them, as
bench/cpu/hit_cpu.py counts a hit: this process under valgrind's cachegrind with N more of
them in one run than in the other (Memcached not counted), the difference over N. A cut of a
few microseconds moves a timed round on a shared machine less than its noise; the count is
steady to about 2 %.

It uses only ``Access``, ``MemcachedBackend`` and ``MemcachedCounters`` as the app factory
builds them, so it runs in any revision's tree (``git archive`` one and run it there).
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from app.request import routes  # noqa: E402
from app.request.usage import Usage  # noqa: E402
from app.store.counters import MemcachedCounters  # noqa: E402
from app.store.memcached import MemcachedBackend  # noqa: E402
from app.tenancy.access import Access  # noqa: E402
from app.tenancy.key_source import KeySource  # noqa: E402
from bench.load.compare import write_keys  # noqa: E402
from tests.support.memcached import start_memcached  # noqa: E402

SECRET = "llmg-bench-grant-cpu"
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
USAGE = Usage({"prompt_tokens": 9, "completion_tokens": 16, "total_tokens": 25})


def per_call_us(access: Access, stream: bool, calls: int) -> float:
    key = access.authenticate([("Authorization", f"Bearer {SECRET}")])
    began = time.process_time()
    for _ in range(calls):
        grant = access.admit(key, "sim-model", BODY, stream=stream, route=routes.CHAT, size=90)
        access.settle(grant, USAGE, True)
    return 1e6 * (time.process_time() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu.grant_cpu", description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--instructions", type=int, metavar="N", help="instructions per call over N, counted"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instructions:
        from bench.cpu.hit_cpu import counted_lines, instructions_per_call

        counted = instructions_per_call(Path.cwd(), "bench.cpu.grant_cpu", args.instructions, [])
        print("\n".join(counted_lines({"working tree": counted}, "grant + settlement")))
        return
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-grant-cpu-"))
    keys = write_keys(run_dir, SECRET)
    mc, port = start_memcached(run_dir)
    try:
        backend = MemcachedBackend([("127.0.0.1", port)], name="limits")
        access = Access(KeySource(str(keys)), MemcachedCounters(backend))
        if args.measure:  # counted by --instructions: ``calls`` of them, nothing printed
            per_call_us(access, False, args.calls)
            return
        for stream in (False, True):
            per_call_us(access, stream, 200)  # warm: the windows' counters made
            runs = [per_call_us(access, stream, args.calls) for _ in range(args.rounds)]
            shown = ", ".join(f"{r:.0f}" for r in runs)
            kind = "stream" if stream else "non-stream"
            print(f"{kind}: {min(runs):.0f} us CPU per grant + settlement (runs: {shown})")
    finally:
        mc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
