"""The prompt cache switch on the wire and cached tokens billed once, through the whole stack.

One upstream of each kind, each its own account on one simulator that keeps a prompt cache
per account (simulator/prompt_cache.py), with ``prompt_cache = "auto"``; a gateway key with
budgets and a price table with cache prices. What went on the wire is the simulator's
request log; what each call cost is worked out here from the simulator's own counters (the
words its account's cache read, wrote and computed, and the tokens it generated), never from
the gateway's figures, which must agree: each call's receipt in its log line, the key's
spend and tokens, and ``llmgate_prompt_cache_tokens_total``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3

from simulator.stats import group_of
from tests.support.keys_file import keys_toml
from tests.support.sim import sim_requests, sim_stats
from tests.support.stack import NOWHERE, StackHandle, file_stack

KINDS = {"openai": "oai", "anthropic": "claude", "gemini": "gem"}
BASE = {"openai": "/v1", "anthropic": "/v1", "gemini": "/v1beta"}
ACCOUNT = {kind: group_of(f"sk-{name}") for kind, name in KINDS.items()}
# USD per million tokens: Claude Sonnet's, for every model here.
IN, CACHED, WRITE, WRITE_1H, OUT = 3.0, 0.3, 3.75, 6.0, 15.0
SECRET = "llmg-payer-cache-secret"
MARK = {"type": "ephemeral"}
http = urllib3.PoolManager(retries=False, maxsize=8)


@pytest.fixture(scope="module")
def sim_options() -> tuple[str, ...]:
    return ("--prompt-cache", "--ttft-ms", "0")


def _config(sim_url: str) -> str:
    upstreams = "".join(
        f"""
[[upstreams]]
name = "{name}"
kind = "{kind}"
base_url = "{sim_url}{BASE[kind]}"
key = "sk-{name}"
models = ["m-{kind}"]
prompt_cache = "auto"
headers = {{ "x-sim-cache-min-tokens" = "64" }}
"""
        for kind, name in KINDS.items()
    )
    prices = "".join(
        f"""
[prices.models."m-{kind}"]
input = {IN}
cached_input = {CACHED}
cache_write = {WRITE}
cache_write_1h = {WRITE_1H}
output = {OUT}
"""
        for kind in KINDS
    )
    return upstreams + '\n[prices]\nversion = "cache-prices-1"\n' + prices


@pytest.fixture(scope="module")
def gw(make_stack, tmp_path_factory, upstream_sim) -> StackHandle:
    keys = keys_toml(
        [("payer", "usd_per_day = 1000\ntokens_per_day = 100000000")], lambda name: SECRET
    )
    return file_stack(
        make_stack,
        tmp_path_factory.mktemp("cache-billing"),
        _config(upstream_sim),
        keys=keys,
        workers=1,
        upstream_url=NOWHERE,
    )


def _words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


def _call(gw: StackHandle, door: str, body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """One call by ``door``; its log line."""
    path = "/v1/chat/completions" if door == "chat" else "/v1/messages"
    headers = {"Authorization": f"Bearer {SECRET}", "X-Request-ID": f"r-{id(body)}-{stream}"}
    if door == "messages":
        headers["anthropic-version"] = "2023-06-01"
    resp = gw.post(path, {**body, "stream": stream}, headers=headers)
    assert resp.status == 200, resp.data
    return gw.logged(headers["X-Request-ID"])


def _conversation(door: str, kind: str, seed: str, turns: int) -> dict[str, Any]:
    """A body whose system prompt passes the breakpoints' minimum (800 words, ~1,400 tokens by
    the gateway's estimate), with ``turns`` turns."""
    system, first = _words(800, f"sys-{seed}"), _words(100, f"task-{seed}")
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for i in range(turns - 1):
        messages += [
            {"role": "assistant", "content": _words(5, f"a{i}")},
            {"role": "user", "content": _words(40, f"r{i}-{seed}")},
        ]
    body: dict[str, Any] = {"model": f"m-{kind}", "max_tokens": 5}
    if door == "chat":
        body["messages"] = [{"role": "system", "content": system}, *messages]
    else:
        body |= {"system": system, "messages": messages}
    return body


def _account(sim: str, kind: str) -> dict[str, int]:
    counts = sim_stats(sim)["prompt_cache"].get(ACCOUNT[kind], {})
    return {k: counts.get(k, 0) for k in ("read", "written", "written_1h", "uncached")}


def _cost(parts: dict[str, int], output: int) -> float:
    """USD, from the simulator's counts of one call."""
    five = parts["written"] - parts["written_1h"]
    return (
        parts["uncached"] * IN
        + parts["read"] * CACHED
        + five * WRITE
        + parts["written_1h"] * WRITE_1H
        + output * OUT
    ) / 1e6


def _key_usage(gw: StackHandle) -> dict[str, Any]:
    resp = http.request("GET", gw.url + "/admin/usage")
    assert resp.status == 200, resp.data
    return {k["name"]: k for k in json.loads(resp.data)["keys"]}["payer"]


def _cache_metric(gw: StackHandle, kind: str) -> dict[str, float]:
    name = KINDS[kind]
    return {
        label: gw.metric("llmgate_prompt_cache_tokens_total", upstream=name, kind=label, default=0)
        for label in ("read", "write", "uncached")
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("door", ["chat", "messages"])
def test_cached_usage_is_billed_once_at_its_prices(
    gw: StackHandle, upstream_sim: str, door: str, kind: str, stream: bool
) -> None:
    seed = f"{door}-{kind}-{stream}"
    spent, metric, account = _key_usage(gw), _cache_metric(gw, kind), _account(upstream_sim, kind)
    total_cost, total_tokens = 0.0, 0
    for turns in (1, 2, 3):  # a write (Anthropic's) first, then reads
        before, tokens = _account(upstream_sim, kind), sim_stats(upstream_sim)["tokens"]
        line = _call(gw, door, _conversation(door, kind, seed, turns), stream)
        after = _account(upstream_sim, kind)
        parts = {k: after[k] - before[k] for k in after}
        generated = sim_stats(upstream_sim)["tokens"] - tokens
        prompt = parts["read"] + parts["written"] + parts["uncached"]
        cost = _cost(parts, generated - prompt)
        assert line["upstream"] == KINDS[kind] and line["cost_usd"] == pytest.approx(cost, rel=1e-9)
        assert line["prices_version"] == "cache-prices-1" and line["usage"] is not None
        if turns > 1:
            assert parts["read"] > 0  # the earlier turns' prefix, read back
        if kind == "anthropic" and turns > 1:
            assert parts["written"] > 0  # its breakpoints: each turn writes what it added
        total_cost, total_tokens = total_cost + cost, total_tokens + generated
    now = _key_usage(gw)
    assert now["usd_today"] - spent["usd_today"] == pytest.approx(total_cost, rel=1e-9)
    assert now["tokens_today"] - spent["tokens_today"] == total_tokens  # each token once
    # The metric counts what the account's cache did, token for token.
    counted, seen = _cache_metric(gw, kind), _account(upstream_sim, kind)
    assert {k: counted[k] - metric[k] for k in counted} == {
        "read": seen["read"] - account["read"],
        "write": seen["written"] - account["written"],
        "uncached": seen["uncached"] - account["uncached"],
    }


def test_the_hours_writes_are_billed_at_the_hours_price(gw: StackHandle, upstream_sim: str) -> None:
    """A caller's own one-hour breakpoint, through the chat door (a part's cache_control is
    kept) and relayed by the Messages door: the account's writes are an hour's, and billed so."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    system = _words(800, "hour-sys")
    chat = {
        "model": "m-anthropic",
        "max_tokens": 5,
        "messages": [
            {
                "role": "system",
                "content": [{"type": "text", "text": system, "cache_control": hour}],
            },
            {"role": "user", "content": "go"},
        ],
    }
    messages = {
        "model": "m-anthropic",
        "max_tokens": 5,
        "system": [{"type": "text", "text": system + " more", "cache_control": hour}],
        "messages": [{"role": "user", "content": "go"}],
    }
    for door, body in (("chat", chat), ("messages", messages)):
        for stream, writes in ((False, True), (True, False)):  # a write, then a read
            before, tokens = _account(upstream_sim, "anthropic"), sim_stats(upstream_sim)["tokens"]
            line = _call(gw, door, {**body, "stream": stream}, stream)
            after = _account(upstream_sim, "anthropic")
            parts = {k: after[k] - before[k] for k in after}
            output = (
                sim_stats(upstream_sim)["tokens"]
                - tokens
                - sum(parts[k] for k in ("read", "written", "uncached"))
            )
            if writes:
                assert parts["written_1h"] == parts["written"] >= 800
            else:
                assert parts["read"] >= 800 and parts["written"] == 0
            assert line["cost_usd"] == pytest.approx(_cost(parts, output), rel=1e-9)


def _sent(sim: str) -> dict[str, Any]:
    return sim_requests(sim)[-1]["body"]


def _marks(value: Any, path: str = "$") -> list[str]:
    if isinstance(value, dict):
        here = [path] if "cache_control" in value else []
        return here + [m for k, v in value.items() for m in _marks(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [m for i, v in enumerate(value) for m in _marks(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("door", ["chat", "messages"])
def test_breakpoints_are_placed_only_where_allowed(
    gw: StackHandle, upstream_sim: str, door: str
) -> None:
    body = _conversation(door, "anthropic", f"wire-{door}", 3)
    _call(gw, door, body, False)
    sent = _sent(upstream_sim)
    # The system prompt, and the assistant's turn before the newest user message.
    assert sorted(_marks(sent)) == ["$.messages[3].content[0]", "$.system[0]"]
    # Below the minimum: none.
    short = {**body, "messages": body["messages"][-1:]}
    if door == "chat":
        short["messages"] = [{"role": "system", "content": "brief"}, body["messages"][-1]]
    else:
        short["system"] = "brief"
    _call(gw, door, short, False)
    assert _marks(_sent(upstream_sim)) == []
    # The caller's own: kept as they are, and no other added.
    own = json.loads(json.dumps(body))
    holder = own["messages"][0] if door == "chat" else own
    if door == "chat":
        holder["content"] = [{"type": "text", "text": holder["content"], "cache_control": MARK}]
    else:
        holder["system"] = [{"type": "text", "text": holder["system"], "cache_control": MARK}]
    _call(gw, door, own, False)
    assert _marks(_sent(upstream_sim)) == ["$.system[0]"]


def test_an_openai_upstream_is_sent_the_conversations_key(
    gw: StackHandle, upstream_sim: str
) -> None:
    body = _conversation("chat", "openai", "wire-key", 2)
    _call(gw, "chat", body, False)
    key = _sent(upstream_sim)["prompt_cache_key"]
    assert len(key) == 32 and int(key, 16) >= 0
    _call(gw, "chat", _conversation("chat", "openai", "wire-key", 3), False)
    assert _sent(upstream_sim)["prompt_cache_key"] == key  # the next turn: the same key
    _call(gw, "chat", {**body, "prompt_cache_key": "callers-own"}, False)
    assert _sent(upstream_sim)["prompt_cache_key"] == "callers-own"
    _call(gw, "messages", _conversation("messages", "openai", "wire-key", 2), False)
    assert len(_sent(upstream_sim)["prompt_cache_key"]) == 32  # translated to chat
