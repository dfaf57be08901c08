"""Translated calls: the gateway workers' CPU per call and per event when the upstream speaks
another dialect than the caller, beside the pass-through's (issue 23).
`python -m bench --only translation` (about 1.5 minutes; ``--smoke`` a few seconds).

One stack in `make run`'s shape (nginx, gunicorn with 2 gevent workers, cache off, no
Memcached) whose upstreams file sends m-openai, m-anthropic and m-gemini to one simulator,
an upstream of each kind (docs/upstreams.md). Every case (bench/cpu/translation_table.py: a
door, a kind, stream or whole, a size) runs from the same load generator (bench/kit/loadgen.py,
``callers`` keep-alive callers), after one warm-up of every case; each case's calls run in
parts (four: the cases in order, in reverse, in order, in reverse), so a drift in the
machine's load falls on all alike. Per case: the growth of utime + stime of gunicorn's
workers and of nginx's tree (bench/kit/proctree.py) less what they use idle, per answered call;
the simulator's calls by dialect (an independent count of where the calls went: a case
whose calls reached another dialect fails the run); the share of the cores other processes
used (bench/kit/machine.py).

Streams are paced (``x-sim-tps``) so that provider events reach a worker apart, as a
model's do, not many to a read; their CPU per call is fitted over the sizes as fixed + per
event.
bench/cpu/translation_split.py then times the pure translators alone over the same streams.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.cpu import translation_split
from bench.cpu.translation_split import chat_request, messages_request
from bench.cpu.translation_table import (
    FIT_COLUMNS,
    MEASURED_COLUMNS,
    Case,
    Cost,
    Line,
    cases,
    extra_us,
    fit_rows,
    lines,
    measured_rows,
    merge,
    share,
)
from bench.kit import loadgen, machine, proctree
from bench.kit.report import Config, Section, table
from bench.load.overhead import idle_rates
from runner.stack import Stack, StackOptions
from tests.support.kinds import kinds_toml
from tests.support.sim import sim_stats, start_simulator


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]  # a stream's tokens (x-sim-tokens), one case per size
    whole_tokens: int  # the tokens of an answer not streamed
    callers: int
    calls: dict[int, int]  # stream tokens -> calls measured per case
    whole_calls: int
    sim: dict[str, str]  # the simulator's pacing, on every call
    split_number: int  # bench/cpu/translation_split.py: streams per timed run
    split_repeat: int  # and runs, the best kept
    parts: int  # each case's calls in this many runs, in order then reversed, and so on


def plan(smoke: bool) -> Plan:
    pace = {"x-sim-ttft-ms": "20", "x-sim-tps": "400"}
    if smoke:
        return Plan((2, 10), 10, 4, {2: 8, 10: 8}, 8, pace, 2, 2, 2)
    # 400 tokens/s: 2.5 ms between events, 16 streams at once is 6,400 events/s in all
    return Plan((10, 50, 200), 50, 16, {10: 480, 50: 320, 200: 160}, 480, pace, 20, 5, 4)


def request(case: Case, pace: dict[str, str]) -> bytes:
    body = chat_request(case.stream) if case.door == "chat" else messages_request(case.stream)
    body["model"] = f"m-{case.kind}"
    headers = {**pace, "x-sim-tokens": str(case.tokens), "anthropic-version": "2023-06-01"}
    return loadgen.request_bytes(case.path, body, headers)


@dataclass(frozen=True)
class Gateway:
    """The stack's processes and addresses, as measured."""

    host: str
    port: int
    sim_url: str
    workers: list[int]  # gunicorn's workers
    nginx: list[int]  # nginx's master and workers
    ours: list[int]  # everything this bench started, itself included
    idle: dict[str, float]  # CPU seconds per second each uses with no call in flight


def measure(gw: Gateway, case: Case, calls: int, p: Plan) -> Cost:
    sent = request(case, p.sim)
    before = sim_stats(gw.sim_url)["requests_by_dialect"]
    workers0, nginx0 = proctree.cpu_s(gw.workers), proctree.cpu_s(gw.nginx)
    others = machine.Others(gw.ours)
    result = loadgen.run(gw.host, gw.port, sent, p.callers, calls)
    share = others.share()
    workers = proctree.cpu_s(gw.workers) - workers0 - gw.idle["workers"] * result.wall
    nginx = proctree.cpu_s(gw.nginx) - nginx0 - gw.idle["nginx"] * result.wall
    after = sim_stats(gw.sim_url)["requests_by_dialect"]
    upstream = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    strays = {k: v for k, v in upstream.items() if v and k != case.kind}
    if strays:
        raise RuntimeError(f"{case}: calls reached {strays}, not only {case.kind}")
    return Cost(case, len(result.total), len(result.errors), workers, nginx, share, upstream)


def launch(run_dir: Path, workers: int = 2) -> tuple[Stack, str]:
    """The simulator, then the stack whose upstreams file routes to it (stopped with it)."""
    sim, sim_url = start_simulator(run_dir)
    config = run_dir / "upstreams.toml"
    config.write_text(kinds_toml(sim_url))
    options = StackOptions(
        run_dir=run_dir / "stack",
        memcached=False,
        workers=workers,
        # No default upstream: a model the file does not route fails, never reaches by chance.
        upstream_url="http://127.0.0.1:9/v1",
        env={"LLMGATE_CONFIG": str(config), "LLMGATE_CACHE_MODE": "off"},
    )
    stack = Stack(options)
    stack.procs.append(sim)  # stopped last, with the stack (also when its start fails)
    return stack.start(), sim_url


def gateway(cfg: Config, stack: Stack, sim_url: str) -> Gateway:
    host, port = stack.url.removeprefix("http://").rsplit(":", 1)
    workers = proctree.children(stack.proc("gunicorn").popen.pid)
    nginx = proctree.tree(stack.proc("nginx").popen.pid)
    ours = [os.getpid()] + [pid for proc in stack.procs for pid in proctree.tree(proc.popen.pid)]
    cfg.progress("translation: measuring the stack's idle CPU")
    idle = idle_rates({"workers": workers, "nginx": nginx}, 1.0 if cfg.smoke else 3.0)
    return Gateway(host, int(port), sim_url, workers, nginx, ours, idle)


def run(cfg: Config) -> list[Section]:
    p = plan(cfg.smoke)
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-translation-"))
    stack: Stack | None = None
    try:
        cfg.progress("translation: starting the simulator, gunicorn (2 workers), nginx")
        stack, sim_url = launch(run_dir)
        gw = gateway(cfg, stack, sim_url)
        todo = cases(p.sizes, p.whole_tokens)
        cfg.progress(f"translation: warming {len(todo)} cases up")
        for case in todo:
            loadgen.run(gw.host, gw.port, request(case, p.sim), p.callers, p.callers * 2)
        parts: dict[Case, list[Cost]] = {case: [] for case in todo}
        for part in range(p.parts):
            for case in todo if part % 2 == 0 else todo[::-1]:
                count = p.calls[case.tokens] if case.stream else p.whole_calls
                cfg.progress(f"translation: {case.label}, part {part + 1} of {p.parts}")
                calls = share(count, p.parts, part)
                parts[case].append(measure(gw, case, calls, p))
        if proctree.children(stack.proc("gunicorn").popen.pid) != gw.workers:
            raise RuntimeError("a gunicorn worker was replaced during the run: its CPU is lost")
        costs = [functools.reduce(merge, parts[case]) for case in todo]
        cfg.progress("translation: timing the translators alone")
        split = translation_split.measure(gw.sim_url, p.sizes, p.split_number, p.split_repeat)
        return sections(cfg, costs, split, p, gw)
    finally:
        if stack is not None:
            stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def sections(
    cfg: Config,
    costs: list[Cost],
    split: dict[tuple[str, str], dict[str, Line]],
    p: Plan,
    gw: Gateway,
) -> list[Section]:
    """The three sections, each also printed as it will read in the report."""
    found = lines(costs)
    out = [measured_section(costs, p, gw), fit_section(found, p)]
    out.append(split_section(split, extra_us(found), p))
    for section in out:
        for line in table(section.columns, section.rows, section.fmt):
            cfg.progress(line)
    return out


def measured_section(costs: list[Cost], p: Plan, gw: Gateway) -> Section:
    settings = {
        "gunicorn_workers": 2,
        "LLMGATE_CACHE_MODE": "off",
        "callers": p.callers,
        "stream_tokens_calls": p.calls,
        "whole_tokens": p.whole_tokens,
        "whole_calls": p.whole_calls,
        "simulator": p.sim,
        "idle_cpu_share": gw.idle,
    }
    return Section(
        key="translation",
        title="Translated calls: the gateway's CPU per call, beside the pass-through's",
        columns=MEASURED_COLUMNS,
        rows=measured_rows(costs),
        data={"settings": settings, "costs": [cost_data(c) for c in costs]},
        notes=[
            "One stack (nginx, 2 gevent workers, cache off), one simulator behind three "
            "upstreams of kinds openai, anthropic and gemini; the door is the caller's route "
            "(chat: /v1/chat/completions, messages: /v1/messages). The pass-through is the "
            "upstream that speaks the door's dialect: its bytes are relayed as they are.",
            "workers CPU ms/call: utime + stime of gunicorn's two workers over the case's calls, "
            "less their idle use, per answered call; x pass-through: over the same call "
            "(door, stream or whole, tokens) to the pass-through upstream. nginx: its master "
            "and workers, the same way.",
            f"Streams are paced at {p.sim['x-sim-tps']} tokens/s after "
            f"{p.sim['x-sim-ttft-ms']} ms, one SSE event per token; {p.callers} keep-alive "
            f"callers; every case once as a warm-up, then its calls in {p.parts} parts, the cases "
            "in order, then reversed, and so on: a drift in the machine's load falls on all.",
            "upstream calls: the simulator's own count by dialect during the case.",
        ],
    )


def fit_section(found: dict[tuple[str, str], Line], p: Plan) -> Section:
    return Section(
        key="translation_fit",
        title="Translated streams: fixed CPU per call and CPU per event",
        columns=FIT_COLUMNS,
        rows=fit_rows(found),
        data={
            "sizes": list(p.sizes),
            "lines": [
                {"door": d, "kind": k, **dataclasses.asdict(v)} for (d, k), v in found.items()
            ],
        },
        notes=[
            "Least squares of the workers' CPU per stream against its tokens over the sizes "
            f"{', '.join(map(str, p.sizes))}: ms/call = fixed + µs/event x tokens / 1000. "
            "A token is one provider event in and one event out; the few framing events every "
            "stream has (start, finish, usage, end) fall in the fixed part.",
            "largest residual: how far the worst size lies from the line, ms per call.",
        ],
    )


def split_section(
    split: dict[tuple[str, str], dict[str, Line]], extra: dict[tuple[str, str], float], p: Plan
) -> Section:
    return Section(
        key="translation_split",
        title="Translated streams: the translators alone, per event",
        columns=translation_split.COLUMNS,
        rows=translation_split.rows(split, extra),
        data={
            "number": p.split_number,
            "repeat": p.split_repeat,
            "lines": [
                {"door": d, "kind": k, "step": step, **dataclasses.asdict(line)}
                for (d, k), steps in split.items()
                for step, line in steps.items()
            ],
        },
        notes=[
            "Each stream the gateway's upstream sends for the call, recorded from the "
            "simulator and fed one event at a time in this process "
            "(bench/cpu/translation_split.py): "
            "CPU µs per event fitted over the same sizes, best of "
            f"{p.split_repeat} runs of {p.split_number} streams.",
            "decode: the SSE decoder alone over the provider's events; + json.loads: with each "
            "event's data parsed; translator: the door's translator (it decodes, parses, builds "
            "and writes the caller's event); reader's decode: the SSE decoder over what the "
            "translator wrote (for a pass-through, over the provider's events), which the "
            "gateway's reader does to every stream.",
            "gateway's extra: the fitted µs/event of the stack's workers less the "
            "pass-through's (the section above); translator %: the translator's µs/event over it.",
        ],
        fmt=".1f",
    )


def cost_data(c: Cost) -> dict:
    return {
        **dataclasses.asdict(c.case),
        "calls": c.calls,
        "errors": c.errors,
        "workers_cpu_s": c.workers_s,
        "nginx_cpu_s": c.nginx_s,
        "workers_ms_per_call": c.workers_ms,
        "others_cores_share": c.others,
        "upstream_calls": c.upstream,
    }
