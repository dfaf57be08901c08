"""Gemini's whole answers and error answers as Chat Completions, and the URL of a call
(app/dialects/gemini.py, answer_from_gemini.py). A whole answer must say what the stream of the
same response says, as the OpenAI SDK accumulates it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.dialects import gemini
from app.dialects.answer_from_gemini import finish_reason
from llmgate_wire import sse

CREATED = 1_760_000_000

THINKING_AND_CALLS: dict[str, Any] = {
    "candidates": [
        {
            "content": {
                "parts": [
                    {"text": "Two lookups.", "thought": True},
                    {"text": "Looking "},
                    {"text": "both up."},
                    {
                        "functionCall": {"id": "fc-1", "name": "weather", "args": {"city": "Oslo"}},
                        "thoughtSignature": "U2ln",
                    },
                    {"functionCall": {"name": "clock", "args": {}}},
                ],
                "role": "model",
            },
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 500,
        "candidatesTokenCount": 30,
        "thoughtsTokenCount": 70,
        "cachedContentTokenCount": 256,
        "totalTokenCount": 600,
    },
    "modelVersion": "gemini-2.5-pro",
    "responseId": "r-9",
}


def _completion(response: dict[str, Any], fallback_id: str = "fb") -> dict[str, Any]:
    out = gemini.answer_to_chat(
        json.dumps(response).encode(), created=CREATED, fallback_id=fallback_id
    )
    value = json.loads(out)
    ChatCompletion.model_validate(value)
    return value


def test_a_whole_answer_with_thinking_and_calls() -> None:
    assert _completion(THINKING_AND_CALLS) == {
        "id": "r-9",
        "object": "chat.completion",
        "created": CREATED,
        "model": "gemini-2.5-pro",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Looking both up.",
                    "refusal": None,
                    "reasoning_content": "Two lookups.",
                    "thinking_blocks": [
                        {"type": "thinking", "thinking": "Two lookups.", "signature": "U2ln"}
                    ],
                    "tool_calls": [
                        {
                            "id": "fc-1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                        },
                        {
                            "id": "call_fb_1",
                            "type": "function",
                            "function": {"name": "clock", "arguments": "{}"},
                        },
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 500,
            "completion_tokens": 100,
            "total_tokens": 600,
            "prompt_tokens_details": {"cached_tokens": 256},
            "completion_tokens_details": {"reasoning_tokens": 70},
        },
    }


def _response(
    parts: list[dict[str, Any]] | None, reason: str | None, **extra: Any
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model"}, "index": 0}
    if parts is not None:
        candidate["content"]["parts"] = parts
    if reason:
        candidate["finishReason"] = reason
    return {"candidates": [candidate], **extra}


@pytest.mark.parametrize(
    ("response", "content", "reason"),
    [
        (_response([{"text": "Hi"}, {"text": " there"}], "STOP"), "Hi there", "stop"),
        (_response([{"text": "Cut"}], "MAX_TOKENS"), "Cut", "length"),
        (_response(None, "SAFETY"), None, "content_filter"),
        (_response([{"text": ""}], "RECITATION"), None, "content_filter"),
        ({"promptFeedback": {"blockReason": "OTHER"}}, None, "content_filter"),
        (_response([{"text": "x", "thought": True}], "STOP"), None, "stop"),
        (
            _response([{"inlineData": {"mimeType": "image/png", "data": "AA=="}}], None),
            None,
            "stop",
        ),
    ],
)
def test_content_and_finish_of_whole_answers(
    response: dict[str, Any], content: str | None, reason: str
) -> None:
    choice = _completion(response)["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (content, reason)
    assert "tool_calls" not in choice["message"]


def test_without_an_id_a_model_or_usage() -> None:
    value = _completion(_response([{"text": "Hi"}], "STOP"), fallback_id="chatcmpl-x")
    assert (value["id"], value["model"]) == ("chatcmpl-x", "")
    assert "usage" not in value


def test_a_body_that_is_not_json_raises() -> None:
    with pytest.raises(ValueError):
        gemini.answer_to_chat(b"<html>", created=CREATED, fallback_id="fb")


@pytest.mark.parametrize(
    ("reason", "called", "expected"),
    [
        ("STOP", False, "stop"),
        ("STOP", True, "tool_calls"),
        ("MAX_TOKENS", True, "length"),
        *[
            (r, False, "content_filter")
            for r in (
                "SAFETY",
                "RECITATION",
                "BLOCKLIST",
                "PROHIBITED_CONTENT",
                "SPII",
                "IMAGE_SAFETY",
            )
        ],
        ("LANGUAGE", False, "stop"),
        ("OTHER", True, "stop"),
        ("MALFORMED_FUNCTION_CALL", False, "stop"),
    ],
)
def test_finish_reasons(reason: str, called: bool, expected: str) -> None:
    assert finish_reason(reason, called) == expected


# -- the whole answer says what the stream of the same response says --------------------------


def _streamed(response: dict[str, Any]) -> Any:
    translator = gemini.StreamToChat(True, CREATED, "fb")
    out = (
        translator.feed(b"data: " + json.dumps(response).encode() + b"\r\n\r\n")
        + translator.close()
    )
    state = ChatCompletionStreamState()
    usage = None
    for event in sse.Decoder().feed(out):
        if not event.is_done:
            chunk = ChatCompletionChunk.model_validate(event.json())
            usage = chunk.usage or usage
            state.handle_chunk(chunk)
    return state.current_completion_snapshot, usage


def _calls(message: Any) -> list[tuple[str, str, str]]:
    calls = message.model_dump()["tool_calls"] or []
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]


@pytest.mark.parametrize(
    "response",
    [
        THINKING_AND_CALLS,
        _response([{"text": "Plain"}], "MAX_TOKENS", usageMetadata={"promptTokenCount": 3}),
        _response(
            [{"functionCall": {"name": "f", "args": {"deep": [{"a": "ü"}]}}}],
            "STOP",
            usageMetadata={"promptTokenCount": 3, "candidatesTokenCount": 4},
        ),
    ],
)
def test_the_whole_answer_is_the_stream_accumulated(response: dict[str, Any]) -> None:
    whole = ChatCompletion.model_validate(_completion(response))
    streamed, usage = _streamed(response)
    assert whole.id == streamed.id and whole.model == streamed.model
    got, want = streamed.choices[0], whole.choices[0]
    assert got.finish_reason == want.finish_reason
    assert (got.message.content or None) == want.message.content
    assert _calls(got.message) == _calls(want.message)
    assert (got.message.model_extra or {}).get("reasoning_content") == (
        want.message.model_extra or {}
    ).get("reasoning_content")
    assert usage == whole.usage


# -- errors ------------------------------------------------------------------------------------


def _error(message: str, type: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": None, "code": None}}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            429,
            b'{"error": {"code": 429, "message": "Resource has been exhausted", '
            b'"status": "RESOURCE_EXHAUSTED"}}',
            _error("Resource has been exhausted", "resource_exhausted"),
        ),
        (
            400,
            b'{"error": {"code": 400, "message": "* GenerateContentRequest.contents: contents is '
            b'not specified\\n", "status": "INVALID_ARGUMENT"}}',
            _error(
                "* GenerateContentRequest.contents: contents is not specified\n", "invalid_argument"
            ),
        ),
        (
            503,
            b'[{"error": {"code": 503, "message": "The model is overloaded.", '
            b'"status": "UNAVAILABLE"}}]',
            _error("The model is overloaded.", "unavailable"),
        ),
        (502, b"upstream connect error\n", _error("upstream connect error", "api_error")),
        (502, b"", _error("the upstream answered 502", "api_error")),
        (404, b'{"detail": "no"}', _error('{"detail": "no"}', "api_error")),
        (500, b'{"error": {"code": 500}}', _error('{"code": 500}', "api_error")),
    ],
)
def test_error_answers(status: int, body: bytes, expected: dict[str, Any]) -> None:
    got_status, got = gemini.error_to_chat(status, body)
    assert (got_status, json.loads(got)) == (status, expected)


# -- the URL -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "stream", "expected"),
    [
        ("gemini-2.5-flash", True, ("/models/gemini-2.5-flash:streamGenerateContent", "alt=sse")),
        ("gemini-2.5-flash", False, ("/models/gemini-2.5-flash:generateContent", "")),
        ("models/gemini-2.5-pro", False, ("/models/gemini-2.5-pro:generateContent", "")),
        (
            "sim/script=tools",
            True,
            ("/models/sim%2Fscript%3Dtools:streamGenerateContent", "alt=sse"),
        ),
        ("a b?c#d:e", False, ("/models/a%20b%3Fc%23d%3Ae:generateContent", "")),
    ],
)
def test_target(model: str, stream: bool, expected: tuple[str, str]) -> None:
    assert gemini.target(model, stream) == expected
