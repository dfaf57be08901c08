"""The simulator's Anthropic Messages dialect over real TCP, read by the Anthropic SDK as
users run it (pointed straight at the simulator) and as raw bytes.

Scripts (simulator/scripts.py) give answers whose every field is known: the SDK's parsed
message and its accumulated stream must both equal them (text, tool inputs parsed from
fragments, thinking with its signature, stop reasons, usage). Faults and timing controls
act as on the OpenAI routes; lower bounds only, never tight timings.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from simulator import scripts, text
from tests.support.sdks import anthropic_sdk
from tests.support.sim import SimProcess

VERSION = {"anthropic-version": "2023-06-01"}
HELLO: list[Any] = [{"role": "user", "content": "hello there simulator"}]
pytestmark = pytest.mark.usefixtures("fresh_sim")  # each test starts from /sim/reset


@pytest.fixture
def client(sim: SimProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic_sdk(sim.url) as sdk:
        yield sdk


def raw(
    sim: SimProcess, body: Any, path: str = "/v1/messages", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    return sim.send("POST", path, body, headers)


def named_events(data: bytes) -> list[tuple[str, Any]]:
    out = []
    for block in data.decode().split("\n\n"):
        if block:
            fields = dict(line.split(": ", 1) for line in block.split("\n"))
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def ask(script: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sim",
        "max_tokens": 100,
        "messages": HELLO,
        "extra_headers": {"x-sim-script": script},
        **extra,
    }


def test_text_script_create_and_stream(client: anthropic.Anthropic) -> None:
    message = client.messages.create(**ask("text"))
    assert message.id.startswith("msg_") and message.model == "claude-sim"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello from the scripted simulator."
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens) == (10, 6)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (6, 0)
    with client.messages.stream(**ask("text")) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == ["Hello", " from", " the", " scripted", " simulator", "."]
    assert final.model_dump(exclude={"id"}) == message.model_dump(exclude={"id"})


def test_tools_script_parallel_calls_with_parsed_input(client: anthropic.Anthropic) -> None:
    message = client.messages.create(**ask("tools"))
    assert message.stop_reason == "tool_use"
    calls = [b for b in message.content if b.type == "tool_use"]
    assert [(c.id, c.name, c.input) for c in calls] == [
        ("call_sim_weather", "get_weather", scripts.WEATHER_ARGS),
        ("call_sim_time", "get_time", scripts.TIME_ARGS),
    ]
    with client.messages.stream(**ask("tools")) as stream:
        fragments: dict[int, list[str]] = {}
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                fragments.setdefault(event.index, []).append(event.delta.partial_json)
        final = stream.get_final_message()
    assert [len(f) >= 10 for f in fragments.values()] == [True, True]
    assert final.model_dump(exclude={"id"}) == message.model_dump(exclude={"id"})


def test_thinking_script_keeps_the_signature(client: anthropic.Anthropic) -> None:
    message = client.messages.create(**ask("thinking"))
    thinking, answer = message.content
    assert thinking.type == "thinking" and answer.type == "text"
    assert (thinking.thinking, thinking.signature) == (
        "Let me think it through.",
        "c2ltLXNpZ25hdHVyZS0x",
    )
    assert answer.text == "The answer is 42."
    assert message.usage.cache_creation_input_tokens == 3
    with client.messages.stream(**ask("thinking")) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds == ["thinking_delta"] * 6 + ["signature_delta"] + ["text_delta"] * 5
    assert final.model_dump(exclude={"id"}) == message.model_dump(exclude={"id"})


@pytest.mark.parametrize(("script", "reason"), [("length", "max_tokens"), ("filter", "refusal")])
def test_stop_reasons(client: anthropic.Anthropic, script: str, reason: str) -> None:
    assert client.messages.create(**ask(script)).stop_reason == reason
    with client.messages.stream(**ask(script)) as stream:
        assert stream.get_final_message().stop_reason == reason


def test_overload_script_fails_whole_or_part_way(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.OverloadedError) as whole:
        client.messages.create(**ask("overload"))
    assert whole.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}  # type: ignore[index]
    seen: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError, match="overloaded_error"),
        client.messages.stream(**ask("overload")) as stream,
    ):
        seen.extend(stream.text_stream)
    assert seen == ["Working", " on", " it"]


def test_generated_answer_is_capped_by_max_tokens(
    sim: SimProcess, client: anthropic.Anthropic
) -> None:
    prompt = "hello there simulator"
    free = client.messages.create(model="m", max_tokens=100, messages=HELLO)
    assert free.stop_reason == "end_turn" and free.usage.output_tokens == 16
    assert free.content[0].text == "".join(text.words(prompt, 16))  # type: ignore[union-attr]
    capped = client.messages.create(model="m", max_tokens=5, messages=HELLO)
    assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 5
    counted = client.messages.count_tokens(model="m", messages=HELLO)
    assert counted.input_tokens == free.usage.input_tokens == 3
    stats = sim.stats()
    assert stats["requests_by_route"] == {
        "anthropic /v1/messages": 2,
        "anthropic /v1/messages/count_tokens": 1,
    }
    assert stats["requests_by_dialect"] == {"anthropic": 3}


def test_version_header_and_key_are_required() -> None:
    with SimProcess(require_key="secret") as keyed:
        body = {"model": "m", "max_tokens": 5, "messages": HELLO}
        status, headers, data = raw(keyed, body, **{"x-api-key": "secret"})
        assert status == 400
        error = json.loads(data)
        assert error["type"] == "error" and error["request_id"] == headers["request-id"]
        assert error["error"]["type"] == "invalid_request_error"
        assert "anthropic-version" in error["error"]["message"]
        with (
            anthropic_sdk(keyed.url, api_key="wrong") as wrong,
            pytest.raises(anthropic.AuthenticationError) as refused,
        ):
            wrong.messages.create(model="m", max_tokens=5, messages=HELLO)
        assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        # x-api-key, or the bearer token this SDK sends
        status, _, _ = raw(keyed, body, **VERSION, **{"x-api-key": "secret"})
        assert status == 200
        with anthropic_sdk(keyed.url, api_key="secret") as right:
            assert right.messages.create(model="m", max_tokens=5, messages=HELLO).content


@pytest.mark.parametrize(
    ("fault", "status", "error_type"),
    [
        ("429", 429, "rate_limit_error"),
        ("500", 500, "api_error"),
        ("529", 529, "overloaded_error"),
        ("401", 401, "authentication_error"),
    ],
)
def test_error_faults(sim: SimProcess, fault: str, status: int, error_type: str) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": HELLO}
    got, headers, data = raw(sim, body, **VERSION, **{"x-sim-fault": fault})
    assert got == status
    assert json.loads(data) == {
        "type": "error",
        "error": {"type": error_type, "message": json.loads(data)["error"]["message"]},
        "request_id": headers["request-id"],
    }
    assert ("retry-after" in headers) == (fault in ("429", "529"))


def test_error_after_and_reset_mid_stream(sim: SimProcess) -> None:
    body = {"model": "m", "max_tokens": 50, "messages": HELLO, "stream": True}
    status, _, data = raw(sim, body, **VERSION, **{"x-sim-fault": "error-after"})
    events = named_events(data)
    assert status == 200 and [name for name, _ in events][:3] == [
        "message_start",
        "ping",
        "content_block_start",
    ]
    deltas = [e for name, e in events if name == "content_block_delta"]
    assert len(deltas) == 2  # error_after defaults to 2 pieces
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    with pytest.raises((http.client.IncompleteRead, ConnectionResetError)):
        raw(sim, body, **VERSION, **{"x-sim-fault": "reset", "x-sim-tps": "50"})


def test_ttft_tps_and_pings_while_waiting(sim: SimProcess) -> None:
    body = {"model": "m", "max_tokens": 50, "messages": HELLO, "stream": True}
    controls = {"x-sim-ttft-ms": "400", "x-sim-tps": "20", "x-sim-tokens": "3"}
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=10)
    try:
        start = time.monotonic()
        conn.request("POST", "/v1/messages", json.dumps(body), {**VERSION, **controls})
        response = conn.getresponse()
        first = response.read1(65536)  # message_start and its ping go out at once
        assert b"event: message_start" in first and time.monotonic() - start < 0.3
        rest = response.read()
        assert time.monotonic() - start >= 0.4 + 2 / 20  # the TTFT, then two token gaps
    finally:
        conn.close()
    assert b"event: message_stop" in rest
    controls["x-sim-ping-ms"] = "100"
    status, _, data = raw(sim, body, **VERSION, **controls)
    names = [name for name, _ in named_events(data)]
    before_content = names[: names.index("content_block_start")]
    assert status == 200 and before_content.count("ping") >= 3  # 400 ms of waiting
