"""app/dialects/stream_to_anthropic.py: Chat Completions streams in, Anthropic's named events out.

Each stream below is what an OpenAI upstream sends (chat.py's canonical shape, written with
its ChunkWriter, and the variants servers send: heartbeats, ``usage: null`` members, several
fields in one delta, tool call fragments interleaved). The output is held three ways: the
exact events, what the Anthropic SDK makes of it (its own SSE reading and accumulator, over
an HTTP mock transport, and its event types validated one by one), and the same bytes out
whatever the input's split, each event out in the feed that completes its chunk.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import Any

import anthropic
import httpx2
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.dialects import chat
from app.dialects.anthropic_door import ChatToStream
from tests.support.anthropic_events import message_start
from tests.support.sse_feed import cut_at, decode, steps
from tests.support.strategies import chat_json, cut_places

MODEL = "gpt-up"  # the upstream's model, in its chunks
DOOR_MODEL = "claude-door"  # the model the caller asked, for a stream whose chunks name none
ESTIMATE = 10  # the prompt's estimated tokens, given to the translator

ARGS_A = {"city": "Paris", "days": list(range(40)), "note": "é" * 30 + "x" * 200}
ARGS_B = {"query": 'weather in "Lyon"', "units": "metric", "filters": {"k": ["a" * 50] * 5}}


def _writer() -> chat.ChunkWriter:
    return chat.ChunkWriter("chatcmpl-1", 1_700_000_000, MODEL)


def _fragments(args: dict[str, Any]) -> list[str]:
    text = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    return [text[i : i + 9] for i in range(0, len(text), 9)]


def _chunk(delta: dict[str, Any], finish: str | None = None, **members: Any) -> bytes:
    value = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return chat.event({**value, **members})


def _with(event: bytes, **members: Any) -> bytes:
    """A ``data:`` event with more members (OpenAI's ``usage: null`` in every chunk)."""
    return chat.event({**json.loads(event.removeprefix(b"data: ")), **members})


def _text_stream() -> bytes:
    w = _writer()
    body = w.role() + w.text("Hello") + w.text(", world") + w.finish(chat.STOP)
    return body + w.usage(chat.usage(12, 3)) + chat.DONE


def _tools_stream(interleaved: bool) -> bytes:
    w = _writer()
    out = w.role() + w.text("Let me look.")
    a = [w.tool_arguments(0, f) for f in _fragments(ARGS_A)]
    b = [w.tool_arguments(1, f) for f in _fragments(ARGS_B)]
    if interleaved:
        out += w.tool_start("call_a", "get_weather")[1] + w.tool_start("call_b", "search")[1]
        out += b"".join(x for pair in itertools.zip_longest(a, b, fillvalue=b"") for x in pair)
    else:
        out += w.tool_start("call_a", "get_weather")[1] + b"".join(a)
        out += w.tool_start("call_b", "search")[1] + b"".join(b)
    return out + w.finish(chat.TOOL_CALLS) + w.usage(chat.usage(40, 60)) + chat.DONE


def _thinking_stream() -> bytes:
    w = _writer()
    body = w.role() + w.reasoning("Let me") + w.reasoning(" think.") + w.signature("sig-1")
    body += w.text("Answer.") + w.finish(chat.STOP)
    return body + w.usage(chat.usage(20, 9)) + chat.DONE


def _two_thinking_stream() -> bytes:
    """Two thinking blocks one after the other: each ends with its signature."""
    w = _writer()
    body = w.role() + w.reasoning("First.") + w.signature("sig-1")
    body += w.reasoning("Second.") + w.signature("sig-2") + w.text("Answer.")
    return body + w.finish(chat.STOP) + w.usage(chat.usage(20, 9)) + chat.DONE


def _finish_stream(finish: str, texts: Iterable[str], prompt: int, completion: int) -> bytes:
    w = _writer()
    body = w.role() + b"".join(w.text(t) for t in texts) + w.finish(finish)
    return body + w.usage(chat.usage(prompt, completion)) + chat.DONE


def _overload_stream() -> bytes:
    w = _writer()
    return w.role() + w.text("Partial") + chat.error_event("Overloaded", "overloaded_error")


def _heartbeat_stream() -> bytes:
    w = _writer()
    body = chat.PING + w.role() + chat.PING + w.text("Hi") + chat.PING + chat.PING
    body += w.text("!") + w.finish(chat.STOP) + chat.PING
    return body + w.usage(chat.usage(3, 2)) + chat.DONE


def _usage_null_stream() -> bytes:
    w = _writer()
    body = b"".join(_with(e, usage=None) for e in (w.role(), w.text("Hello"), w.finish("stop")))
    return body + w.usage(chat.usage(7, 1)) + chat.DONE


def _mixed_stream() -> bytes:
    """Several fields in one delta, the finish and the usage in one chunk."""
    call = {"index": 0, "id": "call_m", "type": "function"}
    first = {**call, "function": {"name": "f", "arguments": '{"a":'}}
    return (
        _chunk({"role": "assistant", "content": "", "reasoning_content": "Hmm."})
        + _chunk({"content": "Hi", "tool_calls": [first]})
        + _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})
        + _chunk({}, chat.TOOL_CALLS, usage=chat.usage(9, 5))
        + chat.DONE
    )


def _no_usage_stream() -> bytes:
    w = _writer()
    return w.role() + w.text("Hello") + w.finish(chat.STOP) + chat.DONE


def _cached_stream() -> bytes:
    w = _writer()
    body = w.role() + w.text("Hello") + w.finish(chat.STOP)
    return body + w.usage(chat.usage(100, 7, cached=30, cache_creation=20)) + chat.DONE


def _redacted_stream() -> bytes:
    """Thinking text sent twice in one delta (in ``thinking_blocks`` too), then a redacted
    block."""
    signed = {"type": "thinking", "thinking": "abc", "signature": "s1"}
    return (
        _chunk({"role": "assistant", "content": ""})
        + _chunk({"reasoning_content": "abc", "thinking_blocks": [signed]})
        + _chunk({"thinking_blocks": [{"type": "redacted_thinking", "data": "xyz"}]})
        + _chunk({"content": "ok"})
        + _chunk({}, chat.STOP)
        + _writer().usage(chat.usage(4, 3))
        + chat.DONE
    )


TOOLS_CONTENT = [
    ("text", "Let me look."),
    ("tool_use", "call_a", "get_weather", ARGS_A),
    ("tool_use", "call_b", "search", ARGS_B),
]
# Each stream, and the message the Anthropic SDK must make of its translation.
STREAMS: dict[str, tuple[bytes, list[Any], str, tuple[Any, ...]]] = {
    "text": (_text_stream(), [("text", "Hello, world")], "end_turn", (12, 3, 0, 0)),
    "tools": (_tools_stream(False), TOOLS_CONTENT, "tool_use", (40, 60, 0, 0)),
    "tools_interleaved": (_tools_stream(True), TOOLS_CONTENT, "tool_use", (40, 60, 0, 0)),
    "thinking": (
        _thinking_stream(),
        [("thinking", "Let me think.", "sig-1"), ("text", "Answer.")],
        "end_turn",
        (20, 9, 0, 0),
    ),
    "two_thinking": (
        _two_thinking_stream(),
        [("thinking", "First.", "sig-1"), ("thinking", "Second.", "sig-2"), ("text", "Answer.")],
        "end_turn",
        (20, 9, 0, 0),
    ),
    "length": (
        _finish_stream(chat.LENGTH, ["Once upon", " a time"], 5, 4),
        [("text", "Once upon a time")],
        "max_tokens",
        (5, 4, 0, 0),
    ),
    "filter": (
        _finish_stream(chat.CONTENT_FILTER, ["I can"], 6, 2),
        [("text", "I can")],
        "refusal",
        (6, 2, 0, 0),
    ),
    "heartbeats": (_heartbeat_stream(), [("text", "Hi!")], "end_turn", (3, 2, 0, 0)),
    "usage_null": (_usage_null_stream(), [("text", "Hello")], "end_turn", (7, 1, 0, 0)),
    "mixed": (
        _mixed_stream(),
        [("thinking", "Hmm.", ""), ("text", "Hi"), ("tool_use", "call_m", "f", {"a": 1})],
        "tool_use",
        (9, 5, 0, 0),
    ),
    # No usage: the estimates, the output's a quarter of the 5 bytes relayed, rounded up.
    "no_usage": (_no_usage_stream(), [("text", "Hello")], "end_turn", (ESTIMATE, 2, None, None)),
    "cached": (_cached_stream(), [("text", "Hello")], "end_turn", (50, 7, 30, 20)),
    "redacted": (
        _redacted_stream(),
        [("thinking", "abc", "s1"), ("redacted_thinking", "xyz"), ("text", "ok")],
        "end_turn",
        (4, 3, 0, 0),
    ),
}
# Every input, the ones that end on an error or a cut too.
INPUTS = {name: stream[0] for name, stream in STREAMS.items()} | {
    "overload": _overload_stream(),
    "cut": _text_stream()[: _text_stream().index(b'"finish_reason":"stop"')],
}


# --- helpers --------------------------------------------------------------------------------


def translate(pieces: Iterable[bytes]) -> bytes:
    translator = ChatToStream(message_id="msg_1", model=DOOR_MODEL, input_tokens=ESTIMATE)
    return b"".join(translator.feed(piece) for piece in pieces) + translator.close()


def events(out: bytes) -> list[dict[str, Any]]:
    """The events written, each held to Anthropic's form: its name again as the data's type,
    the data one line of compact JSON."""
    decoded, rest = decode([out])
    assert rest == b""
    found = []
    for item in decoded:
        data = item.json()
        name = data["type"]
        assert item.event == name
        assert item.raw == b"event: %s\ndata: %s\n\n" % (name.encode(), chat.dumps(data))
        found.append(data)
    return found


EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def accumulated(out: bytes) -> Any:
    """The message the SDK's accumulator makes of the events, each validated as the SDK's
    event type first (pings skipped, as the SDK skips them)."""
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for data in events(out):
        if data["type"] != "ping":
            event = EVENT.validate_python(data)
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    return snapshot


def sdk_client(body: bytes, status: int = 200, content_type: str = "text/event-stream") -> Any:
    """The Anthropic SDK, served ``body`` by an HTTP mock transport."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": content_type}, content=body)

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    return anthropic.Anthropic(
        api_key="k", base_url="http://door.test", max_retries=0, http_client=http
    )


def sdk_final(out: bytes) -> Any:
    with (
        sdk_client(out) as client,
        client.messages.stream(
            model=DOOR_MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        return stream.get_final_message()


def summary(message: Any) -> tuple[Any, ...]:
    blocks: list[Any] = []
    for b in message.content:
        if b.type == "text":
            blocks.append(("text", b.text))
        elif b.type == "tool_use":
            blocks.append(("tool_use", b.id, b.name, b.input))
        elif b.type == "thinking":
            blocks.append(("thinking", b.thinking, b.signature))
        else:
            blocks.append((b.type, b.data))
    u = message.usage
    counts = (u.input_tokens, u.output_tokens, u.cache_read_input_tokens)
    return blocks, message.stop_reason, (*counts, u.cache_creation_input_tokens)


def types(out: bytes) -> list[tuple[Any, ...]]:
    """Each event's type, with its index and its delta's or block's type when it has them."""
    found = []
    for e in events(out):
        inner = e.get("delta", e.get("content_block", {})).get("type")
        found.append(tuple(x for x in (e["type"], e.get("index"), inner) if x is not None))
    return found


# --- the events -----------------------------------------------------------------------------


def _delta(index: int, kind: str, **members: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, **members}}


def _start(index: int, **block: Any) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _message_delta(stop: str, usage: dict[str, int]) -> dict[str, Any]:
    delta = {"stop_reason": stop, "stop_sequence": None}
    return {"type": "message_delta", "delta": delta, "usage": usage}


def _counts(input: int, output: int, read: int = 0, creation: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input,
        "output_tokens": output,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": creation,
    }


STOP = {"type": "message_stop"}


def test_a_text_stream_is_anthropic_s_events() -> None:
    assert events(translate([STREAMS["text"][0]])) == [
        message_start(MODEL, ESTIMATE),
        _start(0, type="text", text=""),
        _delta(0, "text_delta", text="Hello"),
        _delta(0, "text_delta", text=", world"),
        {"type": "content_block_stop", "index": 0},
        _message_delta("end_turn", _counts(12, 3)),
        STOP,
    ]


def test_thinking_and_its_signature_are_a_thinking_block_before_the_text() -> None:
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    assert events(translate([STREAMS["thinking"][0]])) == [
        message_start(MODEL, ESTIMATE),
        _start(0, **thinking),
        _delta(0, "thinking_delta", thinking="Let me"),
        _delta(0, "thinking_delta", thinking=" think."),
        _delta(0, "signature_delta", signature="sig-1"),
        {"type": "content_block_stop", "index": 0},
        _start(1, type="text", text=""),
        _delta(1, "text_delta", text="Answer."),
        {"type": "content_block_stop", "index": 1},
        _message_delta("end_turn", _counts(20, 9)),
        STOP,
    ]


def test_several_fields_in_one_delta_each_go_to_their_block_in_order() -> None:
    assert events(translate([STREAMS["mixed"][0]])) == [
        message_start(MODEL, ESTIMATE),
        _start(0, type="thinking", thinking="", signature=""),
        _delta(0, "thinking_delta", thinking="Hmm."),
        {"type": "content_block_stop", "index": 0},
        _start(1, type="text", text=""),
        _delta(1, "text_delta", text="Hi"),
        {"type": "content_block_stop", "index": 1},
        _start(2, type="tool_use", id="call_m", name="f", input={}),
        _delta(2, "input_json_delta", partial_json='{"a":'),
        _delta(2, "input_json_delta", partial_json="1}"),
        {"type": "content_block_stop", "index": 2},
        _message_delta("tool_use", _counts(9, 5)),
        STOP,
    ]


def test_interleaved_tool_calls_keep_their_blocks_open_to_the_finish() -> None:
    out = translate([STREAMS["tools_interleaved"][0]])
    a, b = _fragments(ARGS_A), _fragments(ARGS_B)
    alternating = [
        ("content_block_delta", index, "input_json_delta")
        for pair in itertools.zip_longest(a, b)
        for index, fragment in zip((1, 2), pair, strict=True)
        if fragment is not None
    ]
    assert types(out) == [
        ("message_start",),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0),
        ("content_block_start", 1, "tool_use"),
        ("content_block_start", 2, "tool_use"),
        *alternating,
        ("content_block_stop", 1),
        ("content_block_stop", 2),
        ("message_delta",),
        ("message_stop",),
    ]
    # Every fragment as it came, none merged or dropped.
    for index, fragments in ((1, a), (2, b)):
        got = [
            e["delta"]["partial_json"]
            for e in events(out)
            if e["type"] == "content_block_delta" and e["index"] == index
        ]
        assert got == fragments


def test_heartbeats_are_pings_where_they_came() -> None:
    assert types(translate([STREAMS["heartbeats"][0]])) == [
        ("ping",),
        ("message_start",),
        ("ping",),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("ping",),
        ("ping",),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0),
        ("ping",),
        ("message_delta",),
        ("message_stop",),
    ]


def test_done_without_usage_sends_the_estimates_then_message_stop() -> None:
    """A server that ignores include_usage: the output's estimate is a quarter of the bytes
    of the text relayed ("Hello": 5), rounded up, not 0."""
    assert events(translate([STREAMS["no_usage"][0]]))[-3:] == [
        {"type": "content_block_stop", "index": 0},
        _message_delta("end_turn", {"input_tokens": ESTIMATE, "output_tokens": 2}),
        STOP,
    ]


def test_a_stream_of_done_alone_is_a_whole_empty_message_of_the_given_model() -> None:
    assert events(translate([chat.DONE])) == [
        message_start(DOOR_MODEL, ESTIMATE),
        _message_delta("end_turn", {"input_tokens": ESTIMATE, "output_tokens": 0}),
        STOP,
    ]


def test_a_stop_with_tool_calls_is_tool_use() -> None:
    w = _writer()
    stream = w.role() + w.tool_start("call_x", "f")[1] + w.tool_arguments(0, "{}")
    out = translate([stream + w.finish(chat.STOP) + chat.DONE])
    assert events(out)[-2]["delta"]["stop_reason"] == "tool_use"


def test_the_cache_counts_leave_the_input_tokens() -> None:
    assert events(translate([STREAMS["cached"][0]]))[-2]["usage"] == _counts(50, 7, 30, 20)


def test_a_mid_stream_error_is_the_error_event_and_nothing_follows() -> None:
    translator = ChatToStream(message_id="msg_1", model=DOOR_MODEL, input_tokens=ESTIMATE)
    out = translator.feed(INPUTS["overload"])
    assert events(out)[-1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert types(out)[:-1] == [
        ("message_start",),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
    ]
    assert translator.feed(_writer().text("more") + chat.PING + chat.DONE) == b""
    assert translator.close() == b""


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ({"message": "m", "type": "overloaded_error"}, "overloaded_error"),
        ({"message": "m", "type": "server_error"}, "api_error"),
        ({"message": "m", "type": "upstream_error", "code": "upstream_reset"}, "api_error"),
        ({"message": "m", "type": "requests", "code": "rate_limit_exceeded"}, "rate_limit_error"),
        ({"message": "m", "type": "timeout_error", "code": "idle"}, "timeout_error"),
        ({"message": "m", "type": "error", "code": "rate_limit_exceeded"}, "rate_limit_error"),
        ({"message": "m", "type": "something_new"}, "api_error"),
        ("m", "api_error"),
    ],
)
def test_a_mid_stream_error_s_type_is_anthropic_s(error: Any, expected: str) -> None:
    out = translate([_writer().role(), chat.event({"error": error})])
    assert events(out)[-1] == {"type": "error", "error": {"type": expected, "message": "m"}}


def test_a_cut_stream_stays_cut() -> None:
    translator = ChatToStream(message_id="msg_1", model=DOOR_MODEL, input_tokens=ESTIMATE)
    out = translator.feed(INPUTS["cut"])
    assert types(out) == [
        ("message_start",),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_delta", 0, "text_delta"),
    ]
    assert translator.close() == b""


# --- the Anthropic SDK reads it -------------------------------------------------------------


@pytest.mark.parametrize("name", STREAMS)
def test_the_sdk_accumulates_the_message(name: str) -> None:
    raw, content, stop_reason, usage = STREAMS[name]
    out = translate([raw])
    expected = (content, stop_reason, usage)
    assert summary(accumulated(out)) == expected
    final = sdk_final(out)
    assert summary(final) == expected
    assert (final.id, final.model) == ("msg_1", MODEL)


def test_the_sdk_raises_the_mid_stream_error_with_its_body() -> None:
    with pytest.raises(anthropic.APIStatusError) as raised:
        sdk_final(translate([INPUTS["overload"]]))
    error = {"type": "overloaded_error", "message": "Overloaded"}
    assert raised.value.body == {"type": "error", "error": error}


# --- any split, each event at once ----------------------------------------------------------


@pytest.mark.parametrize("size", [1, 7])
@pytest.mark.parametrize("name", INPUTS)
def test_any_split_writes_the_same_bytes(name: str, size: int) -> None:
    raw = INPUTS[name]
    assert translate(steps(raw, size)) == translate([raw])


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(INPUTS)),
    cuts=cut_places(20_000, 40),
)
def test_random_splits_write_the_same_bytes(name: str, cuts: list[int]) -> None:
    raw = INPUTS[name]
    assert translate(cut_at(raw, cuts)) == translate([raw])


@pytest.mark.parametrize("name", sorted(set(INPUTS) - {"cut"}))
def test_each_event_leaves_in_the_feed_that_completes_its_chunk(name: str) -> None:
    translator = ChatToStream(message_id="msg_1", model=DOOR_MODEL, input_tokens=ESTIMATE)
    chunks, rest = decode([INPUTS[name]])
    assert rest == b""
    for item in chunks:
        assert translator.feed(item.raw[:-1]) == b""
        out = translator.feed(item.raw[-1:])
        if _usage_alone(item):  # kept for the message_delta, which [DONE] writes
            assert out == b"", item.raw
            continue
        assert out.endswith(b"\n\n"), item.raw
        for text in _texts(item):
            assert chat.dumps(text) in out


def _usage_alone(item: Any) -> bool:
    """A usage chunk (no choices): it writes no event of its own."""
    return item.data is not None and not item.is_done and item.json().get("choices") == []


def _texts(item: Any) -> list[str]:
    """The text and thinking a chat event carries."""
    if item.is_comment or item.is_done:
        return []
    deltas = [choice["delta"] for choice in item.json().get("choices", [])]
    return [t for d in deltas for t in (d.get("content"), d.get("reasoning_content")) if t]


_JSON = chat_json(
    [
        *("choices", "delta", "index", "finish_reason", "usage", "error", "message", "model"),
        *("content", "reasoning_content", "refusal", "thinking_blocks", "signature", "data"),
        *("tool_calls", "function", "arguments", "name", "id", "type"),
        *("prompt_tokens", "completion_tokens", "prompt_tokens_details", "cached_tokens"),
    ],
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_JSON, max_size=6), done=st.booleans())
@example(
    values=[
        {"choices": True},
        {"choices": [{"delta": {"tool_calls": "x", "thinking_blocks": 5}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": [1], "function": "f"}]}}]},
        {"choices": [{"delta": [], "finish_reason": ["stop"]}], "usage": {"prompt_tokens": "9"}},
    ],
    done=True,
)
def test_any_json_in_writes_anthropic_events_and_never_raises(
    values: list[Any], done: bool
) -> None:
    raw = b"".join(chat.event(v) for v in values) + (chat.DONE if done else b"")
    for data in events(translate([raw])):
        assert isinstance(data["type"], str)
