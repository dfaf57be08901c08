"""A Chat Completions stream at its edges as Anthropic's events: members of the wrong type,
choices without an index or out of order, the other names servers use (``reasoning``,
``refusal``), a signature with no thought before it, chunks after ``[DONE]``.

Each case lists the events' data it must give, in order (the stream's common shapes, with
the Anthropic SDK reading them, are in test_messages_stream.py).
"""

from __future__ import annotations

import json
from typing import Any

from app.dialects import chat
from app.dialects.stream_to_anthropic import ChatToStream
from tests.support.anthropic_events import message_start

DOOR_MODEL = "claude-door"
ESTIMATE = 10


def chunk(*choices: Any, **members: Any) -> bytes:
    return chat.event(
        {"id": "c1", "object": "chat.completion.chunk", "choices": list(choices), **members}
    )


def choice(delta: dict[str, Any], finish: str | None = None, **members: Any) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": finish, **members}


def datas(*pieces: bytes) -> list[dict[str, Any]]:
    """The data of each event written (each event is ``event: <type>`` then its data)."""
    translator = ChatToStream(message_id="msg_1", model=DOOR_MODEL, input_tokens=ESTIMATE)
    out = b"".join(translator.feed(p) for p in pieces) + translator.close()
    found = []
    for raw in out.split(b"\n\n")[:-1]:
        name, data = raw.split(b"\n")
        found.append(json.loads(data.removeprefix(b"data: ")))
        assert name == b"event: " + found[-1]["type"].encode()
    return found


def start(model: str = DOOR_MODEL) -> dict[str, Any]:
    return message_start(model, ESTIMATE)


def block(index: int, content_block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content_block}


def delta(index: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": payload}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(stop_reason: str = "end_turn", *open: int, output: int = 0) -> list[dict[str, Any]]:
    """[DONE] without usage: the open blocks end, then the estimates (``output``: a quarter
    of the bytes of text, thinking and arguments relayed, rounded up) and message_stop."""
    return [
        *(stop(i) for i in open),
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"input_tokens": ESTIMATE, "output_tokens": output},
        },
        {"type": "message_stop"},
    ]


TEXT = {"type": "text", "text": ""}
THINKING = {"type": "thinking", "thinking": "", "signature": ""}


def test_a_choice_without_index_is_the_first_and_other_choices_are_skipped() -> None:
    out = datas(
        chunk({"delta": {"content": "a"}}, model=7),
        chunk(choice({"content": "other"}, index=1), choice({"content": "b"})),
        chat.DONE,
    )
    assert out == [
        start(),
        block(0, TEXT),
        delta(0, {"type": "text_delta", "text": "a"}),
        delta(0, {"type": "text_delta", "text": "b"}),
        *end("end_turn", 0, output=1),  # 2 bytes
    ]


def test_members_that_are_not_strings_give_nothing() -> None:
    out = datas(chunk(choice({"content": 7, "reasoning_content": ["x"], "refusal": {}})), chat.DONE)
    assert out == [start(), *end()]


def test_reasoning_refusal_and_thinking_blocks_by_their_other_names() -> None:
    out = datas(
        chunk(choice({"reasoning": "r1"})),
        chunk(
            choice(
                {
                    "thinking_blocks": [
                        "junk",
                        {"type": "thinking", "thinking": "r2", "signature": "s1"},
                        {"type": "redacted_thinking"},
                    ]
                }
            )
        ),
        chunk(choice({"refusal": "no"})),
        chat.DONE,
    )
    assert out == [
        start(),
        block(0, THINKING),
        delta(0, {"type": "thinking_delta", "thinking": "r1"}),
        delta(0, {"type": "thinking_delta", "thinking": "r2"}),
        delta(0, {"type": "signature_delta", "signature": "s1"}),
        stop(0),
        block(1, {"type": "redacted_thinking", "data": ""}),
        stop(1),
        block(2, TEXT),
        delta(2, {"type": "text_delta", "text": "no"}),
        *end("end_turn", 2, output=2),  # 6 bytes: r1, r2, no
    ]


def test_a_signature_with_no_thought_before_it_opens_its_own_block() -> None:
    out = datas(
        chunk(choice({"content": "a"})),
        chunk(choice({"thinking_blocks": [{"type": "thinking", "signature": "s"}]})),
        chat.DONE,
    )
    assert out == [
        start(),
        block(0, TEXT),
        delta(0, {"type": "text_delta", "text": "a"}),
        stop(0),
        block(1, THINKING),
        delta(1, {"type": "signature_delta", "signature": "s"}),
        stop(1),
        *end(output=1),  # the text's byte; a signature is no output text
    ]


def test_a_tool_call_without_index_id_or_name() -> None:
    call = {"function": {"arguments": "{}"}}
    out = datas(chunk(choice({"tool_calls": [call]})), chat.DONE)
    assert out == [
        start(),
        block(0, {"type": "tool_use", "id": "msg_1_0", "name": "", "input": {}}),
        delta(0, {"type": "input_json_delta", "partial_json": "{}"}),
        *end("tool_use", 0, output=1),
    ]


def test_events_without_data_or_json_are_skipped_and_a_null_error_is_no_error() -> None:
    out = datas(
        b"id: 1\n\n",
        b"data: not json\n\n",
        chunk(choice({"content": "a"}), error=None),
        chat.DONE,
    )
    assert out == [
        start(),
        block(0, TEXT),
        delta(0, {"type": "text_delta", "text": "a"}),
        *end("end_turn", 0, output=1),
    ]


def test_nothing_after_done() -> None:
    out = datas(chat.DONE, chunk(choice({"content": "late"})), chat.DONE)
    assert out == [start(), *end()]


def test_an_error_without_message() -> None:
    out = datas(chat.event({"error": {}}))
    assert out == [
        {"type": "error", "error": {"type": "api_error", "message": "The upstream failed"}}
    ]
