"""Anthropic's prompt cache counts in the Chat Completions usage it is translated to
(app/dialects/answer_from_anthropic.py, app/dialects/chat.py): reads as
``cached_tokens``, writes as ``cache_write_tokens`` and, of those, the ones written for an
hour (priced apart: app/tenancy/prices.py) as ``cache_write_1h_tokens``, named only when
there are some; whole and streamed, the split kept from ``message_start`` when a later
``message_delta`` does not repeat it."""

from __future__ import annotations

import json
from typing import Any

from app.dialects import chat
from app.dialects.answer_from_anthropic import StreamToChat, answer_to_chat, usage

SPLIT = {"ephemeral_5m_input_tokens": 70, "ephemeral_1h_input_tokens": 30}
COUNTS = {
    "input_tokens": 5,
    "cache_read_input_tokens": 200,
    "cache_creation_input_tokens": 100,
    "cache_creation": SPLIT,
    "output_tokens": 9,
}
DETAILS = {"cached_tokens": 200, "cache_write_tokens": 100, "cache_write_1h_tokens": 30}


def test_the_hours_writes_are_named_apart_only_when_there_are_some() -> None:
    assert usage(COUNTS) == {
        "prompt_tokens": 305,
        "completion_tokens": 9,
        "total_tokens": 314,
        "prompt_tokens_details": DETAILS,
    }
    five = {**COUNTS, "cache_creation": {**SPLIT, "ephemeral_1h_input_tokens": 0}}
    assert usage(five)["prompt_tokens_details"] == {"cached_tokens": 200, "cache_write_tokens": 100}
    assert (
        "cache_write_1h_tokens"
        not in usage({**COUNTS, "cache_creation": None})["prompt_tokens_details"]
    )
    assert chat.usage(3, 1, cache_creation_1h=0)["prompt_tokens_details"] == {"cached_tokens": 0}
    assert chat.usage(3, 1, cache_creation=2, cache_creation_1h=1)["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": 2,
        "cache_write_1h_tokens": 1,
    }


def test_a_whole_answer_carries_the_split() -> None:
    body = {"id": "m", "model": "c", "content": [], "stop_reason": "end_turn", "usage": COUNTS}
    out = json.loads(answer_to_chat(json.dumps(body).encode(), created=1))
    assert out["usage"]["prompt_tokens_details"] == DETAILS


def _event(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def _stream_usage(final: dict[str, Any]) -> dict[str, Any]:
    start = {"id": "m", "model": "c", "usage": {**COUNTS, "output_tokens": 1}}
    raw = (
        _event("message_start", message=start)
        + _event("message_delta", delta={"stop_reason": "end_turn"}, usage=final)
        + _event("message_stop")
    )
    out = StreamToChat(True, 1).feed(raw)
    chunks = [json.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    (found,) = [c["usage"] for c in chunks if c.get("usage")]
    return found


def test_a_stream_keeps_the_split_of_its_start_and_takes_a_later_one() -> None:
    assert _stream_usage({"output_tokens": 9})["prompt_tokens_details"] == DETAILS
    later = {**COUNTS, "cache_creation": {**SPLIT, "ephemeral_1h_input_tokens": 40}}
    assert _stream_usage(later)["prompt_tokens_details"]["cache_write_1h_tokens"] == 40
    # A split that is not an object is no split: the start's stands.
    assert _stream_usage({"output_tokens": 9, "cache_creation": 7})["prompt_tokens_details"] == (
        DETAILS
    )
