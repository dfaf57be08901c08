"""The simulator's Responses API stream, its fault knobs on that stream, and the fields and
headers every answer carries (service_tier, cached tokens, obfuscation, openai-version,
openai-processing-ms, x-ratelimit-*). Raw bytes are parsed here with a few lines of test
code, never with the gateway's decoder.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

import openai
import pytest

from simulator import text
from tests.support.sim import SimProcess

RESPONSES = "/v1/responses"
PROMPT = "hello there simulator"
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
pytestmark = pytest.mark.usefixtures("fresh_sim")  # each test starts from /sim/reset


def _post(
    sim: SimProcess, path: str, body: dict[str, Any], **controls: str
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=10)
    headers = {f"x-sim-{k.replace('_', '-')}": v for k, v in controls.items()}
    conn.request("POST", path, body=json.dumps(body), headers=headers)
    return conn, conn.getresponse()


def _events(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of each block of an LF-framed stream."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = fields["data"]
        out.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return out


def _stream(sim: SimProcess, body: dict[str, Any], **controls: str) -> bytes:
    conn, resp = _post(
        sim, RESPONSES, {"model": "m", "input": PROMPT, **body, "stream": True}, **controls
    )
    try:
        assert resp.status == 200
        assert resp.getheader("content-type", "").startswith("text/event-stream")
        return resp.read()
    finally:
        conn.close()


def test_event_sequence_of_a_text_stream(sim: SimProcess) -> None:
    events = _events(_stream(sim, {"max_output_tokens": 3, "store": False}))
    names = [name for name, _ in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [data["type"] for _, data in events] == names
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    words = text.words(PROMPT, 3)
    assert [data["delta"] for name, data in events if name and name.endswith(".delta")] == words
    item_id = events[2][1]["item"]["id"]
    assert {data.get("item_id") for _, data in events[3:-2]} == {item_id}
    completed = events[-1][1]["response"]
    assert completed["status"] == "completed" and completed["store"] is False
    assert completed["id"] == events[0][1]["response"]["id"]
    assert completed["output"][0]["content"][0]["text"] == "".join(words)
    assert completed["usage"]["output_tokens"] == 3
    assert completed["usage"]["input_tokens_details"] == {"cached_tokens": 0}


def test_function_call_arguments_stream(sim: SimProcess) -> None:
    events = _events(_stream(sim, {"max_output_tokens": 2, "tools": TOOLS}, tool_call="1"))
    names = [name for name, _ in events]
    assert names[2] == "response.output_item.added"
    assert events[2][1]["item"]["type"] == "function_call"
    assert events[2][1]["item"]["name"] == "lookup"
    deltas = [
        data["delta"] for name, data in events if name == "response.function_call_arguments.delta"
    ]
    arguments = "".join(deltas)
    assert json.loads(arguments) == {"query": "".join(text.words(PROMPT, 2))}
    assert names[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-3][1]["arguments"] == arguments
    assert events[-1][1]["response"]["output"][0]["arguments"] == arguments
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    # Without tools the control changes nothing: the model writes text.
    plain = _events(_stream(sim, {"max_output_tokens": 2}, tool_call="1"))
    assert plain[2][1]["item"]["type"] == "message"


def test_no_done_sentinel_and_the_sdk_reads_it(sim: SimProcess) -> None:
    raw = _stream(sim, {"max_output_tokens": 2})
    assert b"[DONE]" not in raw and raw.endswith(b"\n\n")
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0) as client:
        stream = client.responses.create(model="m", input=PROMPT, max_output_tokens=4, stream=True)
        events = list(stream)
        assert events[-1].type == "response.completed"
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert "".join(deltas) == "".join(text.words(PROMPT, 4))
        with client.responses.stream(model="m", input=PROMPT, max_output_tokens=4) as helper:
            final = helper.get_final_response()
        assert final.output_text == "".join(deltas)


def test_error_after_fails_the_response_part_way(sim: SimProcess) -> None:
    events = _events(_stream(sim, {"max_output_tokens": 6}, fault="error-after", error_after="2"))
    names = [name for name, _ in events]
    assert names.count("response.output_text.delta") == 2
    assert names[-1] == "response.failed"
    failed = events[-1][1]
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert failed["sequence_number"] == len(events) - 1
    # Chat: one error event where the chunks stop, and no [DONE].
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    conn, resp = _post(sim, "/v1/chat/completions", body, fault="error-after", error_after="1")
    chat = _events(resp.read())
    conn.close()
    assert chat[-1][1]["error"]["type"] == "server_error"
    assert len(chat) == 3 and "[DONE]" not in [data for _, data in chat]
    # A non-stream call cannot fail part-way: a 500.
    conn, resp = _post(sim, RESPONSES, {"model": "m", "input": "x"}, fault="error-after")
    assert resp.status == 500
    conn.close()


def test_reset_and_stall_act_on_responses_streams(sim: SimProcess) -> None:
    body = {"model": "m", "input": PROMPT, "stream": True, "max_output_tokens": 8}
    conn, resp = _post(sim, RESPONSES, body, fault="reset", reset_after="3", tps="50")
    received = b""
    with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
        while chunk := resp.read1(65536):
            received += chunk
    conn.close()
    names = [name for name, _ in _events(received[: received.rfind(b"\n\n") + 2])]
    assert names.count("response.output_text.delta") == 3
    assert "response.completed" not in names
    started = time.monotonic()
    raw = _stream(
        sim, {"max_output_tokens": 3}, fault="stall-after", stall_ms="300", stall_after="1"
    )
    assert time.monotonic() - started >= 0.3
    assert _events(raw)[-1][0] == "response.completed"
    assert sim.stats()["streams_completed"] == 1


def test_lifecycle_events_come_before_the_ttft_wait(sim: SimProcess) -> None:
    body = {"model": "m", "input": PROMPT, "stream": True, "max_output_tokens": 2}
    started = time.monotonic()
    conn, resp = _post(sim, RESPONSES, body, ttft_ms="400")
    first = resp.read1(65536)
    early = time.monotonic() - started
    rest = resp.read()
    late = time.monotonic() - started
    conn.close()
    assert first.startswith(b"event: response.created") and b".delta" not in first
    assert early < 0.3 and late >= 0.4  # generous: the wait is 400 ms
    assert b"event: response.output_text.delta" in rest


def test_service_tier_cached_tokens_and_obfuscation(sim: SimProcess) -> None:
    events = _events(
        _stream(
            sim,
            {"service_tier": "flex", "stream_options": {"include_obfuscation": True}},
            cached_tokens="2",
        )
    )
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert all(isinstance(d["obfuscation"], str) and d["obfuscation"] for d in deltas)
    completed = events[-1][1]["response"]
    assert completed["service_tier"] == "flex"
    assert completed["usage"]["input_tokens_details"] == {"cached_tokens": 2}
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "service_tier": "auto",
        "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": True},
    }
    conn, resp = _post(sim, "/v1/chat/completions", chat, cached_tokens="1")
    chunks = [data for _, data in _events(resp.read())][:-1]
    conn.close()
    assert {c["service_tier"] for c in chunks} == {"default"}  # auto runs as default
    assert all(
        "obfuscation" in c
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("content")
    )
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 1, "audio_tokens": 0}
    plain = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    conn, resp = _post(sim, "/v1/chat/completions", plain)
    raw = resp.read()
    conn.close()
    assert b"obfuscation" not in raw and b"service_tier" not in raw


def test_rate_limit_version_and_processing_headers(sim: SimProcess) -> None:
    seen = []
    for ttft in ("0", "120"):
        conn, resp = _post(
            sim, RESPONSES, {"model": "m", "input": PROMPT, "max_output_tokens": 2}, ttft_ms=ttft
        )
        resp.read()
        seen.append({k.lower(): v for k, v in resp.getheaders()})
        conn.close()
    first, second = seen
    assert first["openai-version"] == "2020-10-01"
    assert first["x-ratelimit-limit-requests"] == "10000"
    assert first["x-ratelimit-remaining-requests"] == "9999"
    assert second["x-ratelimit-remaining-requests"] == "9998"
    assert first["x-ratelimit-remaining-tokens"] == "2000000"
    assert second["x-ratelimit-remaining-tokens"] == str(2_000_000 - 5)  # 3 in + 2 out
    assert (first["x-ratelimit-reset-requests"], second["x-ratelimit-reset-requests"]) == (
        "6ms",
        "12ms",
    )
    assert int(second["openai-processing-ms"]) >= 120 > int(first["openai-processing-ms"])
