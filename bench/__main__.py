"""`make bench` / `python -m bench`: the benchmark report.

The report (bench/kit/report.py has the contract) runs every module of ``report.MODULES``
(``--only`` names some) and writes bench/results/<date>/report.md, results.json and the PNG
plots. With ``--smoke`` (`make bench-smoke`, CI) it runs the same code at tiny sizes and exits
1 unless every module gave sections with rows and finite numbers. Speed is never checked.
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

from bench.kit import machine, report

RESULTS = Path(__file__).resolve().parent / "results"

parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
parser.add_argument("--smoke", action="store_true", help="tiny sizes; check the report is whole")
parser.add_argument(
    "--only", default="", help=f"report parts to run, comma-separated: {', '.join(report.MODULES)}"
)
parser.add_argument("--out", type=Path, help="the report's directory (bench/results/<date>)")
args = parser.parse_args()
modules = [m for m in args.only.split(",") if m] or list(report.MODULES)
if unknown := [m for m in modules if m not in report.MODULES]:
    parser.error(f"no such part: {', '.join(unknown)} (the parts: {', '.join(report.MODULES)})")
threading.stack_size(512 * 1024)


def run_part(module: str, cfg: report.Config) -> report.Part:
    part = report.Part(module)
    path = report.MODULES[module]
    try:
        mod = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name != path:
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
