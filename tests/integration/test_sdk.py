"""The official openai SDK pointed at the gateway (base_url) behaves as against OpenAI."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import openai
import pytest

from tests.support.bodies import CHAT


@pytest.fixture
def client(gw) -> Iterator[openai.OpenAI]:
    # Closed after the test: a client left to the collector leaks its connection's socket.
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def test_non_stream_chat(client, gw) -> None:
    completion = client.chat.completions.create(**CHAT, max_tokens=5)
    assert completion.object == "chat.completion"
    assert len(completion.choices[0].message.content.split()) == 5
    assert completion.usage.completion_tokens == 5
    assert completion._request_id  # the upstream's x-request-id reached the SDK


def test_stream_chat_matches_the_non_stream_text(client) -> None:
    full = client.chat.completions.create(**CHAT, max_tokens=7).choices[0].message.content
    stream = client.chat.completions.create(
        **CHAT, max_tokens=7, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage.completion_tokens == 7


def test_embeddings_and_models(client) -> None:
    result = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert len(result.data) == 2 and len(result.data[0].embedding) > 0
    # The SDK asked for base64 and decoded it: the bytes crossed the gateway intact.
    raw = client.embeddings.create(model="m", input="a", encoding_format="base64")
    assert len(base64.b64decode(raw.data[0].embedding)) % 4 == 0
    models = client.models.list()
    assert "sim-model" in [m.id for m in models.data]
    assert client.models.retrieve("sim-model").id == "sim-model"


def test_upstream_429_is_a_rate_limit_error(client, gw) -> None:
    # retry-after above the gateway's own ceiling: passed straight back to the caller.
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(
            **CHAT, extra_headers={"x-sim-fault": "429", "x-sim-retry-after": "60"}
        )
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "60"
    assert gw.sim_stats()["requests"] == 1


def test_gateway_retries_a_short_429_then_succeeds(client, gw) -> None:
    completion = client.chat.completions.create(
        **CHAT,
        max_tokens=2,
        extra_headers={
            "x-sim-fault": "429",
            "x-sim-retry-after": "0.1",
            "x-sim-fail-times": "1",
            "x-sim-fail-key": "sdk-retry",
        },
    )
    assert completion.choices[0].message.content
    assert gw.sim_stats()["requests"] == 2


def test_retried_429_tells_the_sdk_not_to_retry_again(gw) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=2)
    with client, pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(
            **CHAT, extra_headers={"x-sim-fault": "429", "x-sim-retry-after": "0.05"}
        )
    assert info.value.response.headers["x-should-retry"] == "false"
    # Our 3 attempts (1 + LLMGATE_RETRIES=2); the SDK's own 2 retries never happened.
    assert gw.sim_stats()["requests"] == 3


def test_mid_stream_failure_is_an_api_error(client) -> None:
    stream = client.chat.completions.create(
        **CHAT, max_tokens=20, stream=True, extra_headers={"x-sim-fault": "reset"}
    )
    received = []
    with pytest.raises(openai.APIError, match="Upstream broke off"):
        for chunk in stream:
            received.append(chunk)
    assert received, "the events before the failure were delivered"


def test_upstream_500_passes_through_with_its_body(client) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(**CHAT, extra_headers={"x-sim-fault": "500"})
    assert info.value.status_code == 500
    body = info.value.body
    assert isinstance(body, dict) and body["type"]  # the upstream's OpenAI error body, unchanged
