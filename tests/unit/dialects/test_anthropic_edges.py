"""Anthropic answers at their edges: members missing, pieces empty, events out of place.

The fixtures' streams and answers are whole and well formed; these are the answers a server
may still send (a block without its optional members, an event before ``message_start`` or
after ``message_stop``, an error event without a message), each with the exact bytes it
must give. The expected chunks are written with chat.py's ChunkWriter: the translator
promises chat.py's canonical shape, which tests/unit/dialects/test_anthropic_stream.py checks
against the OpenAI SDK.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.errors import UpstreamProtocolError
from app.dialects import chat
from app.dialects.answer_from_anthropic import finish_reason, usage
from app.dialects.anthropic import StreamToChat, answer_to_chat, error_to_chat

CREATED = 1_700_000_000
START = {"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {}}}


def ev(data: dict[str, Any], name: str | None = None) -> bytes:
    """One named SSE event; the name is the data's type unless given."""
    return (
        b"event: "
        + (name or data["type"]).encode()
        + b"\ndata: "
        + json.dumps(data).encode()
        + b"\n\n"
    )


def writer() -> chat.ChunkWriter:
    return chat.ChunkWriter("msg_1", CREATED, "claude-x")


def translate(*events: bytes, include_usage: bool = False) -> bytes:
    translator = StreamToChat(include_usage, CREATED)
    return b"".join(translator.feed(e) for e in events) + translator.close()


def block_start(block: dict[str, Any], index: int = 0) -> bytes:
    return ev({"type": "content_block_start", "index": index, "content_block": block})


def delta(payload: dict[str, Any], index: int = 0) -> bytes:
    return ev({"type": "content_block_delta", "index": index, "delta": payload})


def test_a_block_that_starts_with_its_content_gives_it_at_once() -> None:
    w = writer()
    role = w.role()
    k, tool = w.tool_start("toolu_1", "f")
    expected = role + w.reasoning("seed") + tool + w.tool_arguments(k, '{"x":"é"}')
    out = translate(
        ev(START),
        block_start({"type": "thinking", "thinking": "seed", "signature": ""}),
        block_start({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": "é"}}, 1),
    )
    assert out == expected


def test_only_a_tool_call_that_got_no_fragment_gets_empty_arguments_at_its_stop() -> None:
    """A call without arguments gets ``{}`` at its block's stop, once; a call that started
    with its input, a text block's stop, a stop of no known block (or an index that is no
    integer) and a second stop give nothing."""
    w = writer()
    role = w.role()
    k, with_input = w.tool_start("toolu_1", "f")
    with_input += w.tool_arguments(k, '{"x":1}')
    j, empty = w.tool_start("toolu_2", "g")
    expected = role + with_input + empty + w.tool_arguments(j, "{}")
    stop = {"type": "content_block_stop"}
    out = translate(
        ev(START),
        block_start({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}),
        ev({**stop, "index": 0}),
        block_start({"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}}, 1),
        ev({**stop, "index": [1]}),
        ev({**stop, "index": 7}),
        ev({**stop, "index": 1}),
        ev({**stop, "index": 1}),
    )
    assert out == expected


def test_blocks_without_their_optional_members_give_empty_strings() -> None:
    w = writer()
    expected = w.role() + w.redacted("") + w.tool_start("", "")[1]
    out = translate(
        ev(START), block_start({"type": "redacted_thinking"}), block_start({"type": "tool_use"}, 1)
    )
    assert out == expected


def test_empty_pieces_give_no_chunk() -> None:
    out = translate(
        ev(START),
        block_start({"type": "thinking", "thinking": "", "signature": ""}),
        delta({"type": "thinking_delta", "thinking": ""}),
        delta({"type": "signature_delta", "signature": ""}),
        delta({"type": "text_delta", "text": "", "thinking": "t", "signature": "s"}),
    )
    assert out == writer().role()


def test_a_message_start_without_id_or_model_and_a_second_one() -> None:
    w = chat.ChunkWriter("", CREATED, "")
    out = translate(ev({"type": "message_start", "message": {}}), ev(START))
    assert out == w.role()


def test_the_event_name_gives_the_type_when_the_data_has_none() -> None:
    assert translate(ev({}, "ping")) == chat.PING


def test_comments_non_objects_and_early_or_unknown_events_give_nothing() -> None:
    out = translate(
        b": keepalive\n\n",
        b"event: x\ndata: not json\n\n",
        b"data: [1, 2]\n\n",
        delta({"type": "text_delta", "text": "too early"}),
        ev(START),
        ev({"type": "brand_new_event"}),
    )
    assert out == writer().role()


def test_nothing_after_message_stop_even_in_later_feeds() -> None:
    w = writer()
    expected = w.role() + w.finish(chat.STOP) + chat.DONE
    out = translate(
        ev(START),
        ev({"type": "message_stop"}),
        delta({"type": "text_delta", "text": "late"}),
        ev({"type": "message_stop"}),
    )
    assert out == expected


def test_an_error_event_without_message_or_type() -> None:
    out = translate(ev(START), ev({"type": "error", "error": {}}))
    assert out == writer().role() + chat.error_event("The upstream's stream failed.", "api_error")


def test_a_whole_answer_without_its_optional_members() -> None:
    body = json.dumps(
        {
            "content": [
                {"type": "text"},
                {"type": "thinking"},
                {"type": "redacted_thinking"},
                {"type": "tool_use", "input": {}},
            ],
            "stop_reason": ["not", "a", "string"],
        }
    ).encode()
    answer = json.loads(answer_to_chat(body, created=CREATED))
    assert (answer["id"], answer["model"]) == ("", "")
    message = answer["choices"][0]["message"]
    assert message["content"] == ""
    assert message["reasoning_content"] == ""
    assert message["thinking_blocks"] == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "redacted_thinking", "data": ""},
    ]
    assert message["tool_calls"] == [
        {"id": "", "type": "function", "function": {"name": "", "arguments": "{}"}}
    ]
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>", "The Anthropic upstream's answer is not JSON."),
        (b"[1]", "The Anthropic upstream's answer is not a JSON object."),
    ],
)
def test_an_answer_that_is_no_message_says_why(body: bytes, message: str) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        answer_to_chat(body, created=CREATED)
    assert str(caught.value) == message


def test_null_counts_are_zero_and_unhashable_stop_reasons_are_stop() -> None:
    assert usage({"input_tokens": None, "output_tokens": None}) == chat.usage(
        0, 0, cached=0, cache_creation=0
    )
    assert finish_reason({"a": 1}) == chat.STOP


@pytest.mark.parametrize(
    ("body", "message", "kind"),
    [
        (
            b'{"error": {"message": 42, "type": 7}}',
            '{"error": {"message": 42, "type": 7}}',
            "api_error",
        ),
        (b"\xffbad gateway\xfe ", "\ufffdbad gateway\ufffd", "api_error"),
    ],
)
def test_an_error_answer_whose_members_are_not_strings(
    body: bytes, message: str, kind: str
) -> None:
    status, out = error_to_chat(502, body)
    assert status == 502
    assert json.loads(out)["error"]["message"] == message
    assert json.loads(out)["error"]["type"] == kind
