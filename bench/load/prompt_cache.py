"""Provider prompt caches kept warm (issue 43): an agent-loop workload over three equal
upstreams, routed at random by weight, cache-affine, and to one upstream only.

`python -m bench --only prompt_cache` (about a minute and a half; ``--smoke``: the gateway's
breakpoints only, two sessions of two turns, about ten seconds).
One simulator (`python -m simulator --prompt-cache --prefill-us ...`) plays three accounts of
one provider (the upstreams' keys), each with its own prompt cache; a prompt word it must
compute costs ``PREFILL_US`` before the first token, a word read from the account's cache 2 %
of that (docs/simulator.md). Three upstreams of kind ``anthropic`` with ``prompt_cache =
"auto"``, so the gateway places the breakpoints; the callers speak Chat Completions. Each
routing gets a stack of its own in `make run`'s shape (nginx, gunicorn with 2 gevent workers,
cache off) and a simulator emptied of its caches; the sessions (bench/load/agent_loop.py) run
at once, each turn after turn.

Per routing: the first token's p50 and p95 over every call; the input's cost at Claude
Sonnet's prices (USD per million: 3 input, 0.30 read, 3.75 written for five minutes), from
the simulator's own counts of what each account's cache read, wrote and computed; the share
of the prompt read from a cache; each upstream's share of the calls, by the simulator's
count. The goal figures (issue 43): cache-affine first-token p50 at most 0.5x weighted
random's and within 1.15x one upstream's; its input cost at most 0.4x weighted random's;
each upstream's share within 25 % of its weight.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import urllib3

from bench.kit.loadgen import pct
from bench.kit.report import Cell, Check, Config, Section
from bench.load import agent_loop
from bench.load.agent_loop import Workload
from runner.stack import Stack, StackOptions
from simulator.stats import group_of
from tests.support.sim import sim_stats, start_simulator

# A prompt word computed: 3,300 words a second. A word here (``shared12``) is about three of
# a real tokenizer's tokens: about 10,000 tokens a second, a large model's prefill.
PREFILL_US = 300
SIM = ["--prompt-cache", "--prefill-us", str(PREFILL_US), "--ttft-ms", "20", "--tps", "200"]
NAMES = ("u1", "u2", "u3")
# USD per million tokens (Claude Sonnet): input, read from the cache, written to it.
PRICE_IN, PRICE_READ, PRICE_WRITE = 3.0, 0.30, 3.75
WEIGHTED, AFFINE, ONE = "weighted random", "cache-affine", "one upstream"
EPSILON = 0.25
# The least prefix the simulated provider caches, in its words: about Anthropic's 1,024
# tokens (a word being about three).
MIN_WORDS = 350
# Whose breakpoints: the gateway's (prompt_cache = "auto"), or the agent's own.
GATEWAY, AGENT = "gateway's breakpoints", "agent's own breakpoints"


def workload(smoke: bool) -> Workload:
    if smoke:
        return Workload(
            sessions=2,
            turns=2,
            system_words=700,
            context_words=300,
            result_words=100,
            answer_tokens=5,
        )
    return Workload(
        sessions=48,
        turns=10,
        system_words=1000,
        context_words=2500,
        result_words=250,
        answer_tokens=20,
        tool_s=0.5,
    )


def upstreams_toml(sim_url: str, names: tuple[str, ...]) -> str:
    return "".join(
        f"""
[[upstreams]]
name = "{name}"
kind = "anthropic"
base_url = "{sim_url}/v1"
key = "sk-bench-{name}"
prompt_cache = "auto"
headers = {{ "x-sim-cache-min-tokens" = "{MIN_WORDS}" }}
"""
        for name in names
    )


def measure(
    cfg: Config, run_dir: Path, sim_url: str, routing: str, marks: str, w: Workload
) -> dict[str, Any]:
    """One routing's run, with the gateway's or the agent's breakpoints: its calls, and what
    each account saw."""
    names = NAMES[:1] if routing == ONE else NAMES
    label = f"{routing}-{marks}".replace(" ", "-").replace("'", "")
    config = run_dir / f"{label}.toml"
    config.write_text(upstreams_toml(sim_url, names))
    env = {
        "LLMGATE_CONFIG": str(config),
        "LLMGATE_CACHE_MODE": "off",
        "LLMGATE_ROUTING": "weighted" if routing == WEIGHTED else "affine",
        "LLMGATE_ROUTING_EPSILON": str(EPSILON),
        "LLMGATE_LOG_REQUESTS": "false",
    }
    options = StackOptions(
        run_dir=run_dir / label,
        memcached=False,
        workers=2,
        upstream_url="http://127.0.0.1:9/v1",
        env=env,
    )
    cfg.progress(f"prompt_cache: {routing}, {marks}: {w.sessions} sessions x {w.turns} turns")
    with Stack(options) as stack:
        _reset(sim_url)
        calls = agent_loop.run(stack.url, "claude-sonnet-4-5", replace(w, own_marks=marks == AGENT))
    counts = sim_stats(sim_url)["prompt_cache"]
    accounts = {name: counts.get(group_of(f"sk-bench-{name}"), {}) for name in NAMES}
    return {"calls": calls, "accounts": accounts}


def _reset(sim_url: str) -> None:
    """The simulator's counters zeroed and its accounts' caches emptied."""
    urllib3.PoolManager().request("POST", sim_url + "/sim/reset")


def row(routing: str, marks: str, got: dict[str, Any], baseline: float | None) -> list[Cell]:
    calls, accounts = got["calls"], got["accounts"]
    total = {
        k: sum(a.get(k, 0) for a in accounts.values())
        for k in ("requests", "read", "written", "uncached")
    }
    cost = (
        total["uncached"] * PRICE_IN + total["read"] * PRICE_READ + total["written"] * PRICE_WRITE
    ) / 1e6
    prompt = total["read"] + total["written"] + total["uncached"]
    shares = [accounts[n].get("requests", 0) / max(1, total["requests"]) * 100 for n in NAMES]
    return [
        routing,
        marks,
        len(calls.first_token) + len(calls.errors),
        len(calls.errors),
        pct(calls.first_token, 0.5),
        pct(calls.first_token, 0.95),
        cost,
        cost / baseline if baseline else None,
        total["read"] / prompt if prompt else math.nan,
        *shares,
    ]


COLUMNS = [
    "routing",
    "breakpoints",
    "calls",
    "errors",
    "first token p50 ms",
    "p95 ms",
    "input USD",
    "input x weighted",
    "prompt read",
    "u1 %",
    "u2 %",
    "u3 %",
]
P50, COST, SHARES = 4, 6, 9


def checks(rows: dict[tuple[str, str], list[Cell]], marks: str) -> list[Check]:
    """Issue 43's goal figures, for one way of placing the breakpoints."""
    affine, weighted, one = (rows[(routing, marks)] for routing in (AFFINE, WEIGHTED, ONE))
    p50 = float(affine[P50] or math.nan)
    spread = max(abs(float(s or 0) / (100 / 3) - 1) for s in affine[SHARES:])
    cost = float(affine[COST] or math.nan) / float(weighted[COST] or math.nan)
    return [
        Check(
            f"{marks}: cache-affine first-token p50 over weighted random's",
            "<=",
            0.5,
            p50 / float(weighted[P50] or math.nan),
            "x",
        ),
        Check(
            f"{marks}: cache-affine first-token p50 over one upstream's",
            "<=",
            1.15,
            p50 / float(one[P50] or math.nan),
            "x",
        ),
        Check(f"{marks}: cache-affine input cost over weighted random's", "<=", 0.4, cost, "x"),
        Check(
            f"{marks}: cache-affine, an upstream's share of the calls off its weight",
            "<=",
            0.25,
            spread,
            "x weight",
        ),
    ]


def run(cfg: Config) -> Section:
    w = workload(cfg.smoke)
    # The smoke run (CI) only shows the code paths work: one way of placing the breakpoints.
    ways = (GATEWAY,) if cfg.smoke else (GATEWAY, AGENT)
    run_dir = Path(tempfile.mkdtemp(prefix="llmgate-bench-prompt-cache-"))
    sim = None
    got: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        cfg.progress("prompt_cache: starting the simulator (three accounts' prompt caches)")
        sim, sim_url = start_simulator(run_dir, *SIM)
        for marks in ways:
            for routing in (WEIGHTED, AFFINE, ONE):
                got[(routing, marks)] = measure(cfg, run_dir, sim_url, routing, marks, w)
    finally:
        if sim is not None:
            sim.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    rows: dict[tuple[str, str], list[Cell]] = {}
    for (routing, marks), one in got.items():
        base = row(WEIGHTED, marks, got[(WEIGHTED, marks)], None)[COST]
        rows[(routing, marks)] = row(routing, marks, one, float(base or 0))
    errors = [e for g in got.values() for e in g["calls"].errors][:5]
    settings = {
        "simulator": SIM,
        "cache_min_words": MIN_WORDS,
        "workload": asdict(w),
        "workers": 2,
        "epsilon": EPSILON,
        "prices_usd_per_million": [PRICE_IN, PRICE_READ, PRICE_WRITE],
    }
    return Section(
        key="prompt_cache",
        title=f"Provider prompt caches: an agent loop over three upstreams, {w.sessions} "
        f"sessions x {w.turns} turns",
        columns=COLUMNS,
        rows=list(rows.values()),
        data={"rows": list(rows.values()), "settings": settings, "first_errors": errors},
        checks=[c for marks in ways for c in checks(rows, marks)],
        notes=[
            f"Each session: a system prompt of {w.system_words} words every session shares, a "
            f"task of {w.context_words} words of its own, then {w.turns} streamed turns, each "
            f"adding the answer ({w.answer_tokens} tokens) and a tool result of "
            f"{w.result_words} words, its tool running {w.tool_s} s before the next turn. "
            f"The simulator computes a prompt word in {PREFILL_US} us "
            "(a word is about three tokens) and reads one from an account's prompt cache in "
            "2 % of that; it reads the longest prefix an account still holds that ends at a "
            "block boundary before the request's last breakpoint (Anthropic's look-back).",
            "Three upstreams of kind anthropic, each its own account, prompt_cache = auto. "
            "gateway's breakpoints: the agent places none, the gateway marks the system prompt "
            "and the turn before the newest user message; agent's own breakpoints: the agent "
            "marks its system prompt and its newest message (kept through the translation), "
            "the gateway adds none.",
            "input USD: the prompts' words as the simulator's accounts counted them (read, "
            "written, computed) at Claude Sonnet's prices, a word counted as a token; "
            "prompt read: their share read from a cache. u1-u3 %: each upstream's share of "
            "the calls by the simulator's count (one upstream: u1).",
        ],
        fmt=".2f",
    )
