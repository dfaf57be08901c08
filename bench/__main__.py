"""`make bench` / `python -m bench [relay|cache|sse|tracing]`: print the benchmarks' tables."""

import argparse
import threading

from bench import cache, relay, sse, tracing

parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
parser.add_argument("which", nargs="*", help="relay, cache, sse, tracing (default: all)")
parser.add_argument("--requests", type=int, default=2000)
parser.add_argument("--concurrency", type=int, default=16)
parser.add_argument("--streams", type=int, default=1000)
args = parser.parse_args()
KNOWN = ["relay", "cache", "sse", "tracing"]
which = args.which or KNOWN
if set(which) - set(KNOWN):
    parser.error(f"unknown benchmark: {sorted(set(which) - set(KNOWN))}")
threading.stack_size(512 * 1024)
if "relay" in which:
    relay.main(args.requests, args.concurrency, args.streams)
if "cache" in which:
    cache.main(max(100, args.requests // 5), args.concurrency)
if "sse" in which:
    sse.main()
if "tracing" in which:
    tracing.main(args.requests, args.concurrency)
