"""What carries over to other kinds of upstream: failover from one provider to another (never
after the first byte), a key's token accounting from the translated usage, and the cache
storing a translated answer and replaying it in the caller's dialect. Totals are compared with
the simulator's own counts and the scripts' usage (simulator/scripts.py)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import urllib3

from tests.support.keys_file import keys_toml
from tests.support.kinds import KINDS, kinds_toml
from tests.support.sim import sim_requests, sim_stats
from tests.support.stack import NOWHERE, UPSTREAM, config_stack, file_stack

MESSAGES: Any = [{"role": "user", "content": "hi"}]
http = urllib3.PoolManager(retries=False)


def _dialects(url: str) -> dict[str, int]:
    counts = sim_stats(url)["requests_by_dialect"]
    return {kind: counts.get(kind, 0) for kind in KINDS}


def _since(url: str, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in _dialects(url).items()}


# -- failover across kinds ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def failover_gw(make_stack, tmp_path_factory, upstream_sim):
    """Claude first: "m" reaches it as a model that answers 529, "m-cut" as one whose stream
    breaks with an overload after its first words; an OpenAI upstream second for both.
    Claude's continuation is off (its kind's default continues a broken stream): these tests
    hold what failover does and does not do; continuation's are test_stream_continuation*."""
    toml = f"""
[[upstreams]]
name = "claude"
kind = "anthropic"
base_url = "{upstream_sim}/v1"
models = ["m", "m-cut"]
priority = 0
continuation = "off"
aliases = {{ "m" = "sim/fault=529", "m-cut" = "sim/script=overload" }}

[[upstreams]]
name = "oai"
base_url = "{upstream_sim}/v1"
models = ["m", "m-cut"]
priority = 1
"""
    return config_stack(make_stack, tmp_path_factory, toml, LLMGATE_BREAKER_FAILURES="100")


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_529_fails_over_to_openai_with_one_attempt_each(
    failover_gw, upstream_sim, stream
) -> None:
    before = _dialects(upstream_sim)
    resp = failover_gw.post("/v1/chat/completions", {"model": "m", "messages": MESSAGES,
                                                      "stream": stream})  # fmt: skip
    assert resp.status == 200 and resp.headers[UPSTREAM] == "oai"
    assert b"[DONE]" in resp.data if stream else json.loads(resp.data)["choices"]
    assert _since(upstream_sim, before) == {"openai": 1, "anthropic": 1, "gemini": 0}


def test_on_the_messages_door_an_anthropic_529_fails_over_too(failover_gw, upstream_sim) -> None:
    """There the Anthropic upstream's answer is relayed as it is: its 529 stays a 529, and
    is an overload the next upstream may take all the same."""
    before = _dialects(upstream_sim)
    resp = failover_gw.post(
        "/v1/messages", {"model": "m", "max_tokens": 20, "messages": MESSAGES},
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
    )  # fmt: skip
    assert resp.status == 200 and resp.headers[UPSTREAM] == "oai"
    assert json.loads(resp.data)["type"] == "message"
    assert _since(upstream_sim, before) == {"openai": 1, "anthropic": 1, "gemini": 0}


@pytest.mark.parametrize("stream", [False, True])
def test_a_field_the_first_kind_cannot_carry_goes_to_the_next_upstream(
    failover_gw, upstream_sim, stream
) -> None:
    """``n=2`` is refused by the Anthropic upstream's translation before anything is sent
    (``unsupported_by_upstream``); the OpenAI upstream after it takes the call as it is."""
    before = _dialects(upstream_sim)
    resp = failover_gw.post("/v1/chat/completions", {"model": "m", "messages": MESSAGES,
                                                      "n": 2, "stream": stream})  # fmt: skip
    assert resp.status == 200 and resp.headers[UPSTREAM] == "oai", resp.data
    assert b"[DONE]" in resp.data if stream else json.loads(resp.data)["choices"]
    assert _since(upstream_sim, before) == {"openai": 1, "anthropic": 0, "gemini": 0}
    assert sim_requests(upstream_sim)[-1]["body"]["n"] == 2


def test_no_failover_after_the_first_byte(failover_gw, upstream_sim) -> None:
    failed = failover_gw.metric(
        "llmgate_upstream_attempts_total", default=0.0, upstream="claude", result="failed"
    )
    before = _dialects(upstream_sim)
    resp = failover_gw.post(
        "/v1/chat/completions", {"model": "m-cut", "messages": MESSAGES, "stream": True}
    )
    assert resp.status == 200 and resp.headers[UPSTREAM] == "claude"
    events = [e for e in resp.data.split(b"\n\n") if e.startswith(b"data: ")]
    assert b'"content":"Working"' in events[1]
    assert json.loads(events[-1][6:])["error"]["message"] == "Overloaded"
    assert b"[DONE]" not in resp.data
    assert _since(upstream_sim, before) == {"openai": 0, "anthropic": 1, "gemini": 0}
    # The overload after the 200 is the upstream's failure: its breaker hears of it.
    assert (
        failover_gw.metric(
            "llmgate_upstream_attempts_total", default=0.0, upstream="claude", result="failed"
        )
        == failed + 1
    )


# -- keys count the translated usage; the cache keeps the translated answer ---------------------
SECRET = "llmg-carry-secret"


@pytest.fixture(scope="module")
def keyed_gw(make_stack, tmp_path_factory, upstream_sim):
    return file_stack(
        make_stack, tmp_path_factory.mktemp("carry-keys"), kinds_toml(upstream_sim),
        keys=keys_toml([("team", "")], lambda _: SECRET), env={"LLMGATE_CACHE_MODE": "all"},
        workers=1, upstream_url=NOWHERE,
    )  # fmt: skip


def _tokens(gw) -> tuple[float, float]:
    return tuple(
        gw.metric("llmgate_key_tokens_total", default=0.0, key="team", kind=kind)
        for kind in ("prompt", "completion")
    )


def _call(gw, path: str, body: dict[str, Any], script: str) -> urllib3.BaseHTTPResponse:
    headers = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json",
               "x-sim-script": script, "anthropic-version": "2023-06-01",
               "Cache-Control": "no-cache"}  # fmt: skip
    return http.request("POST", gw.url + path, body=json.dumps(body), headers=headers)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("door", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_keys_tokens_are_the_providers_counts_through_every_kind_and_door(
    keyed_gw, kind, door, stream
) -> None:
    """The text script's usage: 10 uncached prompt tokens, 6 read from the provider's prompt
    cache, 6 written: 16 prompt tokens in all (Gemini counts its whole prompt as one)."""
    before = _tokens(keyed_gw)
    body = {"model": f"m-{kind}", "messages": MESSAGES, "max_tokens": 50, "stream": stream,
            "temperature": 0.5}  # fmt: skip
    resp = _call(keyed_gw, door, body, "text")
    assert resp.status == 200, resp.data
    prompt, completion = (a - b for a, b in zip(_tokens(keyed_gw), before, strict=True))
    assert (prompt, completion) == (16, 6), (kind, door, stream)


def test_the_cache_keeps_a_translated_answer_and_replays_it_per_door(
    keyed_gw, upstream_sim
) -> None:
    body = {"model": "m-anthropic", "messages": MESSAGES, "max_tokens": 50, "temperature": 0}
    headers = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json",
               "x-sim-script": "tools", "anthropic-version": "2023-06-01"}  # fmt: skip
    before = _dialects(upstream_sim)
    replies = []
    for door, stream in [
        ("/v1/chat/completions", False),  # a miss: the Anthropic upstream answers
        ("/v1/chat/completions", False),  # a hit
        ("/v1/chat/completions", True),  # the stored completion as chunks
        ("/v1/messages", False),  # another door: another key, a miss
        ("/v1/messages", False),  # a hit in Anthropic's shape
    ]:
        resp = http.request("POST", keyed_gw.url + door, headers=headers,
                            body=json.dumps({**body, "stream": stream}))  # fmt: skip
        assert resp.status == 200
        replies.append((resp.headers["X-LLMGate-Cache"].split(";")[0], resp.data))
    assert [status for status, _ in replies] == ["MISS", "HIT", "HIT", "MISS", "HIT"]
    assert _since(upstream_sim, before)["anthropic"] == 2
    chat = json.loads(replies[1][1])
    calls = chat["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_sim_weather", "call_sim_time"]
    assert b"data: [DONE]" in replies[2][1] and b'"tool_calls"' in replies[2][1]
    message = json.loads(replies[4][1])
    assert message["type"] == "message" and message["stop_reason"] == "tool_use"
    assert replies[4][1] == replies[3][1]


# -- hedging across kinds ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def hedged_gw(make_stack, tmp_path_factory, upstream_sim):
    """A stream to "h" goes to Claude first, whose headers come after 3 s; after 0.3 s without
    a first event the gateway sends a backup to the OpenAI upstream."""
    toml = f"""
[[upstreams]]
name = "claude"
kind = "anthropic"
base_url = "{upstream_sim}/v1"
models = ["h"]
priority = 0
hedge_after = 300
aliases = {{ "h" = "sim/fault=slow-headers,header_delay_ms=3000,script=text" }}

[[upstreams]]
name = "oai"
base_url = "{upstream_sim}/v1"
models = ["h"]
priority = 1
aliases = {{ "h" = "sim/script=text" }}
"""
    return config_stack(make_stack, tmp_path_factory, toml)


def test_a_hedge_goes_from_one_provider_to_another(hedged_gw, upstream_sim) -> None:
    before = _dialects(upstream_sim)
    resp = hedged_gw.post("/v1/chat/completions", {"model": "h", "messages": MESSAGES,
                                                    "stream": True})  # fmt: skip
    assert resp.status == 200 and resp.headers[UPSTREAM] == "oai"
    assert b'"content":"Hello"' in resp.data and resp.data.endswith(b"data: [DONE]\n\n")
    assert hedged_gw.metric("llmgate_hedges_total", upstream="claude", winner="backup") == 1
    assert _since(upstream_sim, before) == {"openai": 1, "anthropic": 1, "gemini": 0}


def test_identical_calls_coalesce_per_door(keyed_gw, upstream_sim) -> None:
    """Four identical cacheable streams through the chat door and two through the messages
    door, all at once, to an Anthropic upstream answering slowly: one upstream call per
    door (the simulator's count), and every caller gets the whole answer in its dialect."""
    asked = [{"role": "user", "content": "coalesce per door"}]
    body = {"model": "m-anthropic", "messages": asked, "max_tokens": 50, "temperature": 0,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json",
               "x-sim-script": "text", "x-sim-tps": "10",
               "anthropic-version": "2023-06-01"}  # fmt: skip
    doors = ["/v1/chat/completions"] * 4 + ["/v1/messages"] * 2
    before = _dialects(upstream_sim)
    with ThreadPoolExecutor(len(doors)) as pool:
        replies = list(pool.map(
            lambda door: http.request("POST", keyed_gw.url + door, headers=headers,
                                      body=json.dumps(body)),
            doors,
        ))  # fmt: skip
    assert all(r.status == 200 for r in replies)
    for door, reply in zip(doors, replies, strict=True):
        end = b"data: [DONE]\n\n" if "chat" in door else b"event: message_stop"
        assert end in reply.data, door
        assert b"scripted" in reply.data
    assert _since(upstream_sim, before)["anthropic"] == 2
