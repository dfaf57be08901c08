"""`python -m bench.tracing`: tracing's CPU per call, off, on and 1 trace in 10
(bench/tracing/cost.py; its figures are in docs/observability.md, "What it costs")."""

import argparse

from bench.tracing import cost

parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=cost.__doc__)
parser.add_argument("--requests", type=int, default=2000, help="calls of each kind per gateway")
parser.add_argument("--concurrency", type=int, default=16)
parser.add_argument("--rounds", type=int, default=4, help="alternating rounds")
args = parser.parse_args()
cost.main(args.requests, args.concurrency, args.rounds)
