"""Fields and headers of the OpenAI API that must cross the gateway with their values:
``service_tier`` (the answer's value is the billed one, and is logged), cached prompt tokens
(logged, and counted in ``llmgate_prompt_cached_tokens_total``), ``prompt_cache_key`` and
``stream_options.include_obfuscation`` (upstream untouched), ``obfuscation`` (back to the
caller), ``openai-processing-ms``, ``openai-version`` and ``x-ratelimit-*`` (relayed as the
upstream sent them), and the time to first token of a Responses stream (its first output
delta, not its first event).
"""

from __future__ import annotations

import base64
import json
import time
import uuid

import openai
import pytest


def _tag() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)


def test_service_tier_and_cached_tokens_are_logged_and_counted(client, gw) -> None:
    before = gw.metric("llmgate_prompt_cached_tokens_total", default=0.0, route="chat")
    prompt_before = gw.metric("llmgate_prompt_tokens_total", default=0.0, route="chat")
    raw = client.chat.completions.with_raw_response.create(
        model="sim-model",
        messages=[{"role": "user", "content": f"one two three four {_tag()}"}],
        service_tier="auto",
        max_tokens=2,
        extra_headers={"x-sim-cached-tokens": "3"},
    )
    completion = raw.parse()
    assert completion.service_tier == "default"  # the tier it ran in, not the one asked
    assert completion.usage.prompt_tokens_details.cached_tokens == 3
    line = gw.logged(raw.headers["x-llmgate-request-id"], timeout=5)
    assert (line["service_tier"], line["tokens_in"], line["tokens_cached"]) == ("default", 5, 3)
    assert gw.metric("llmgate_prompt_cached_tokens_total", route="chat") - before == 3
    assert gw.metric("llmgate_prompt_tokens_total", route="chat") - prompt_before == 5


def test_a_responses_stream_logs_its_usage_tier_and_ttft_at_the_first_delta(client, gw) -> None:
    before = gw.metric("llmgate_prompt_cached_tokens_total", default=0.0, route="responses")
    started = time.monotonic()
    with client.responses.with_streaming_response.create(
        model="sim-model",
        input=f"one two {_tag()}",
        service_tier="flex",
        max_output_tokens=3,
        stream=True,
        extra_headers={"x-sim-cached-tokens": "2", "x-sim-ttft-ms": "600"},
    ) as raw:
        request_id = raw.headers["x-llmgate-request-id"]
        events = list(raw.parse())
    assert time.monotonic() - started >= 0.6
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    line = gw.logged(request_id, timeout=5)
    assert line["service_tier"] == "flex"
    assert (line["tokens_in"], line["tokens_out"], line["tokens_cached"]) == (3, 3, 2)
    # response.created left at once; the first token came after the simulated 600 ms.
    assert line["ttft_ms"] >= 600
    assert gw.metric("llmgate_prompt_cached_tokens_total", route="responses") - before == 2


def test_a_cache_hit_adds_no_billed_tokens(gw) -> None:
    body: dict[str, object] = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": _tag()}],
    }
    body |= {"temperature": 0, "max_tokens": 2}
    headers = {"x-sim-cached-tokens": "1"}
    assert gw.post("/v1/chat/completions", body, headers=headers).status == 200
    before = gw.metric("llmgate_prompt_cached_tokens_total", route="chat")
    again = gw.post("/v1/chat/completions", body, headers=headers)
    assert again.headers["X-LLMGate-Cache"].startswith("HIT")
    assert json.loads(again.data)["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
    assert gw.metric("llmgate_prompt_cached_tokens_total", route="chat") == before


def test_prompt_cache_key_and_obfuscation_pass(client, gw) -> None:
    key = f"pck-{_tag()}"
    stream = client.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_obfuscation": True},
        prompt_cache_key=key,
    )
    chunks = [c for c in stream if c.choices and c.choices[0].delta.content]
    assert len(chunks) == 3
    assert all(isinstance(c.obfuscation, str) and c.obfuscation for c in chunks)
    seen = gw.sim_requests()[-1]
    assert seen["body"]["prompt_cache_key"] == key
    assert seen["body"]["stream_options"] == {"include_obfuscation": True}
    sent = json.loads(base64.b64decode(seen["raw_body"]))
    assert sent["prompt_cache_key"] == key


def test_processing_version_and_rate_limit_headers_keep_their_values(gw) -> None:
    gw.sim_reset()
    body = {"model": "sim-model", "input": _tag(), "max_output_tokens": 2}
    first = gw.post("/v1/responses", body, headers={"x-sim-ttft-ms": "150"})
    second = gw.post("/v1/responses", {**body, "stream": True}, preload_content=False)
    second.read()
    second.release_conn()
    for resp in (first, second):
        assert resp.status == 200
        assert resp.headers["openai-version"] == "2020-10-01"
        assert resp.headers["x-ratelimit-limit-requests"] == "10000"
        assert resp.headers["x-ratelimit-limit-tokens"] == "2000000"
    assert int(first.headers["openai-processing-ms"]) >= 150
    assert first.headers["x-ratelimit-remaining-requests"] == "9999"
    assert second.headers["x-ratelimit-remaining-requests"] == "9998"
    assert first.headers["x-ratelimit-reset-requests"] == "6ms"
    assert second.headers["x-ratelimit-reset-requests"] == "12ms"
    # The first call used 1 prompt token + 2 output tokens before the second was counted.
    assert second.headers["x-ratelimit-remaining-tokens"] == str(2_000_000 - 3)
