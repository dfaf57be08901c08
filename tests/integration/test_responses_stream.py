"""Responses API streams through the whole stack (nginx → gunicorn → simulator): live typed
events for the OpenAI SDK, a cut stream that ends with an error the SDK raises, a failed
response relayed as the upstream sent it, and the cache (``store: false``) replaying the
same bytes, never for ``store: true``. Raw bodies are compared as bytes read off the socket
by urllib3, never through the gateway's own SSE decoder.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import openai
import pytest

from simulator import text
from tests.support.sdks import openai_sdk
from tests.support.server_timing import relay_of

RESPONSES = "/v1/responses"


@pytest.fixture
def client(gw) -> Iterator[openai.OpenAI]:
    # Closed after: a stream the test left (raised mid-way) keeps its connection otherwise.
    with openai_sdk(gw.url, api_key="sk-test") as sdk:
        yield sdk


def _prompt() -> str:
    return "tell me about " + uuid.uuid4().hex[:8]  # nothing earlier cached it


def _raw_stream(gw, body: dict, **headers: str) -> tuple[int, dict, bytes]:
    resp = gw.post(RESPONSES, {**body, "stream": True}, headers=headers, preload_content=False)
    data = resp.read()
    resp.release_conn()
    return resp.status, dict(resp.headers), data


def test_sdk_gets_text_deltas_live(client, gw) -> None:
    # The SDK builds its models' validators at their first use: its first stream in a
    # process spends up to a second of its own parsing the events that carry a whole
    # Response (measured: `response.completed` read 1.1 s after the event before it, the
    # simulator called directly and idle), and deltas that wait in its socket meanwhile come
    # out at once. One stream first, not timed: the timing below is the gateway's.
    list(client.responses.create(model="sim-model", input=_prompt(), stream=True))
    prompt = _prompt()
    stream = client.responses.create(
        model="sim-model",
        input=prompt,
        max_output_tokens=6,
        stream=True,
        extra_headers={"x-sim-tps": "10"},  # 100 ms between deltas
    )
    arrivals = [(time.monotonic(), event) for event in stream]
    deltas = [(at, e.delta) for at, e in arrivals if e.type == "response.output_text.delta"]
    assert "".join(d for _, d in deltas) == "".join(text.words(prompt, 6))
    # Five gaps of 100 ms: spread out on arrival, not held back and delivered at the end.
    assert deltas[-1][0] - deltas[0][0] >= 0.3
    assert arrivals[0][1].type == "response.created"
    assert arrivals[-1][1].type == "response.completed"
    assert [e.sequence_number for _, e in arrivals] == list(range(len(arrivals)))


def test_function_call_arguments_are_relayed(client) -> None:
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
    stream = client.responses.create(
        model="sim-model",
        input=_prompt(),
        tools=tools,
        max_output_tokens=3,
        stream=True,
        extra_headers={"x-sim-tool-call": "1"},
    )
    events = list(stream)
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert json.loads(arguments)["query"]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == arguments


def test_a_stream_cut_mid_way_ends_with_an_error_the_sdk_raises(client, gw) -> None:
    stream = client.responses.create(
        model="sim-model",
        input=_prompt(),
        max_output_tokens=8,
        stream=True,
        extra_headers={"x-sim-fault": "reset", "x-sim-reset-after": "2", "x-sim-tps": "50"},
    )
    seen = []
    with pytest.raises(openai.APIError) as raised:
        for event in stream:
            seen.append(event.type)
    assert seen.count("response.output_text.delta") == 2
    assert "response.completed" not in seen
    assert raised.value.body["code"] == "upstream_reset"  # type: ignore[index]


def test_a_failed_response_is_relayed_as_sent_and_not_cached(gw) -> None:
    body = {"model": "sim-model", "input": _prompt(), "store": False, "temperature": 0}
    faults = {"x-sim-fault": "error-after", "x-sim-error-after": "1"}
    for _ in range(2):
        status, headers, got = _raw_stream(gw, body, **faults)
        assert status == 200 and headers["X-LLMGate-Cache"] == "MISS"
        # The upstream's terminal response.failed is the end: nothing added after it (the
        # gateway's relay time is a comment line at the head of that event's block).
        raw, relay = relay_of(got)
        assert relay is not None and b"\n: server-timing: " in got
        assert raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].startswith(b"event: response.failed\n")
        assert b'"error":{"code":"server_error"' in raw
    assert gw.sim_stats()["requests"] == 2


def test_a_cacheable_stream_replays_the_same_bytes(gw) -> None:
    body = {"model": "sim-model", "input": _prompt(), "store": False, "temperature": 0}
    status, first_headers, first = _raw_stream(gw, {**body, "max_output_tokens": 4})
    assert status == 200 and first_headers["X-LLMGate-Cache"] == "MISS"
    status, headers, again = _raw_stream(gw, {**body, "max_output_tokens": 4})
    assert status == 200 and headers["X-LLMGate-Cache"].startswith("HIT")
    # The same bytes but each answer's own relay time (Server-Timing's line, said by both).
    assert relay_of(again)[0] == relay_of(first)[0]
    assert relay_of(again)[1] is not None and relay_of(first)[1] is not None
    assert first.count(b"event: response.output_text.delta\n") == 4
    assert b"[DONE]" not in again
    # A non-stream caller gets the object of the stored stream's response.completed.
    resp = gw.post(RESPONSES, {**body, "max_output_tokens": 4})
    assert resp.headers["X-LLMGate-Cache"].startswith("HIT")
    completed = first.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].split(b"data: ", 1)[1]
    assert json.loads(resp.data) == json.loads(completed)["response"]
    assert gw.sim_stats()["requests"] == 1


def test_store_true_is_never_cached(gw) -> None:
    for store in ({}, {"store": True}):  # the API's default is store: true
        body = {"model": "sim-model", "input": _prompt(), "temperature": 0, **store}
        for _ in range(2):
            status, headers, _ = _raw_stream(gw, body)
            assert status == 200 and headers["X-LLMGate-Cache"] == "BYPASS"
    assert gw.sim_stats()["requests"] == 4
