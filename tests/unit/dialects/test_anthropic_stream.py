"""Anthropic streams as chat chunks, against a folder of raw streams and their expected chunks.

Each stream in tests/data/dialects/anthropic/ (written from Anthropic's documented events; the
SDK's own types check them) has a .json with the chat items each of its SSE events must give.
Every stream is fed whole, one byte at a time and in random pieces, with LF and CRLF line
ends, and each feed() must return exactly the items of the events it completed: no delta is
held for a later event, none comes early, and the bytes out are the same however it was cut.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionChunk

from app.dialects.anthropic import StreamToChat
from llmgate_wire import sse
from tests.conftest import ROOT
from tests.support.sse_feed import cut_at, decode, steps
from tests.support.strategies import cut_places

STREAMS = ROOT / "tests" / "data" / "dialects" / "anthropic"
CASES = sorted(p.stem for p in STREAMS.glob("*.sse"))
CREATED = 1_700_000_000
_ENVELOPE = {"id", "object", "created", "model", "choices"}


def _load(case: str, crlf: bool = False) -> tuple[bytes, dict[str, Any]]:
    raw = (STREAMS / f"{case}.sse").read_bytes()
    return raw.replace(b"\n", b"\r\n") if crlf else raw, json.loads(
        (STREAMS / f"{case}.json").read_text()
    )


def items(out: bytes, case: dict[str, Any]) -> list[Any]:
    """The chat events of ``out`` (which must be whole events), in the fixtures' short form;
    each chunk's envelope is checked here, and each chunk must parse as the OpenAI SDK's."""
    events, rest = decode([out])
    assert rest == b""
    found: list[Any] = []
    for event in events:
        if event.is_comment:
            found.append(": " + event.comments[0])
        elif event.is_done:
            found.append("[DONE]")
        elif "error" in (value := event.json()):
            found.append(value)
        else:
            ChatCompletionChunk.model_validate(value)
            assert set(value) == _ENVELOPE | ({"usage"} if value["choices"] == [] else set())
            assert (value["id"], value["object"], value["created"], value["model"]) == (
                case["id"], "chat.completion.chunk", CREATED, case["model"]
            )  # fmt: skip
            if not value["choices"]:
                found.append({"usage": value["usage"]})
                continue
            (choice,) = value["choices"]
            assert (choice["index"], choice["logprobs"]) == (0, None)
            item = {"delta": choice["delta"]}
            if choice["finish_reason"] is not None:
                item["finish_reason"] = choice["finish_reason"]
            found.append(item)
    return found


def deltas(out: bytes, case: dict[str, Any]) -> list[dict[str, Any]]:
    """The deltas of the chunks in ``out``, in order."""
    return [i["delta"] for i in items(out, case) if isinstance(i, dict) and "delta" in i]


def feed_live(raw: bytes, pieces: list[bytes], case: dict[str, Any]) -> bytes:
    """Feed ``pieces`` and check each feed() against the events a reference decoder completes
    with the same piece: exactly their items come out of that call. Returns all bytes out."""
    reference, translator = sse.Decoder(), StreamToChat(True, CREATED)
    per_event, seen, out = case["events"], 0, b""
    for piece in pieces:
        completed = len(reference.feed(piece))
        chunk = translator.feed(piece)
        assert items(chunk, case) == [i for e in per_event[seen : seen + completed] for i in e]
        seen, out = seen + completed, out + chunk
    assert seen == len(per_event)  # the fixture describes every event of its stream
    assert translator.close() == b""
    return out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("crlf", [False, True])
def test_stream_folder_whole_and_byte_by_byte(case: str, crlf: bool) -> None:
    raw, expected = _load(case, crlf)
    whole = feed_live(raw, [raw], expected)
    assert feed_live(raw, steps(raw, 1), expected) == whole
    lf_only, _ = _load(case)  # the line ends of the input do not show in the output
    assert whole == feed_live(lf_only, [lf_only], expected)


@pytest.mark.parametrize("case", CASES)
@settings(max_examples=40, deadline=None)
@given(crlf=st.booleans(), cuts=cut_places(None, 25))
def test_stream_folder_in_random_pieces(case: str, crlf: bool, cuts: list[int]) -> None:
    raw, expected = _load(case, crlf)
    assert feed_live(raw, cut_at(raw, cuts), expected) == feed_live(raw, [raw], expected)


@pytest.mark.parametrize("case", CASES)
def test_the_fixtures_are_anthropics_documented_events(case: str) -> None:
    """Every event of a known type parses as the Anthropic SDK's own type (the unknown ones
    are there on purpose), so the expectations rest on the real format."""
    raw, _ = _load(case)
    known = {"message_start", "message_delta", "message_stop"} | {
        f"content_block_{x}" for x in ("start", "delta", "stop")
    }
    for event in decode([raw])[0]:
        if event.event in known:
            data = event.json()
            kinds = {data.get("content_block", {}).get("type"), data.get("delta", {}).get("type")}
            if kinds & {"future_block", "future_delta"}:
                continue
            pydantic.TypeAdapter(RawMessageStreamEvent).validate_python(data)
            assert data["type"] == event.event
        elif event.event == "error":
            ErrorResponse.model_validate(event.json())


def _raw_events(case: str) -> list[dict[str, Any]]:
    return [e.json() for e in decode([_load(case)[0]])[0] if e.data and e.data.startswith("{")]


def test_tool_call_arguments_are_never_dropped() -> None:
    """Peer bug: argument fragments lost or merged. Fed byte by byte, the fragments of each
    call joined are the whole JSON Anthropic sent for that block, and it parses."""
    raw, case = _load("tools")
    translator = StreamToChat(False, CREATED)
    calls: dict[int, dict[str, str]] = {}
    for piece in steps(raw, 1):
        for delta in deltas(translator.feed(piece), case):
            for call in delta.get("tool_calls", []):
                entry = calls.setdefault(call["index"], {"arguments": ""})
                entry.update({k: call[k] for k in ("id",) if k in call})
                entry["arguments"] += call["function"]["arguments"]
    sent: dict[int, str] = {}  # from the raw events: Anthropic's block index -> its JSON
    for event in _raw_events("tools"):
        if event.get("delta", {}).get("type") == "input_json_delta":
            sent[event["index"]] = sent.get(event["index"], "") + event["delta"]["partial_json"]
    assert [c["id"] for c in calls.values()] == ["toolu_01A", "toolu_01B"]
    assert [c["arguments"] for c in calls.values()] == [sent[1], sent[2]]
    assert json.loads(calls[0]["arguments"]) == {"location": "San Francisco, CA", "unit": "celsius"}
    assert json.loads(calls[1]["arguments"]) == {
        "query": 'weather "today"', "limit": 3, "tags": ["a", "b"]
    }  # fmt: skip


def test_parallel_tool_calls_are_not_mixed_up() -> None:
    """Fragments of two calls interleaved go each to its own call's index."""
    translator = StreamToChat(False, CREATED)
    start = {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {}}}
    events: list[dict[str, Any]] = [start]
    for block, name in ((1, "a"), (2, "b")):
        tool = {"type": "tool_use", "id": f"id_{name}", "name": name, "input": {}}
        events.append({"type": "content_block_start", "index": block, "content_block": tool})
    for block, fragment in ((2, '{"b"'), (1, '{"a"'), (2, ": 2}"), (1, ": 1}")):
        piece = {"type": "input_json_delta", "partial_json": fragment}
        events.append({"type": "content_block_delta", "index": block, "delta": piece})
    out = translator.feed(b"".join(sse.encode(json.dumps(e), event=e["type"]) for e in events))
    joined = ["", ""]
    for delta in deltas(out, {"id": "m", "model": "c"})[1:]:
        (call,) = delta["tool_calls"]
        joined[call["index"]] += call["function"]["arguments"]
    assert [json.loads(j) for j in joined] == [{"a": 1}, {"b": 2}]


def test_thinking_is_kept_with_its_signature() -> None:
    """The reasoning text whole, and each block's entries (merged by index, their strings
    joined, as the OpenAI SDK accumulates them) the block whole: its text and signature."""
    raw, case = _load("thinking")
    got = deltas(StreamToChat(False, CREATED).feed(raw), case)
    reasoning = "".join(d.get("reasoning_content", "") for d in got)
    blocks: dict[int, dict[str, Any]] = {}
    for entry in (b for d in got for b in d.get("thinking_blocks", [])):
        block = blocks.setdefault(entry["index"], {})
        for name, value in entry.items():
            block[name] = (
                block.get(name, "") + value if name in ("thinking", "signature") else value
            )
    sent = [e["delta"] for e in _raw_events("thinking") if e["type"] == "content_block_delta"]
    assert reasoning == "".join(d["thinking"] for d in sent if d["type"] == "thinking_delta")
    assert blocks[0] == {
        "index": 0, "type": "thinking", "thinking": reasoning, "signature": sent[2]["signature"]
    }  # fmt: skip
    assert blocks[1]["type"] == "redacted_thinking" and blocks[1]["data"].startswith("EmwK")


def test_usage_is_cumulative_with_cache_counts_when_asked() -> None:
    """Peer bug: usage missing. The latest counts of message_start and message_delta, cache
    reads and writes in the prompt; no usage chunk when the caller did not ask, [DONE] still."""
    raw, case = _load("unknown")
    counts: dict[str, int] = {}
    for event in _raw_events("unknown"):
        counts.update(event.get("message", {}).get("usage", {}) | event.get("usage", {}))
    (usage,) = [
        i["usage"] for i in items(StreamToChat(True, CREATED).feed(raw), case) if "usage" in i
    ]
    prompt = sum(
        counts[k]
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    assert usage["prompt_tokens"] == prompt == 326
    assert usage["completion_tokens"] == counts["output_tokens"] == 7
    # The names the OpenAI SDK's own usage type reads (prompt_tokens_details.cache_write_tokens)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 300, "cache_write_tokens": 5}
    details = CompletionUsage.model_validate(usage).prompt_tokens_details
    assert details is not None and (details.cached_tokens, details.cache_write_tokens) == (300, 5)
    without = items(StreamToChat(False, CREATED).feed(raw), case)
    assert [i for i in without if "usage" in i] == [] and without[-1] == "[DONE]"


def test_first_delta_is_not_held() -> None:
    """Peer bug: the first byte held until the end. Everything but the blank line's last byte
    of the first text delta gives nothing of it; that byte gives its chunk at once."""
    raw, case = _load("text")
    end = raw.index(b'"Hello"}}\n\n') + len(b'"Hello"}}\n\n')
    translator = StreamToChat(True, CREATED)
    assert "Hello" not in json.dumps(items(translator.feed(raw[: end - 1]), case))
    assert items(translator.feed(raw[end - 1 : end]), case) == [{"delta": {"content": "Hello"}}]


def test_a_stream_cut_before_message_stop_gets_no_done() -> None:
    raw, _ = _load("cut")
    translator = StreamToChat(True, CREATED)
    out = translator.feed(raw)
    assert b"[DONE]" not in out and b'finish_reason":"' not in out
    assert translator.close() == b""


def test_nothing_after_an_error_event() -> None:
    raw, case = _load("error")
    translator = StreamToChat(True, CREATED)
    assert items(translator.feed(raw), case)[-1]["error"]["type"] == "overloaded_error"
    assert translator.feed(b'event: ping\ndata: {"type":"ping"}\n\n') == b""
    assert translator.close() == b""


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("end_turn", "stop"), ("stop_sequence", "stop"), ("pause_turn", "stop"),
        ("max_tokens", "length"), ("tool_use", "tool_calls"), ("refusal", "content_filter"),
        (None, "stop"), ("a_new_reason", "stop"),
    ],
)  # fmt: skip
def test_stop_reasons(stop_reason: str | None, finish: str) -> None:
    events = [
        {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {}}},
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {}},
        {"type": "message_stop"},
    ]
    out = StreamToChat(False, CREATED).feed(b"".join(sse.encode(json.dumps(e)) for e in events))
    assert items(out, {"id": "m", "model": "c"})[1:] == [
        {"delta": {}, "finish_reason": finish}, "[DONE]"
    ]  # fmt: skip


def test_an_event_larger_than_the_limit_raises() -> None:
    raw, _ = _load("text")
    with pytest.raises(sse.EventTooLarge):
        StreamToChat(True, CREATED, max_event_bytes=100).feed(raw)


def test_usage_reported_once_anthropics_final_counts_came() -> None:
    """message_start's usage counts no output yet: the usage is Anthropic's own once a
    message_delta brought its counts, not before."""
    raw, _ = _load("text")
    translator = StreamToChat(True, CREATED)
    at = raw.index(b"event: message_delta")
    translator.feed(raw[:at])
    assert translator.usage_reported is False
    translator.feed(raw[at:])
    assert translator.usage_reported is True
    without = StreamToChat(True, CREATED)
    stop = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    without.feed(raw[:at] + sse.encode(json.dumps(stop), event="message_delta"))
    assert without.usage_reported is False
