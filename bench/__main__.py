"""`make bench` / `python -m bench`: the benchmark report; `python -m bench relay|cache|sse|
tracing`: one of the older benchmarks' printed tables.

The report (bench/report.py has the contract) runs every module of ``report.MODULES`` that
exists and writes bench/results/<date>/report.md, results.json and the PNG plots. With
``--smoke`` (`make bench-smoke`, CI) it runs the same code at tiny sizes and exits 1 unless
every module that exists gave sections with rows and finite numbers. Speed is never checked.
"""

import argparse
import importlib
import json
import math
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import cache, machine, relay, report, sse, tracing

RESULTS = Path(__file__).resolve().parent / "results"
OLD = ["relay", "cache", "sse", "tracing"]

parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
parser.add_argument("which", nargs="*", help="relay, cache, sse, tracing (default: the report)")
parser.add_argument("--smoke", action="store_true", help="tiny sizes; check the report is whole")
parser.add_argument("--only", default="", help="report modules to run, comma-separated")
parser.add_argument("--out", type=Path, help="the report's directory (bench/results/<date>)")
parser.add_argument("--requests", type=int, default=2000)
parser.add_argument("--concurrency", type=int, default=16)
parser.add_argument("--streams", type=int, default=1000)
args = parser.parse_args()
if set(args.which) - set(OLD):
    parser.error(f"unknown benchmark: {sorted(set(args.which) - set(OLD))}")
threading.stack_size(512 * 1024)
if "relay" in args.which:
    relay.main(args.requests, args.concurrency, args.streams)
if "cache" in args.which:
    cache.main(max(100, args.requests // 5), args.concurrency)
if "sse" in args.which:
    sse.main()
if "tracing" in args.which:
    tracing.main(args.requests, args.concurrency)
if args.which:
    sys.exit(0)


def run_part(module: str, cfg: report.Config) -> report.Part:
    part = report.Part(module)
    try:
        mod = importlib.import_module(f"bench.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"bench.{module}":
            raise
        part.absent = True
        return part
    if not hasattr(mod, "run"):  # a module of that name that is not a report part yet
        part.absent = True
        return part
    started = time.monotonic()
    try:
        got = mod.run(cfg)
        part.sections = got if isinstance(got, list) else [got]
    except Exception:  # the report says what failed and goes on
        part.error = traceback.format_exc(limit=-4).strip()
        cfg.progress(f"{module}: FAILED: {part.error.splitlines()[-1]}")
    part.seconds = time.monotonic() - started
    return part


def finite(value: object) -> object:
    """JSON has no NaN: a non-finite float is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


began = time.monotonic()
stamp = datetime.now().astimezone()
out = args.out or RESULTS / (stamp.strftime("%Y-%m-%d_%H%M%S") + ("-smoke" if args.smoke else ""))
out.mkdir(parents=True, exist_ok=True)


def progress(line: str) -> None:
    print(f"[{time.monotonic() - began:5.0f} s] {line}", flush=True)


modules = [m for m in args.only.split(",") if m] or list(report.MODULES)
progress(f"bench: report into {out}; modules {', '.join(modules)}")
before = machine.busy(1.0)
meta: dict[str, Any] = {
    "started": stamp.isoformat(timespec="seconds"),
    "command": " ".join(["python -m bench", *sys.argv[1:]]),
    "machine": machine.machine(),
    "versions": machine.versions(),
}
cfg = report.Config(out_dir=out, smoke=args.smoke, progress=progress)
parts = [run_part(m, cfg) for m in modules]
after = machine.busy(1.0)
meta["seconds"] = time.monotonic() - began
meta["settings"] = {"smoke": args.smoke, "modules": "+".join(modules)}
meta["noise"] = (
    f"Before the run the machine's cores were {before:.0%} busy, after it {after:.0%} (other "
    "processes: anything above 0 % means the numbers are noisy)."
)
(out / "report.md").write_text(report.markdown(parts, meta))
(out / "results.json").write_text(json.dumps(finite(report.as_json(parts, meta)), indent=1))
latest = RESULTS / ("latest-smoke" if args.smoke else "latest")
if out.parent == RESULTS:
    latest.unlink(missing_ok=True)
    latest.symlink_to(out.name)
progress(f"bench: wrote {out / 'report.md'}, results.json and the plots")
checks = [c for part in parts for s in part.sections for c in s.checks]
if checks:
    print("\n".join(["", *report.verdicts(checks), ""]))
found = report.problems(parts, out)
written = json.loads((out / "results.json").read_text())["sections"]
found += [
    f"{s.key}: not in results.json" for p in parts for s in p.sections if s.key not in written
]
for problem in found:
    progress(f"bench: PROBLEM: {problem}")
sys.exit(1 if found and args.smoke else 0)
