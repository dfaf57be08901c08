"""Two commits' gateway CPU per call, measured in turns: `python -m bench.ab A B`.

What every "X -> Y ms" of a cut in bench/HISTORY.md comes from. Each revision is exported
with `git archive` into a directory of its own, with this tree's bench/ in place of its own
(``export``), so the measurement is the same for both while the stack (runner/, app/,
gunicorn.conf.py, nginx/) is the revision's. Runs alternate A, B, A, B, ... (``--rounds`` of
each): what else the machine does falls on both. A run starts the revision's `make
run`-shaped stack (2 gevent workers, nginx, the simulator, cache off), warms it up at the
load, then measures the CPU of the nginx and gunicorn trees (/proc) over the kind's
``CALLS`` at ``--callers`` concurrent callers, per answered call.

The calls are issue 11's: a stream of 200 ms to the first token then 50 tokens at 100
tokens/s, and a non-stream answer after 50 ms (cache off); and cache hits (``hit``,
``hit-stream``): one 50-token answer stored by the warm-up, then served from the worker's L1
(no Memcached) to every call; ``stream-resumable``, the stream asking to be resumable
(docs/streams.md) on a stack with Memcached; and ``non-stream-keys``, ``stream-keys``: the
first two with a gateway key whose limits are counted in Memcached (bench/load/compare.py's
"features on": requests and tokens a minute, tokens a day, concurrent streams), limits too
high to refuse anything. Read the result as the mean of each side with
every run listed: on a 2-core VM runs of one tree spread by about ±5 %, so a difference
smaller than that is noise, whatever its sign. Each run also says how much of the cores
other processes used meanwhile (``others``, bench/kit/machine.py): a run beside another
engineer's test suite shows as one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Issue 11's calls, as bench/load/overhead.py's kinds() makes them at full size, and the
# cache's and the keys' kinds beside them.
KINDS = {
    "stream": ({"stream": True, "max_tokens": 50}, {"x-sim-ttft-ms": "200", "x-sim-tps": "100"}),
    "non-stream": ({"max_tokens": 16}, {"x-sim-ttft-ms": "50"}),
    "hit": ({"max_tokens": 50, "temperature": 0}, {"x-sim-ttft-ms": "10"}),
    "hit-stream": ({"stream": True, "max_tokens": 50, "temperature": 0}, {"x-sim-ttft-ms": "10"}),
    # The stream, asking to be resumable (docs/streams.md), on a stack with Memcached and a
    # window: its log written as it passes. A revision without resuming ignores the header.
    "stream-resumable": (
        {"stream": True, "max_tokens": 50},
        {"x-sim-ttft-ms": "200", "x-sim-tps": "100", "X-LLMGate-Resumable": "true"},
    ),
}
# The same calls with a gateway key (the suffix -keys): its limits, counted in Memcached.
KINDS["stream-keys"], KINDS["non-stream-keys"] = KINDS["stream"], KINDS["non-stream"]
KEY_SECRET = "llmg-bench-ab-secret"
KEY_LIMITS = (
    "requests_per_minute = 10000000\ntokens_per_minute = 1000000000\n"
    "tokens_per_day = 1000000000\nmax_streams = 100000\n"
)
# This tree's bench/ (``export`` puts it in each revision's tree).
BENCH = Path(__file__).resolve().parents[1]
CALLS = {"stream": 700, "non-stream": 3000, "hit": 8000, "hit-stream": 6000,
         "stream-resumable": 700, "stream-keys": 700, "non-stream-keys": 3000}  # fmt: skip


@dataclass(frozen=True)
class Run:
    rev: str
    kind: str
    cpu_ms: float  # gateway CPU per answered call
    rps: float
    errors: int
    others: float = 0.0  # the share of all cores other processes used during the run


def measure(
    kind: str, callers: int, calls: int, wsgi_app: str = "", env: dict[str, str] | None = None
) -> Run:
    """One run in this directory's tree (the revision's: `python -m` puts it first on the
    path): its stack, warm-up, measurement. ``wsgi_app``: another app in the gateway's
    place (bench/floor/turns.py; only in a tree whose runner knows the option); ``env``: more of
    the stack's environment."""
    from bench.kit import loadgen, machine, proctree
    from runner.stack import Stack, StackOptions

    fields, headers = KINDS[kind]
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-ab-"))
    cache = "deterministic" if kind.startswith("hit") else "off"
    resumable, keys = kind.endswith("-resumable"), kind.endswith("-keys")
    env = {"LLMGATE_CACHE_MODE": cache, **(env or {})}
    if resumable:
        env["LLMGATE_RESUME_WINDOW_S"] = "30"
    if keys:
        digest = hashlib.sha256(KEY_SECRET.encode()).hexdigest()
        keys_file = run_dir / "keys.toml"
        keys_file.write_text(f'[[keys]]\nname = "ab"\nsha256 = "{digest}"\n{KEY_LIMITS}')
        env["LLMGATE_KEYS_FILE"] = str(keys_file)
        headers = {**headers, "Authorization": f"Bearer {KEY_SECRET}"}
    options = StackOptions(run_dir=run_dir, workers=2, memcached=resumable or keys, env=env)
    if wsgi_app:
        options.wsgi_app = wsgi_app
    stack = Stack(options).start()
    try:
        host, port = stack.url.removeprefix("http://").rsplit(":", 1)
        gateway = [
            p for name in ("nginx", "gunicorn") for p in proctree.tree(stack.proc(name).popen.pid)
        ]
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "ab"}], **fields}
        request = loadgen.request_bytes("/v1/chat/completions", body, headers)
        loadgen.run(host, int(port), request, callers, max(callers * 2, calls // 4))
        ours = [os.getpid()] + [p for proc in stack.procs for p in proctree.tree(proc.popen.pid)]
        before, others = proctree.cpu_s(gateway), machine.Others(ours)
        result = loadgen.run(host, int(port), request, callers, calls)
        cpu = proctree.cpu_s(gateway) - before
        answered = max(1, len(result.total))
        share = others.share()
        return Run("", kind, 1000 * cpu / answered, result.rps, len(result.errors), share)
    finally:
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def summarize(runs: list[Run], a: str, b: str) -> list[str]:
    """Per kind: each side's mean and runs, and B's mean over A's."""
    lines = []
    for kind in dict.fromkeys(r.kind for r in runs):
        means = {}
        for rev in (a, b):
            cpu = [r.cpu_ms for r in runs if r.kind == kind and r.rev == rev]
            errors = sum(r.errors for r in runs if r.kind == kind and r.rev == rev)
            others = [r.others for r in runs if r.kind == kind and r.rev == rev]
            means[rev] = statistics.fmean(cpu) if cpu else float("nan")
            shown = ", ".join(f"{c:.2f}" for c in cpu)
            busy = ", ".join(f"{o * 100:.0f}" for o in others)
            lines.append(
                f"{kind:10} {rev:12} {means[rev]:6.2f} ms/call  [{shown}]  errors {errors}"
                f"  others [{busy}] % of the cores"
            )
        ratio = means[b] / means[a] if means[a] else float("nan")
        lines.append(f"{kind:10} {b} / {a}: {ratio:.3f} ({(ratio - 1) * 100:+.1f} %)")
    return lines


def export(rev: str, into: Path) -> Path:
    """``rev``'s tree in ``into``, with this tree's bench/ in place of its own: every revision
    is measured by the same code (this package, its load generator and /proc readers), and an
    older one whose bench/ was laid out otherwise runs it as well. A tool that measures in
    turns this way (bench/cpu/hit_cpu.py, call_cpu.py) runs in the export as
    ``python -m bench.cpu.<tool> --measure``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    shutil.rmtree(into / "bench", ignore_errors=True)
    skip = shutil.ignore_patterns("results", "__pycache__")
    shutil.copytree(BENCH, into / "bench", ignore=skip)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    parser.add_argument("revs", nargs="*", help="two git revisions, e.g. HEAD~1 HEAD")
    parser.add_argument("--kinds", default="stream,non-stream")
    parser.add_argument("--callers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one run, inside an export
    args = parser.parse_args()
    if args.measure:
        run = measure(args.measure, args.callers, CALLS[args.measure])
        print(json.dumps(run.__dict__))
        return
    if len(args.revs) != 2:
        parser.error("give two revisions")
    a, b = args.revs
    work = Path(tempfile.mkdtemp(prefix="llmgate-ab-trees-"))
    try:
        trees = {rev: export(rev, work / str(i)) for i, rev in enumerate((a, b))}
        runs: list[Run] = []
        for round_ in range(1, args.rounds + 1):
            for kind in args.kinds.split(","):
                for rev in (a, b):
                    out = subprocess.run(
                        [sys.executable, "-m", "bench.cpu.ab", "--measure", kind,
                         "--callers", str(args.callers)],
                        cwd=trees[rev], check=True, capture_output=True, text=True,
                    ).stdout  # fmt: skip
                    run = Run(**{**json.loads(out.splitlines()[-1]), "rev": rev})
                    runs.append(run)
                    print(f"round {round_}: {kind} {rev} {run.cpu_ms:.2f} ms/call, "
                          f"{run.rps:.0f} calls/s, others {run.others * 100:.0f} %",
                          flush=True)  # fmt: skip
        print("\n".join(summarize(runs, a, b)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
