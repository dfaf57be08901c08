"""What the continuation tests share (tests/integration/test_stream_continuation.py, the chat
door's, and test_messages_continuation.py, the /v1/messages door's): a plan of three
simulators of one kind, the cut each test makes, and the independent counts they read (the
simulators' own, the key's Memcached counter, the gateway's metrics). No pytest here.

The plan: ``first`` and ``second`` continue (``prefix`` for an OpenAI-kind upstream, a
``prefill`` for an Anthropic one, a ``model_turn`` for a Gemini one, or the mode given);
``plain``, between them by priority, has ``continuation = "off"`` (an Anthropic or Gemini
kind's default continues), and is never asked for a continuation. ``first`` fails once (its
``fail_times``), ``second`` never.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import urllib3

from tests.support.keys_file import keys_toml
from tests.support.sim import sim_requests, sim_stats, start_simulator
from tests.support.stack import NOWHERE, file_stack

http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=30))
TOKENS = 12
MAX_TOKENS = 40  # the caller's bound: what a call reserves for its output
# One call reserves its prompt's bound and MAX_TOKENS (247 tokens, measured): ``tight`` has
# room for one such reservation, not two.
TIGHT = 400
# How each kind of upstream continues (docs/streams.md).
MODES = {"openai": "prefix", "anthropic": "prefill", "gemini": "model_turn"}
IDLE_S = 1  # a stall (the simulator's stall-after) past it is a cut
# Every test cuts ``first`` once: more than half of its calls fail, and its breaker opens
# (app/upstream/breaker.py), which would send the next call to ``plain``. A breaker that
# opens for a millisecond lets that call probe ``first`` again.
ENV = {
    "LLMGATE_IDLE_TIMEOUT_S": str(IDLE_S),
    "LLMGATE_BREAKER_COOLDOWN_S": "0.001",
    "LLMGATE_BREAKER_COOLDOWN_MAX_S": "0.001",
}
KEYS = {"meter": "tokens_per_day = 100000000", "tight": f"tokens_per_day = {TIGHT}"}
# The cuts a simulator makes: a reset, its own error event, an idle stall, a clean end
# without the stream's end mark, a garbled event.
FAULTS = ["reset", "error-after", "stall-after", "end-after", "malformed-after"]


def secret(name: str) -> str:
    return f"llmg-{name}-continue-secret"


def upstreams(
    sims: dict[str, str],
    kind: str = "openai",
    mode: str | None = None,
    plain: tuple[str, int] = ("m", 0),
) -> str:
    """``first``, ``plain`` and ``second``, of ``kind``; all but ``plain`` continue (as
    ``mode`` says, else as the kind does by its own way). ``first`` fails once; ``plain``
    serves the model ``plain[0]`` and fails ``plain[1]`` times."""
    mode = mode or MODES[kind]
    root = "/v1beta" if kind == "gemini" else "/v1"
    tables = [
        ("first", "m", 0, mode, 1),
        ("plain", plain[0], 1, "off", plain[1]),  # not its kind's default: never continued
        ("second", "m", 2, mode, 0),
    ]
    return "".join(
        f"""
[[upstreams]]
name = "{name}"
kind = "{kind}"
base_url = "{sims[name]}{root}"
models = ["{model}"]
priority = {priority}
continuation = "{continues}"
headers = {{ "x-sim-fail-times" = "{fails}" }}
"""
        for name, model, priority, continues, fails in tables
    )


def keyed_stack(make_stack, tmp_path_factory, name: str, plan: str, **env: str):
    """A gateway of one worker on the upstreams file ``plan``, with the continuation tests'
    keys (``KEYS``) and settings (``ENV``, ``env`` over them), in a folder named ``name``."""
    return file_stack(
        make_stack,
        tmp_path_factory.mktemp(name),
        plan,
        keys=keys_toml(KEYS.items(), secret),
        env={**ENV, **env},
        workers=1,
        upstream_url=NOWHERE,
    )


def reset(sims: dict[str, str]) -> None:
    for url in sims.values():
        http.request("POST", url + "/sim/reset")


def cut_once(fault: str, after: int = 4) -> dict[str, str]:
    """A cut by ``fault`` after ``after`` tokens, which only ``first`` makes, once (its
    upstream table's ``x-sim-fail-times``, which wins over the caller's headers)."""
    return {
        "fault": fault,
        "reset-after": str(after),
        "error-after": str(after),
        "stall-after": str(after),  # error-after's slot is malformed-after's too
        "fail-key": uuid.uuid4().hex,
    }


def charged(gw, key: str) -> int:
    """The tokens counted against ``key`` today (its Memcached counter, /admin/usage)."""
    resp = http.request("GET", gw.url + "/admin/usage")
    return {k["name"]: k for k in json.loads(resp.data)["keys"]}[key]["tokens_today"] or 0


def continuations(gw, outcome: str, upstream: str = "first") -> float:
    name = "llmgate_stream_continuations_total"
    return gw.metric(name, default=0.0, upstream=upstream, outcome=outcome)


def asked(sims: dict[str, str]) -> dict[str, int]:
    """Each simulator's own count of the calls it answered."""
    return {name: sim_stats(url)["requests"] for name, url in sims.items()}


def continued_turn(sims: dict[str, str], kind: str = "openai") -> str:
    """The answer so far as ``second`` was asked to continue it (its own request log): a
    ``prefix`` turn, or an Anthropic prefill (the last turn, an assistant's)."""
    turn = sim_requests(sims["second"])[0]["body"]["messages"][-1]
    assert turn["role"] == "assistant" and (kind != "openai" or turn["prefix"] is True), turn
    content = turn["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


def three_sims(logs: Path) -> Iterator[dict[str, str]]:
    """``first``, ``second`` and ``plain`` running (a module fixture yields from it): their
    URLs, by name; stopped when it resumes."""
    procs = {
        name: start_simulator(logs, "--ttft-ms", "0", "--tps", "500")
        for name in ("first", "second", "plain")
    }
    yield {name: url for name, (_, url) in procs.items()}
    for proc, _ in procs.values():
        proc.stop()
