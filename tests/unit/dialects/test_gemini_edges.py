"""Gemini answers at their edges: members of the wrong type, empty or unspecified reasons,
candidate-less chunks, errors that are no objects, several thoughts before a signature.

Each case gives the exact chunks it must: the expected ones are written with chat.py's
ChunkWriter, the canonical shape test_gemini.py checks against the OpenAI SDK.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.dialects import chat
from app.dialects.answer_from_gemini import answer_to_chat, error_to_chat
from app.dialects.gemini import StreamToChat

CREATED = 1_760_000_000
FALLBACK = "fb7"


def ev(response: Any) -> bytes:
    return b"data: " + json.dumps(response).encode() + b"\r\n\r\n"


def parts(*items: Any, finish: str | None = None, **members: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": list(items), "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], **members}


def translate(*responses: Any, include_usage: bool = False) -> bytes:
    translator = StreamToChat(include_usage, CREATED, FALLBACK)
    return b"".join(translator.feed(ev(r)) for r in responses) + translator.close()


def writer() -> chat.ChunkWriter:
    return chat.ChunkWriter(FALLBACK, CREATED, "")


def test_unspecified_or_empty_reasons_and_chunks_without_candidates_do_not_finish() -> None:
    w = writer()
    expected = w.role() + w.text("a") + w.text("b") + w.finish(chat.STOP) + chat.DONE
    out = translate(
        parts({"text": "a"}, finish="FINISH_REASON_UNSPECIFIED"),
        {"candidates": [], "promptFeedback": {}},
        {"candidates": ["no object"]},
        {"modelVersion": "ignored after the first chunk"},
        parts({"text": "b"}, finish=""),
        parts(finish="STOP"),
    )
    assert out == expected


def test_a_prompt_blocked_before_any_candidate_is_filtered() -> None:
    w = writer()
    out = translate({"candidates": [], "promptFeedback": {"blockReason": "OTHER"}})
    assert out == w.role() + w.finish(chat.CONTENT_FILTER) + chat.DONE


def test_parts_that_are_no_objects_and_signatures_that_are_no_strings_are_skipped() -> None:
    w = writer()
    expected = w.role() + w.text("kept") + w.finish(chat.STOP) + chat.DONE
    out = translate(parts("junk", {"text": "kept", "thoughtSignature": 5}, finish="STOP"))
    assert out == expected
    empty = translate(parts({"text": "kept", "thoughtSignature": ""}, finish="STOP"))
    assert empty == expected  # an empty signature is none


@pytest.mark.parametrize(
    ("error", "message", "kind"),
    [
        ("boom", "boom", "api_error"),
        ({"message": 5, "status": 3}, json.dumps({"message": 5, "status": 3}), "api_error"),
    ],
)
def test_a_stream_error_whose_members_are_not_strings(error: Any, message: str, kind: str) -> None:
    assert translate({"error": error}) == chat.error_event(message, kind)


def test_a_whole_answer_with_a_call_and_no_finish_reason_finishes_with_tool_calls() -> None:
    body = json.dumps(parts({"functionCall": {"name": "f", "args": {}}})).encode()
    answer = json.loads(answer_to_chat(body, created=CREATED, fallback_id=FALLBACK))
    assert answer["choices"][0]["finish_reason"] == chat.TOOL_CALLS


def test_a_thinking_block_holds_every_thought_before_its_signature() -> None:
    body = json.dumps(
        parts(
            {"text": "one, ", "thought": True},
            {"text": "two", "thought": True, "thoughtSignature": "sig"},
            finish="STOP",
        )
    ).encode()
    message = json.loads(answer_to_chat(body, created=CREATED, fallback_id=FALLBACK))["choices"][0][
        "message"
    ]
    assert message["reasoning_content"] == "one, two"
    assert message["thinking_blocks"] == [
        {"type": "thinking", "thinking": "one, two", "signature": "sig"}
    ]


def test_an_error_page_that_is_not_utf8_is_still_its_message() -> None:
    status, body = error_to_chat(502, b"\xffbad gateway\xfe\n")
    assert status == 502
    assert json.loads(body)["error"]["message"] == "\ufffdbad gateway\ufffd"
