"""Each script streamed in each dialect (simulator/chat_scripts.py, anthropic.py, gemini.py),
read back with the project's own SSE decoder, whole and one byte at a time.

What is held: the order of each dialect's events; usage that is cumulative where the dialect
says so; every tool call's argument fragments joining to the script's JSON; one event per
piece; and, for Chat Completions, the exact bytes app/dialects/chat.py writes for the same
answer (the simulator does not import the gateway; this test does, to hold them equal).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.dialects import chat
from llmgate_wire import sse
from simulator import anthropic, chat_scripts, gemini, scripts
from simulator.scripts import SCRIPTS, Script
from tests.support.sse_feed import decode, steps

ID, CREATED, MODEL = "chatcmpl-1", 1_700_000_000, "m"
TOOL_ARGS = {"get_weather": scripts.WEATHER_ARGS, "get_time": scripts.TIME_ARGS}


def render(framer: Any) -> bytes:
    """The whole stream as playback writes it when no fault fires."""
    opening = framer.opening() or b""
    pieces = [framer.piece(i) for i in range(len(framer.pieces))]
    return opening + b"".join(pieces) + b"".join(framer.closing())


def events(raw: bytes) -> list[sse.Event]:
    """The events of a whole stream, the same when it is fed one byte at a time (then a
    CRLF's LF may trail a CR that ended a chunk: it is kept, at the front of what follows)."""
    whole, rest = decode([raw])
    assert rest == b""
    bytewise, rest_bytewise = decode(steps(raw, 1))
    assert b"".join(e.raw for e in bytewise) + rest_bytewise == raw
    fields = [(e.event, e.data, e.comments) for e in whole]
    assert fields == [(e.event, e.data, e.comments) for e in bytewise]
    return whole


def expected_chat(script: Script, include_usage: bool) -> bytes:
    """The stream app/dialects/chat.py's writer makes of this answer."""
    w = chat.ChunkWriter(ID, CREATED, MODEL)
    out = [w.role()]
    index = -1
    for step in script.steps():
        block = script.blocks[step.block]
        if step.kind == "thinking":
            out.append(w.reasoning(step.value))
        elif step.kind == "signature":
            out.append(w.signature(step.value))
        elif step.kind == "text":
            out.append(w.text(step.value))
        else:
            if step.first:
                index, first = w.tool_start(block.id, block.name)
                out.append(first)
            out.append(w.tool_arguments(index, step.value))
    if script.finish == scripts.ERROR:
        return b"".join([*out, chat.error_event("Overloaded", "overloaded_error")])
    out.append(w.finish(script.finish))
    if include_usage:
        u = script.usage
        reasoning = u.thinking if script.of_kind("thinking") else None
        usage = chat.usage(
            u.prompt,
            u.output,
            cached=u.cache_read,
            cache_creation=u.cache_creation,
            reasoning=reasoning,
        )
        out.append(w.usage(usage))
    return b"".join([*out, chat.DONE])


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("name", scripts.NAMES)
def test_chat_stream_is_the_gateways_canonical_shape(name: str, include_usage: bool) -> None:
    script = SCRIPTS[name]
    framer = chat_scripts.ScriptChatFramer(script, ID, CREATED, MODEL, include_usage)
    raw = render(framer)
    assert raw == expected_chat(script, include_usage)
    decoded = events(raw)
    # One chunk per piece, the role chunk first; a tool call's first fragment is two.
    chunks = 1 + len(script.steps()) + len(script.of_kind("tool"))
    ends = 1 if script.finish == scripts.ERROR else 2 + include_usage
    assert len(decoded) == chunks + ends


def test_chat_failure_is_one_overloaded_error_without_done() -> None:
    framer = chat_scripts.ScriptChatFramer(SCRIPTS["text"], ID, CREATED, MODEL, True)
    (event,) = framer.failure(2)
    assert json.loads(event.removeprefix(b"data: ")) == chat.error_body(
        "Overloaded", "overloaded_error"
    )


def anthropic_answer(decoded: list[sse.Event]) -> dict[str, Any]:
    """What a reader of the Anthropic stream gets, checking the order as it goes."""
    names = [e.event for e in decoded]
    assert all(e.json()["type"] == e.event for e in decoded)
    assert names[:2] == ["message_start", "ping"]
    answer: dict[str, Any] = {"blocks": {}, "usage": decoded[0].json()["message"]["usage"]}
    open_block = None
    for e in decoded[2:]:
        data = e.json()
        if e.event == "content_block_start":
            assert open_block is None  # blocks never overlap
            open_block = data["index"]
            answer["blocks"][open_block] = {**data["content_block"], "deltas": []}
        elif e.event == "content_block_delta":
            assert data["index"] == open_block
            answer["blocks"][open_block]["deltas"].append(data["delta"])
        elif e.event == "content_block_stop":
            assert data["index"] == open_block
            open_block = None
        elif e.event in ("message_delta", "error"):
            assert open_block is None or e.event == "error"
            answer[e.event] = data
    assert list(answer["blocks"]) == list(range(len(answer["blocks"])))
    return answer


@pytest.mark.parametrize("name", scripts.NAMES)
def test_anthropic_stream(name: str) -> None:
    script = SCRIPTS[name]
    decoded = events(render(anthropic.MessageFramer(script, "msg_1", MODEL)))
    answer = anthropic_answer(decoded)
    assert answer["usage"]["output_tokens"] == 1
    assert answer["usage"]["input_tokens"] == script.usage.input
    assert answer["usage"]["cache_read_input_tokens"] == script.usage.cache_read
    assert answer["usage"]["cache_creation_input_tokens"] == script.usage.cache_creation
    for i, block in enumerate(script.blocks):
        got = answer["blocks"][i]
        deltas = got.pop("deltas")
        assert len(deltas) == len(block.pieces) + (block.kind == "thinking")
        if block.kind == "tool":
            assert got == {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            fragments = [d["partial_json"] for d in deltas]
            assert len(fragments) >= 10
            assert json.loads("".join(fragments)) == TOOL_ARGS[block.name]
        elif block.kind == "thinking":
            assert "".join(d["thinking"] for d in deltas[:-1]) == block.text
            assert deltas[-1] == {"type": "signature_delta", "signature": block.signature}
        else:
            assert [d["text"] for d in deltas] == list(block.pieces)
    if script.finish == scripts.ERROR:
        assert decoded[-1].event == "error"
        assert answer["error"]["error"] == {"type": "overloaded_error", "message": "Overloaded"}
        return
    assert [e.event for e in decoded[-2:]] == ["message_delta", "message_stop"]
    delta = answer["message_delta"]
    assert delta["delta"]["stop_reason"] == anthropic.STOP_REASONS[script.finish]
    assert delta["usage"]["output_tokens"] == script.usage.output  # cumulative


def test_anthropic_stop_reasons() -> None:
    reasons = {n: anthropic.STOP_REASONS[SCRIPTS[n].finish] for n in scripts.NAMES[:5]}
    assert reasons == {
        "text": "end_turn",
        "tools": "tool_use",
        "thinking": "end_turn",
        "length": "max_tokens",
        "filter": "refusal",
    }


@pytest.mark.parametrize("name", scripts.NAMES)
def test_gemini_stream(name: str) -> None:
    script = SCRIPTS[name]
    raw = render(gemini.GenerateFramer(script, "r1", MODEL))
    decoded = events(raw)
    assert all(e.raw.endswith(b"\r\n\r\n") and e.event is None for e in decoded)
    assert b"[DONE]" not in raw
    bodies = [e.json() for e in decoded]
    if script.finish == scripts.ERROR:
        error = bodies.pop()
        assert error == {"error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}}
    parts = []
    for i, body in enumerate(bodies):
        (candidate,) = body["candidates"]
        assert body["responseId"] == "r1" and body["modelVersion"] == MODEL
        assert candidate["content"]["role"] == "model" and candidate["index"] == 0
        (part,) = candidate["content"]["parts"]  # one part per chunk: each piece
        parts.append(part)
        last = i == len(bodies) - 1 and script.finish != scripts.ERROR
        assert ("finishReason" in candidate) == last == ("usageMetadata" in body)
    assert "".join(p["text"] for p in parts if p.get("thought")) == script.thinking
    plain = [p for p in parts if "text" in p and not p.get("thought")]
    assert "".join(p["text"] for p in plain) == script.text
    signatures = [p["thoughtSignature"] for p in parts if "thoughtSignature" in p]
    assert signatures == [b.signature for b in script.of_kind("thinking")]
    calls = [p["functionCall"] for p in parts if "functionCall" in p]
    assert calls == [
        {"id": b.id, "name": b.name, "args": TOOL_ARGS[b.name]} for b in script.of_kind("tool")
    ]
    if script.finish != scripts.ERROR:
        assert bodies[-1]["candidates"][0]["finishReason"] == gemini.FINISH_REASONS[script.finish]
        meta = bodies[-1]["usageMetadata"]
        u = script.usage
        assert meta["promptTokenCount"] == u.prompt
        assert meta["candidatesTokenCount"] + meta.get("thoughtsTokenCount", 0) == u.output
        assert meta["totalTokenCount"] == u.prompt + u.output


def test_gemini_finish_reasons() -> None:
    reasons = {n: gemini.FINISH_REASONS[SCRIPTS[n].finish] for n in scripts.NAMES[:5]}
    assert reasons == {
        "text": "STOP",
        "tools": "STOP",
        "thinking": "STOP",
        "length": "MAX_TOKENS",
        "filter": "SAFETY",
    }


def test_a_generated_answer_without_words_still_finishes() -> None:
    empty = scripts.generated((), scripts.STOP, 3, 0)
    (only,) = [e.json() for e in events(render(gemini.GenerateFramer(empty, "r", MODEL)))]
    assert only["candidates"][0]["finishReason"] == "STOP"
    names = [e.event for e in events(render(anthropic.MessageFramer(empty, "m", MODEL)))]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]
