"""The shape's floor: the gateway's CPU per call against the least any app of its shape costs.

`python -m bench.floor [--kinds stream,non-stream] [--callers 200] [--rounds 3]` runs, in
turns, the gateway's `make run`-shaped stack and the same stack with gunicorn serving
bench/floor/app.py in the gateway's place: nginx → gunicorn (gevent workers) → Flask → one
urllib3 PoolManager per worker → the simulator, relaying the answer and doing nothing else.
Both are measured as bench/cpu/ab.py measures a revision (issue 11's calls, gateway CPU of the
nginx and gunicorn trees from /proc, per answered call, after a warm-up). It prints each
side's mean, what the gateway adds over the floor, and the gateway over the floor against
issue 25's target for that ratio (the report's overhead section checks the same ratio).
`--kinds hit,hit-stream --callers 64` compares cache hits (the floor app
then keeps answers in a dict by the request's bytes). `--memory` gives worker memory per
held stream instead, for both (bench/load/memory.py's measurement, slow streams held in steps up
to 1,500).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from bench.cpu import ab
from bench.cpu.ab import CALLS, Run, measure
from bench.floor import FLOOR_APP
from bench.kit.report import Config
from bench.load import memory
from bench.load.overhead_table import CPU_OVER_FLOOR, KINDS


def summarize(runs: list[Run]) -> list[str]:
    """bench/cpu/ab.py's lines (floor over gateway), then per kind what the gateway adds over
    the floor and the gateway over the floor against issue 25's target for that ratio."""
    lines = ab.summarize(runs, "gateway", "floor")
    for kind in dict.fromkeys(r.kind for r in runs):
        gateway, floor = (
            statistics.fmean(r.cpu_ms for r in runs if r.kind == kind and r.rev == side)
            for side in ("gateway", "floor")
        )
        line = f"{kind:10} the gateway's own work: {gateway - floor:.2f} ms/call"
        line += f" ({(gateway - floor) / gateway * 100:.0f} % of its CPU)"
        if kind in KINDS:  # a hit's target is its rate (bench/load/cache.py), not its CPU
            target = CPU_OVER_FLOOR["gateway"]
            line += f"; gateway {gateway / floor:.2f}x the floor, target ≤ {target:.2f}x"
        lines.append(line)
    return lines


def memory_floor(cfg: Config) -> list[str]:
    """Worker memory per held stream, the gateway's and the floor's (bench/load/memory.py's
    measurement for each: slow streams held in steps up to 1,500), and the difference
    against issue 25's target."""
    sides = {"gateway": memory.measure(cfg), "floor": memory.measure(cfg, wsgi_app=FLOOR_APP)}
    lines = [
        f"memory     {side:8} {held.per_stream:6.1f} KB per held stream "
        f"(marginal {held.marginal(3):.1f})"
        for side, held in sides.items()
    ]
    over = sides["gateway"].per_stream - sides["floor"].per_stream
    lines.append(
        f"memory     gateway - floor {over:.1f} KB per held stream; "
        f"target ≤ {memory.KB_OVER_FLOOR:g} KB"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--kinds", default="stream,non-stream", help=", ".join(CALLS))
    parser.add_argument("--callers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--memory", action="store_true", help="worker memory per held stream instead of CPU"
    )
    args = parser.parse_args()
    if args.memory:
        out = Path(tempfile.mkdtemp(prefix="llmgate-floor-memory-"))
        try:
            print("\n".join(memory_floor(Config(out_dir=out, progress=lambda _: None))))
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return
    kinds = args.kinds.split(",")
    if not set(kinds) <= set(CALLS):
        parser.error(f"kinds are {', '.join(CALLS)}")
    runs: list[Run] = []
    for round_ in range(1, args.rounds + 1):
        for kind in kinds:
            for side, app in (("gateway", ""), ("floor", FLOOR_APP)):
                run = measure(kind, args.callers, CALLS[kind], wsgi_app=app)
                runs.append(Run(side, kind, run.cpu_ms, run.rps, run.errors, run.others))
                print(f"round {round_}: {kind} {side} {run.cpu_ms:.2f} ms/call", flush=True)
    print("\n".join(summarize(runs)))


if __name__ == "__main__":
    main()
