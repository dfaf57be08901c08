"""Gemini through the ``/v1/messages`` door: its thought signature there and back (issue 41,
F), and its error part-way (the smaller items of issue 41).

Gemini puts a turn's ``thoughtSignature`` on a part of the answer: the first text part (or
function call) after the thoughts, or, streamed, on a last chunk whose text part is empty.
Here raw ``alt=sse`` streams of both shapes (checked against google-genai's own types) go
through the gateway's translators as app/upstream/translation.py chains them (Gemini to
chat, chat to Anthropic's events), the Anthropic SDK accumulates the events, the message it
made goes back on the next turn (Messages to chat, chat to Gemini), and the signature must
reach Gemini as it was sent, on the turn's text. The first shape, streamed, must also read as
the same blocks as the whole answer does.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from google.genai import types as genai

from app.dialects import anthropic_door, gemini
from tests.support.sse_feed import decode, steps

SIG = "CsQBAdHtim9vK2Qm7Jx1c2lnbmF0dXJlLW9mLXRoZS10aG91Z2h0cw=="
THOUGHT = "**Weighing it**\n\nSix times seven is forty-two."
HEAD = '{"candidates": [{"content": {"parts": ['
TAIL = '"modelVersion": "gemini-2.5-flash","responseId": "r-sig"}'
USAGE = (
    '"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 5,'
    '"thoughtsTokenCount": 12,"totalTokenCount": 26}'
)


def _chunk(parts: list[dict[str, Any]], finish: bool = False) -> bytes:
    reason = ',"finishReason": "STOP"' if finish else ""
    usage = USAGE + "," if finish else ""
    body = HEAD + ",".join(json.dumps(p) for p in parts) + '],"role": "model"},"index": 0'
    return b"data: " + (body + reason + "}]," + usage + TAIL).encode() + b"\r\n\r\n"


# The signature on the first text part after the thoughts, as a whole answer has it too.
ON_THE_TEXT = [
    _chunk([{"text": THOUGHT, "thought": True}]),
    _chunk([{"text": "The answer", "thoughtSignature": SIG}]),
    _chunk([{"text": " is 42."}], finish=True),
]
# The signature in a last chunk of its own, on an empty text part, after the text.
LAST_AND_EMPTY = [
    _chunk([{"text": THOUGHT, "thought": True}]),
    _chunk([{"text": "The answer"}]),
    _chunk([{"text": " is 42."}]),
    _chunk([{"text": "", "thoughtSignature": SIG}], finish=True),
]
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def _door(pieces: list[bytes]) -> list[dict[str, Any]]:
    """The Anthropic events the door writes of Gemini's stream fed in ``pieces``."""
    first = gemini.StreamToChat(include_usage=True, created=1, fallback_id="f")
    door = anthropic_door.ChatToStream(message_id="msg_1", model="m", input_tokens=3)
    out = b"".join(door.feed(first.feed(p)) for p in pieces)
    out += door.feed(first.close()) + door.close()
    return [e.json() for e in decode([out])[0]]


def _sdk_message(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message the Anthropic SDK accumulates of the events, as it sends it back."""
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for data in events:
        if data["type"] != "ping":
            event = EVENT.validate_python(data)
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    content = [b.model_dump(exclude_none=True) for b in snapshot.content]
    return {"role": "assistant", "content": content}


def _sent_back(assistant: dict[str, Any]) -> list[dict[str, Any]]:
    """Gemini's contents for a next turn that carries ``assistant`` back."""
    turn = [
        {"role": "user", "content": "What is six times seven?"},
        assistant,
        {"role": "user", "content": "Sure?"},
    ]
    chat = anthropic_door.chat_body({"model": "m", "max_tokens": 50, "messages": turn})
    return gemini.request_body(chat)["contents"]


@pytest.mark.parametrize("stream", [ON_THE_TEXT, LAST_AND_EMPTY], ids=["on_text", "last_empty"])
def test_the_signature_goes_back_to_gemini_on_the_turns_text(stream: list[bytes]) -> None:
    for raw in stream:  # Gemini's own types read each chunk, the signature where it is put
        response = genai.GenerateContentResponse.model_validate_json(raw[6:].strip())
        assert response.candidates and response.candidates[0].content
    raw = b"".join(stream)
    for pieces in ([raw], steps(raw, 11)):
        contents = _sent_back(_sdk_message(_door(pieces)))
        assert contents[1] == {
            "role": "model",
            "parts": [{"text": "The answer is 42.", "thoughtSignature": SIG}],
        }


def test_streamed_the_blocks_are_those_of_the_whole_answer() -> None:
    """One thinking block holding the thought and its signature, then the text, as the whole
    answer (the same parts in one response) gives them."""
    parts: list[dict[str, Any]] = [
        {"text": THOUGHT, "thought": True},
        {"text": "The answer is 42.", "thoughtSignature": SIG},
    ]
    whole = _chunk(parts, finish=True)[6:].strip()
    chat = gemini.answer_to_chat(whole, created=1, fallback_id="f")
    message = json.loads(anthropic_door.chat_answer_to_message(chat, message_id="msg_1"))
    streamed = _sdk_message(_door([b"".join(ON_THE_TEXT)]))
    assert (
        streamed["content"]
        == message["content"]
        == [
            {"type": "thinking", "thinking": THOUGHT, "signature": SIG},
            {"type": "text", "text": "The answer is 42."},
        ]
    )


# Gemini's error chunk part-way (its documented error JSON: code, message, status), and what
# an OpenAI-compatible upstream sends for the same overload (the simulator's error-after).
GEMINI_ERRORS = {
    "UNAVAILABLE": "overloaded_error",
    "RESOURCE_EXHAUSTED": "rate_limit_error",
    "DEADLINE_EXCEEDED": "timeout_error",
    "INTERNAL": "api_error",
    "INVALID_ARGUMENT": "invalid_request_error",
    "FAILED_PRECONDITION": "invalid_request_error",
    "PERMISSION_DENIED": "permission_error",
    "UNAUTHENTICATED": "authentication_error",
    "NOT_FOUND": "not_found_error",
}


@pytest.mark.parametrize(("status", "expected"), GEMINI_ERRORS.items())
def test_a_gemini_error_part_way_is_anthropics_error_of_the_same_meaning(
    status: str, expected: str
) -> None:
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": status}}
    raw = ON_THE_TEXT[0] + b"data: " + json.dumps(error).encode() + b"\r\n\r\n"
    assert _door([raw])[-1] == {
        "type": "error",
        "error": {"type": expected, "message": "The model is overloaded."},
    }


def test_an_overload_part_way_reads_the_same_from_gemini_and_from_an_openai_upstream() -> None:
    gemini_error = {"error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}}
    from_gemini = _door(
        [ON_THE_TEXT[0] + b"data: " + json.dumps(gemini_error).encode() + b"\r\n\r\n"]
    )
    door = anthropic_door.ChatToStream(message_id="msg_1", model="m", input_tokens=3)
    openai_error = {
        "message": "Overloaded",
        "type": "overloaded_error",
        "param": None,
        "code": None,
    }
    raw = b"data: " + json.dumps({"error": openai_error}).encode() + b"\n\n"
    from_openai = [e.json() for e in decode([door.feed(raw)])[0]]
    assert (
        from_gemini[-1]
        == from_openai[-1]
        == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
        }
    )
