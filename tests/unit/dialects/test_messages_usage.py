"""The usage of a Chat Completions stream as the ``/v1/messages`` door writes it (issue 41, H
and B): the raw streams below are what OpenAI-compatible servers send, written out byte for
byte (each chunk checked with the OpenAI SDK's own type). Some put the cumulative ``usage``
on every chunk; some ignore ``stream_options.include_usage`` and send none. Either way the
door writes one ``message_delta``, after every block ended, with the stop reason and the
upstream's latest counts, or, when none came, estimates, and says which
(``usage_reported``). The Anthropic SDK reads the result.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk

from app.dialects.anthropic_door import ChatToStream
from tests.support.sse_feed import decode, steps

HEAD = '{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"m-up",'


def _chunk(delta: str, finish: str = "null", usage: str = "") -> bytes:
    choices = '"choices":[{"index":0,"delta":' + delta + ',"logprobs":null,"finish_reason":'
    usage_member = ',"usage":' + usage if usage else ""
    return ("data: " + HEAD + choices + finish + "}]" + usage_member + "}\n\n").encode()


def _usage(prompt: int, completion: int) -> str:
    total = prompt + completion
    return f'{{"prompt_tokens":{prompt},"total_tokens":{total},"completion_tokens":{completion}}}'


DONE = b"data: [DONE]\n\n"
# A server that puts the cumulative usage on every chunk (vLLM's continuous usage stats, and
# others), then a usage chunk of its own.
EVERY_CHUNK = (
    _chunk('{"role":"assistant","content":""}', usage=_usage(12, 0))
    + _chunk('{"content":"Hello"}', usage=_usage(12, 1))
    + _chunk('{"content":","}', usage=_usage(12, 2))
    + _chunk('{"content":" world"}', usage=_usage(12, 3))
    + _chunk("{}", '"stop"', usage=_usage(12, 3))
    + ("data: " + HEAD + '"choices":[],"usage":' + _usage(12, 4) + "}\n\n").encode()
    + DONE
)
# The same, its last count on the finish chunk, no usage chunk after it.
ON_THE_FINISH = b"".join(EVERY_CHUNK.split(b"\n\n")[i] + b"\n\n" for i in range(5)) + DONE
# A server that ignores include_usage: text, then a tool call's fragments; no usage at all.
NO_USAGE = (
    _chunk('{"role":"assistant","content":""}')
    + _chunk('{"content":"Looking up the weather"}')  # 22 bytes
    + _chunk(
        '{"tool_calls":[{"index":0,"id":"call_1","type":"function",'
        '"function":{"name":"get_weather","arguments":""}}]}'
    )
    + _chunk('{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": "}}]}')  # 10
    + _chunk('{"tool_calls":[{"index":0,"function":{"arguments":"\\"Zürich\\"}"}}]}')  # 10
    + _chunk("{}", '"tool_calls"')
    + DONE
)
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def _translate(raw: bytes, size: int | None = None) -> tuple[list[dict[str, Any]], ChatToStream]:
    door = ChatToStream(message_id="msg_1", model="m", input_tokens=40)
    out = b"".join(door.feed(p) for p in (steps(raw, size) if size else [raw])) + door.close()
    return [e.json() for e in decode([out])[0]], door


def _sdk_message(events: list[dict[str, Any]]) -> Any:
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for data in events:
        snapshot = accumulate_event(
            event=EVENT.validate_python(data), current_snapshot=snapshot, json_bufs=bufs
        )
    return snapshot


@pytest.mark.parametrize("raw", [EVERY_CHUNK, ON_THE_FINISH, NO_USAGE])
def test_the_raw_streams_are_chat_completions_chunks(raw: bytes) -> None:
    for event in decode([raw])[0]:
        if not event.is_done:
            ChatCompletionChunk.model_validate(event.json())


@pytest.mark.parametrize(("raw", "output"), [(EVERY_CHUNK, 4), (ON_THE_FINISH, 3)])
def test_usage_on_every_chunk_is_one_message_delta_after_the_blocks(
    raw: bytes, output: int
) -> None:
    events, door = _translate(raw, 5)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 12,
        "output_tokens": output,  # the latest count
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    message = _sdk_message(events)
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello, world")]
    assert (message.stop_reason, message.usage.output_tokens) == ("end_turn", output)
    assert door.usage_reported


def test_no_usage_from_the_upstream_is_an_estimate_of_the_output_not_zero() -> None:
    """A quarter of the bytes of text and arguments relayed (22 + 10 + 10), rounded up: 11;
    the prompt's estimate as the door was given it."""
    events, door = _translate(NO_USAGE)
    delta = events[-2]
    assert delta["type"] == "message_delta"
    assert delta["usage"] == {"input_tokens": 40, "output_tokens": 11}
    message = _sdk_message(events)
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"city": "Zürich"}
    assert message.usage.output_tokens == 11
    assert not door.usage_reported


def test_usage_reported_turns_true_with_the_upstreams_first_count() -> None:
    door = ChatToStream(message_id="msg_1", model="m", input_tokens=40)
    first, second, *_ = EVERY_CHUNK.split(b"\n\n")
    assert not door.usage_reported
    door.feed(_chunk('{"role":"assistant","content":""}', usage="null"))
    assert not door.usage_reported  # a null usage member is none
    door.feed(first + b"\n\n")
    assert door.usage_reported
    assert json.loads(second.removeprefix(b"data: "))["usage"]["completion_tokens"] == 1
