"""`make bench` / `python -m bench [relay|cache]`: print the benchmarks' tables."""

import argparse
import threading

from bench import cache, relay

parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
parser.add_argument("which", nargs="*", help="relay, cache (default: both)")
parser.add_argument("--requests", type=int, default=2000)
parser.add_argument("--concurrency", type=int, default=16)
parser.add_argument("--streams", type=int, default=1000)
args = parser.parse_args()
which = args.which or ["relay", "cache"]
if set(which) - {"relay", "cache"}:
    parser.error(f"unknown benchmark: {sorted(set(which) - {'relay', 'cache'})}")
threading.stack_size(512 * 1024)
if "relay" in which:
    relay.main(args.requests, args.concurrency, args.streams)
if "cache" in which:
    cache.main(max(100, args.requests // 5), args.concurrency)
