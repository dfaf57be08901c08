"""Non-stream latency with traces off and on, whatever the collector does, and how sure the
difference is.

Four stacks side by side, each nginx -> gunicorn (2 gevent workers) -> its simulator
(answering at once), no Memcached, the same non-stream chat call through each:

    off          LLMGATE_OTEL_ENDPOINT unset
    collector    every span exported to an OTLP/HTTP receiver on loopback, in a process of
                 its own that parses what it got only at the end (a real collector runs
                 elsewhere, not on the two cores of the gateway it would slow)
    black hole   a collector that accepts connections, reads and never answers
    none         a port nobody listens on (each export is refused)

The exporter's defaults apply (a batch every 5 s or at 512 spans, 2,048 queued at most,
10 s per export). bench/kit/loadgen.py's callers (raw sockets, one keep-alive connection each,
the next call as soon as the last answer ended) send the calls, four at a time: about two
per worker, so that what holds a worker (a garbage collection, a wait for the GIL) holds a
call or two, and shows in the tail instead of hiding behind the queueing of a busier load.

What is compared is each setup's p99.9 minus off's, with a 95 % interval
(bench/tracing/tail_stats.py):
- rounds of 50 calls go through the four stacks in turn (a *rotation*, a fraction of a
  second), so that what else the machine does falls on all four alike. The rotations take
  the 24 orders of the four in turn, shuffled (``orders``): each stack follows each other one
  as often. In a fixed cycle one stack always came right after the collector's and took the
  CPU of its exports (a batch of 512 spans encoded and sent when it filled, or on the 5 s
  schedule, spilling over into the next round): with the black hole there, +2.5 ms at p99.9
  over off, with off there -0.1 ms, the same code. The collector's own figure is therefore
  low: part of what its exports cost lands on the others, alike;
- a rotation during which other processes used more than ``QUIET`` of the cores is left out
  of all four (the tail measured is the gateway's, not a neighbour's test run); how many
  were kept is reported, and the black hole's figure over every rotation too;
- the stacks are started afresh for each of several *sessions* (what one set of processes
  happens to be stays with it for its life), and the bootstrap resamples sessions, then
  blocks of rotations within each.
Each session measures for a fixed time, so the run's length is known (about 5 minutes) and
its number of calls is not. The smoke run (`make bench-smoke`) takes one short session and
keeps every rotation.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.kit import loadgen, machine, proctree
from bench.kit.report import Cell, Config, Section
from bench.tracing.tail_stats import Interval, Rotation, difference, quantile
from runner.procs import free_port
from runner.stack import Stack, StackOptions
from tests.support.otlp import BlackHole

SETUPS = ("off", "collector", "black hole", "none")
COLUMNS = ["setup", "calls", "errors", "p50", "p99", "p99.9", "max", "+p99.9", "low", "high",
           "spans exported", "spans dropped"]  # fmt: skip
CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "bench"}], "max_tokens": 16}
DROPPED = "llmgate_trace_spans_dropped_total"
QUIET = 0.10  # at most this share of all cores used by other processes during a rotation
TARGET_MS = 2.0  # issue 20: the black hole's p99.9 at most this much above off's
# The receiver, in a process of its own: prints its URL, then a span count per line read.
SINK = """
import sys
from tests.support.otlp import OtlpReceiver
with OtlpReceiver(keep=False) as sink:
    print(sink.url, flush=True)
    for _ in sys.stdin:
        print(sink.span_count, flush=True)
"""


def sizes(smoke: bool) -> dict[str, float]:
    if smoke:
        return {"callers": 2, "sessions": 1, "session_s": 0, "min_rotations": 3, "per_round": 20,
                "warm": 20, "quiet": 1.0, "block": 10, "resamples": 100}  # fmt: skip
    # About 5 minutes in all (the whole report stays under 15): a session's stacks, warm-up,
    # last batch and exit take ~25 s beside its 50 s of rotations.
    return {"callers": 4, "sessions": 4, "session_s": 50, "min_rotations": 0, "per_round": 50,
            "warm": 500, "quiet": QUIET, "block": 10, "resamples": 1000}  # fmt: skip


class Sink:
    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-c", SINK], cwd=root, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.url = self.proc.stdout.readline().strip()

    def spans(self) -> int:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def dropped(stack: Stack) -> int:
    """The stack's dropped spans, from its /metrics (0: no such metric yet)."""
    with urllib.request.urlopen(stack.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == DROPPED
    ]
    return round(sum(found))


class Runs:
    """Every session's rotations, the share of the cores other processes used during each,
    and the counts beside the latencies."""

    def __init__(self) -> None:
        self.sessions: list[list[Rotation]] = []
        self.others: list[list[float]] = []
        self.errors: dict[str, int] = dict.fromkeys(SETUPS, 0)
        self.dropped: dict[str, int] = dict.fromkeys(SETUPS, 0)
        self.calls: dict[str, int] = dict.fromkeys(SETUPS, 0)  # warm-ups included
        self.exported = 0  # by the collector's stack, warm-ups included

    def kept(self, quiet: float) -> list[list[Rotation]]:
        return [
            [r for r, share in zip(rotations, others, strict=True) if share <= quiet]
            for rotations, others in zip(self.sessions, self.others, strict=True)
        ]


def orders(rng: random.Random) -> Iterator[tuple[str, ...]]:
    """The order of each rotation: the 24 orders of the setups, shuffled, again and again.
    Within each 24, every setup comes right after every other one six times."""
    every = list(itertools.permutations(SETUPS))
    while True:
        rng.shuffle(every)
        yield from every


def run(cfg: Config) -> Section:
    size = sizes(cfg.smoke)
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-trace-"))
    sink, hole = Sink(), BlackHole().__enter__()
    runs = Runs()
    try:
        for index in range(int(size["sessions"])):
            session(cfg, size, runs, run_dir / f"session-{index}", (sink, hole.url), index)
        return section(size, runs)
    finally:
        hole.__exit__(None, None, None)
        sink.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def session(
    cfg: Config, size: dict[str, float], runs: Runs, run_dir: Path, sinks: tuple[Sink, str],
    index: int,
) -> None:  # fmt: skip
    """Fresh stacks, warmed up, then rotations until the session's time is up."""
    sink, hole_url = sinks
    endpoints = {"off": "", "collector": sink.url, "black hole": hole_url,
                 "none": f"http://127.0.0.1:{free_port()}/v1/traces"}  # fmt: skip
    stacks: dict[str, Stack] = {}
    try:
        cfg.progress(f"trace_latency: session {index + 1} of {size['sessions']:.0f}, 4 stacks")
        for setup in SETUPS[index % 4 :] + SETUPS[: index % 4]:  # start order rotates too
            env = {"LLMGATE_OTEL_ENDPOINT": endpoints[setup]} if endpoints[setup] else {}
            options = StackOptions(
                run_dir=run_dir / setup.replace(" ", "-"),
                memcached=False,
                workers=2,
                env={**env, "LLMGATE_HEARTBEAT_S": "0"},
                simulator_args=["--ttft-ms", "0"],
            )
            stacks[setup] = Stack(options).start()
        procs = [proc.popen.pid for stack in stacks.values() for proc in stack.procs]
        ours = [os.getpid(), sink.proc.pid, *[pid for p in procs for pid in proctree.tree(p)]]
        request = loadgen.request_bytes("/v1/chat/completions", CALL)
        address = {s: stacks[s].url.removeprefix("http://").split(":") for s in SETUPS}
        spans_before = sink.spans()
        for setup in SETUPS:  # pools, imports, the first batches
            loadgen.run(address[setup][0], int(address[setup][1]), request,
                        int(size["callers"]), int(size["warm"]))  # fmt: skip
            runs.calls[setup] += int(size["warm"])
        rotations: list[Rotation] = []
        others: list[float] = []
        ends = time.monotonic() + size["session_s"]
        turns = orders(random.Random(index))
        while len(rotations) < size["min_rotations"] or time.monotonic() < ends:
            order = next(turns)
            busy = machine.Others(ours)
            rotation: Rotation = {}
            for setup in order:
                got = loadgen.run(address[setup][0], int(address[setup][1]), request,
                                  int(size["callers"]), int(size["per_round"]))  # fmt: skip
                rotation[setup] = got.total
                runs.errors[setup] += len(got.errors)
                runs.calls[setup] += len(got.total) + len(got.errors)
            rotations.append(rotation)
            others.append(busy.share())
        if not cfg.smoke:
            time.sleep(6)  # the last batch leaves within the 5 s schedule
        runs.sessions.append(rotations)
        runs.others.append(others)
        runs.exported += sink.spans() - spans_before
        for setup in SETUPS:
            runs.dropped[setup] += dropped(stacks[setup])
    finally:
        # In parallel: a worker of the black hole's or the refused stack waits 5 s at exit.
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(Stack.stop, stacks.values()))


def section(size: dict[str, float], runs: Runs) -> Section:
    kept = runs.kept(size["quiet"])
    total = sum(len(s) for s in runs.sessions)
    quiet = sum(len(s) for s in kept)
    shares = [share for o in runs.others for share in o]
    kept_shares = [share for share in shares if share <= size["quiet"]]
    rows: list[list[Cell]] = []
    data: dict = {"settings": {**size, "workers": 2, "simulator": "--ttft-ms 0",
                               "rotations": total, "rotations kept": quiet,
                               "others % cores, kept": round(_mean(kept_shares) * 100, 1),
                               "others % cores, all": round(_mean(shares) * 100, 1)}}  # fmt: skip
    verdict = "no black hole row"
    for setup in SETUPS:
        samples = [t for s in kept for r in s for t in r[setup]]
        row: list[Cell] = [setup, len(samples), runs.errors[setup], quantile(samples, 0.5),
                           quantile(samples, 0.99), quantile(samples, 0.999),
                           max(samples) * 1000 if samples else math.nan]  # fmt: skip
        if setup == "off":
            row += [None, None, None]
        else:
            got = difference(kept, setup, "off", block=int(size["block"]),
                             resamples=int(size["resamples"]))  # fmt: skip
            row += [got.point, got.low, got.high]
            if setup == "black hole":
                verdict = _verdict(got.low, got.high, size["quiet"] < 1)
        row += [runs.exported if setup == "collector" else None, runs.dropped[setup]]
        rows.append(row)
        data[setup] = dict(zip(COLUMNS[1:], row[1:], strict=True))
    everything = difference(runs.sessions, "black hole", "off", block=int(size["block"]),
                            resamples=int(size["resamples"]))  # fmt: skip
    data["black hole, every rotation"] = vars(everything)
    data["black hole, each session"] = [_excess(s, "black hole") for s in kept]
    data["verdict"] = verdict
    return Section(
        key="trace_latency",
        title="Tracing: non-stream latency with the collector working, black-holed or absent",
        columns=COLUMNS,
        rows=rows,
        data=data,
        notes=_notes(size, (quiet, total), verdict, everything, runs.calls["collector"]),
    )


def _excess(rotations: list[Rotation], setup: str) -> float:
    """``setup``'s p99.9 minus off's over ``rotations``."""
    p999 = [quantile([t for r in rotations for t in r[s]], 0.999) for s in (setup, "off")]
    return p999[0] - p999[1]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _verdict(low: float, high: float, judged: bool) -> str:
    if not judged:
        return "not judged (the smoke run's sizes mean nothing)"
    if high <= TARGET_MS:
        return "met: the whole interval is at most 2 ms"
    if low > TARGET_MS:
        return "not met: the whole interval is above 2 ms"
    return "undecided: the interval holds 2 ms"


def _notes(
    size: dict[str, float], kept: tuple[int, int], verdict: str, everything: Interval, calls: int
) -> list[str]:
    quiet, total = kept
    point, low, high = everything.point, everything.low, everything.high
    return [
        "Latency in ms, from the request's first byte sent to the answer's last byte read, "
        f"{size['callers']:.0f} callers in a closed loop through nginx and gunicorn (2 workers), "
        "the simulator answering at once.",
        f"Rotations kept: {quiet} of {total} (those during which other processes used at most "
        f"{size['quiet']:.0%} of the cores); every number of the table is over them. "
        f"{size['sessions']:.0f} session(s) of fresh stacks.",
        "+p99.9: the setup's p99.9 minus off's; low, high: its 95 % interval (bootstrap over "
        "sessions, then blocks of rotations, paired: bench/tracing/tail_stats.py).",
        f"Issue 20's target, the black hole's +p99.9 at most {TARGET_MS:g} ms: {verdict}. "
        f"Over every rotation, noisy ones too: {point:+.2f} ms [{low:+.2f}, {high:+.2f}].",
        "Spans exported: what the receiver took, of two per call made (warm-ups included: "
        f"{2 * calls:,}); dropped: llmgate_trace_spans_dropped_total (the black hole and "
        "the refused port take none: their queues stay full).",
    ]
