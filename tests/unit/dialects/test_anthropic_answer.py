"""Whole Anthropic answers and error answers as Chat Completions ones.

Each Anthropic answer here parses as the Anthropic SDK's ``Message`` (so it is the real
format), and each translation as the OpenAI SDK's ``ChatCompletion`` or ``ErrorObject``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject

from app.core.errors import UpstreamProtocolError
from app.dialects.anthropic import answer_to_chat, error_to_chat

CREATED = 1_700_000_000


def message(content: list[dict[str, Any]], stop_reason: str = "end_turn", **usage: int) -> bytes:
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 20, **usage},
    }
    Message.model_validate(answer)
    return json.dumps(answer).encode()


def chat(body: bytes) -> dict[str, Any]:
    answer = json.loads(answer_to_chat(body, created=CREATED))
    ChatCompletion.model_validate(answer)
    return answer


def test_a_whole_answer_with_thinking_text_and_tool_calls() -> None:
    body = message(
        [
            {"type": "thinking", "thinking": "First, ", "signature": "sig1"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "thinking", "thinking": "then.", "signature": "sig2"},
            {"type": "text", "text": "Calling "},
            {"type": "text", "text": "two tools."},
            {"type": "tool_use", "id": "toolu_a", "name": "f", "input": {"x": [1, "ü"]}},
            {"type": "tool_use", "id": "toolu_b", "name": "g", "input": {}},
        ],
        "tool_use",
        cache_read_input_tokens=300,
        cache_creation_input_tokens=7,
    )
    assert chat(body) == {
        "id": "msg_1",
        "object": "chat.completion",
        "created": CREATED,
        "model": "claude-sonnet-4-5",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Calling two tools.",
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": "toolu_a",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"x":[1,"ü"]}'},
                        },
                        {
                            "id": "toolu_b",
                            "type": "function",
                            "function": {"name": "g", "arguments": "{}"},
                        },
                    ],
                    "reasoning_content": "First, then.",
                    "thinking_blocks": [
                        {"type": "thinking", "thinking": "First, ", "signature": "sig1"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "thinking", "thinking": "then.", "signature": "sig2"},
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 317,
            "completion_tokens": 20,
            "total_tokens": 337,
            "prompt_tokens_details": {"cached_tokens": 300, "cache_write_tokens": 7},
        },
    }


def test_a_text_answer_has_no_tool_or_thinking_fields() -> None:
    (choice,) = chat(message([{"type": "text", "text": "Hi."}]))["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hi.", "refusal": None}
    assert choice["finish_reason"] == "stop"


def test_an_answer_of_tool_calls_only_has_no_content() -> None:
    tool = {"type": "tool_use", "id": "t", "name": "f", "input": {"q": 'a "b"'}}
    (choice,) = chat(message([tool], "tool_use"))["choices"]
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == tool["input"]


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [("max_tokens", "length"), ("refusal", "content_filter"), ("stop_sequence", "stop")],
)
def test_stop_reasons(stop_reason: str, finish: str) -> None:
    (choice,) = chat(message([{"type": "text", "text": "x"}], stop_reason))["choices"]
    assert choice["finish_reason"] == finish


@pytest.mark.parametrize("body", [b"<html>oops</html>", b"[1, 2]", b""])
def test_an_answer_that_is_not_a_message_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        answer_to_chat(body, created=CREATED)


def _anthropic_error(kind: str, text: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": text}}).encode()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            _anthropic_error("invalid_request_error", "max_tokens: Field required"),
            (400, "max_tokens: Field required", "invalid_request_error"),
        ),
        (
            529,
            _anthropic_error("overloaded_error", "Overloaded"),
            (503, "Overloaded", "overloaded_error"),
        ),
        (
            429,
            _anthropic_error("rate_limit_error", "Slow down"),
            (429, "Slow down", "rate_limit_error"),
        ),
        (
            401,
            _anthropic_error("authentication_error", "invalid x-api-key"),
            (401, "invalid x-api-key", "authentication_error"),
        ),
        (
            502,
            b"<html><body>Bad Gateway</body></html>\n",
            (502, "<html><body>Bad Gateway</body></html>", "api_error"),
        ),
        (500, b"", (500, "The Anthropic upstream answered HTTP 500.", "api_error")),
        (
            503,
            b'{"message": "not Anthropic\'s shape"}',
            (503, '{"message": "not Anthropic\'s shape"}', "api_error"),
        ),
    ],
)
def test_errors(status: int, body: bytes, expected: tuple[int, str, str]) -> None:
    got_status, got = error_to_chat(status, body)
    error = json.loads(got)["error"]
    ErrorObject.model_validate(error)
    assert (got_status, error["message"], error["type"]) == expected
    assert (error["param"], error["code"]) == (None, None)


def test_a_long_error_page_is_cut() -> None:
    _, got = error_to_chat(502, b"x" * 100_000)
    assert json.loads(got)["error"]["message"] == "x" * 2000
