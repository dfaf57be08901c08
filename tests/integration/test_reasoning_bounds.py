"""Reasoning calls over Anthropic- and Gemini-kind upstreams keep a key's budget and cap
(issue 41, C): the thinking budget comes out of the caller's bound (or the key's cap), never
on top of it. Through the whole stack (nginx, a gevent worker, the keys file), with one
simulator speaking both dialects.

What the upstream generated is counted by the simulator itself (its ``tokens`` counter adds
up every prompt and answer it made, and it writes as many words as it was asked, 2,000 here,
up to the ``max_tokens`` / ``maxOutputTokens`` it was sent); what it was sent is its own
request log.
"""

from __future__ import annotations

import json

import pytest
import urllib3

from tests.support.bodies import chat_about
from tests.support.keys_file import keys_toml
from tests.support.kinds import kinds_toml
from tests.support.sim import sim_requests, sim_stats
from tests.support.stack import config_stack

KEYS = {
    "day-anthropic": "tokens_per_day = 1000",
    "day-gemini": "tokens_per_day = 1000",
    "capped": "max_tokens = 100\ntokens_per_day = 1000000",
}
WANTED = {"x-sim-tokens": "2000"}  # the answer the simulator would write, uncapped
http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=60))


def secret(name: str) -> str:
    return f"llmg-{name}-reasoning-secret"


@pytest.fixture(scope="module")
def sim_options() -> tuple[str, ...]:
    """This module's simulator writes its answers of 2,000 words at once."""
    return ("--ttft-ms", "0", "--tps", "100000")


@pytest.fixture(scope="module")
def gw(make_stack, tmp_path_factory, upstream_sim):
    keys = keys_toml(KEYS.items(), secret)
    return config_stack(make_stack, tmp_path_factory, kinds_toml(upstream_sim), keys=keys)


def post(gw, key: str, body: dict) -> urllib3.BaseHTTPResponse:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {secret(key)}"}
    return http.request(
        "POST",
        gw.url + "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={**headers, **WANTED},
    )


def _sent_bound(kind: str, body: dict) -> tuple[int | None, int | None]:
    """(the output bound, the thinking budget) an upstream of ``kind`` was sent."""
    if kind == "anthropic":
        return body["max_tokens"], (body.get("thinking") or {}).get("budget_tokens")
    config = body.get("generationConfig", {})
    budget = config.get("thinkingConfig", {}).get("thinkingBudget")
    return config.get("maxOutputTokens"), budget


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_a_daily_budget_holds_for_reasoning_calls(gw, upstream_sim, kind: str) -> None:
    """max_tokens 50 with reasoning_effort high: 50 is all the upstream may generate (before,
    Anthropic was sent 16,434 and wrote 2,000 against a 1,000-token day)."""
    before, answered, sent = sim_stats(upstream_sim)["tokens"], [], []
    for i in range(6):
        body = chat_about(f"Think it through {i}", max_tokens=50, reasoning_effort="high")
        resp = post(gw, f"day-{kind}", {**body, "model": f"m-{kind}"})
        assert resp.status in (200, 429), resp.data
        if resp.status == 200:
            answered.append(json.loads(resp.data)["usage"])
            sent.append(_sent_bound(kind, sim_requests(upstream_sim)[-1]["body"]))
    simulated = sim_stats(upstream_sim)["tokens"] - before
    assert simulated == sum(u["total_tokens"] for u in answered) <= 1000
    assert answered and all(u["completion_tokens"] <= 50 for u in answered)
    assert set(sent) == {(50, None)}  # no room for a thinking budget within 50


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_a_keys_cap_bounds_a_reasoning_call_that_names_none(gw, upstream_sim, kind, effort) -> None:
    """A key capped at max_tokens = 100, a call naming no bound: the upstream is sent 100,
    thinking and all (before, Anthropic was sent 100 + 1,024 and wrote 900 and more)."""
    before = sim_stats(upstream_sim)["tokens"]
    body = chat_about("Reason about it", reasoning_effort=effort)
    resp = post(gw, "capped", {**body, "model": f"m-{kind}"})
    assert resp.status == 200, resp.data
    usage = json.loads(resp.data)["usage"]
    assert sim_stats(upstream_sim)["tokens"] - before == usage["total_tokens"]
    assert usage["completion_tokens"] == 100  # the simulator wrote up to the cap, no more
    assert _sent_bound(kind, sim_requests(upstream_sim)[-1]["body"]) == (100, None)
