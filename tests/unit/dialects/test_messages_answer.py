"""app/dialects/answer_to_anthropic.py: a whole chat.completion as an Anthropic message, and
Anthropic's errors. Each is also read by the Anthropic SDK (over an HTTP mock transport): the
message as its Message, an error as the exception its status makes, with the body kept."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types.shared import ErrorResponse
from hypothesis import given, settings

from app.core.errors import ModelNotServed, UpstreamProtocolError
from app.dialects import chat
from app.dialects.answer_to_anthropic import UNPARSED
from app.dialects.anthropic_door import (
    chat_answer_to_message,
    error_body,
    error_event,
    error_from_chat,
)
from tests.support.strategies import chat_json


def completion(message: dict[str, Any], finish: Any = "stop", **members: Any) -> bytes:
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-up",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": chat.usage(100, 20, cached=30, cache_creation=10),
    }
    return json.dumps({**answer, **members}).encode()


def translated(message: dict[str, Any], finish: Any = "stop", **members: Any) -> dict[str, Any]:
    out = chat_answer_to_message(completion(message, finish, **members), message_id="msg_1")
    return dict(json.loads(out))


def sdk_client(body: bytes, status: int = 200) -> Any:
    """The Anthropic SDK, served ``body`` (JSON) by an HTTP mock transport."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        headers = {"content-type": "application/json"}
        return httpx2.Response(status, headers=headers, content=body)

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    return anthropic.Anthropic(
        api_key="k", base_url="http://door.test", max_retries=0, http_client=http
    )


def sdk_create(body: bytes, status: int = 200) -> Any:
    with sdk_client(body, status) as client:
        return client.messages.create(
            model="claude-door", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )


FULL = {
    "role": "assistant",
    "content": "It is sunny.",
    "reasoning_content": "The user wants the weather.",
    "thinking_blocks": [
        {"type": "thinking", "thinking": "The user wants", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "thinking", "thinking": " the weather.", "signature": "sig-2"},
    ],
    "tool_calls": [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": ""}},
    ],
}


def test_a_completion_is_an_anthropic_message() -> None:
    assert translated(FULL, "tool_calls") == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "gpt-up",
        "content": [
            {"type": "thinking", "thinking": "The user wants", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "thinking", "thinking": " the weather.", "signature": "sig-2"},
            {"type": "text", "text": "It is sunny."},
            {
                "type": "tool_use",
                "id": "call_a",
                "name": "get_weather",
                "input": {"city": "Zürich"},
            },
            {"type": "tool_use", "id": "call_b", "name": "now", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 60,
            "output_tokens": 20,
            "cache_read_input_tokens": 30,
            "cache_creation_input_tokens": 10,
        },
    }


def test_the_sdk_reads_the_message() -> None:
    message = sdk_create(chat_answer_to_message(completion(FULL, "tool_calls"), message_id="m"))
    assert [b.type for b in message.content] == [
        "thinking",
        "redacted_thinking",
        "thinking",
        "text",
        "tool_use",
        "tool_use",
    ]
    assert message.content[4].input == {"city": "Zürich"}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (60, 30)


def test_reasoning_content_alone_is_one_thinking_block() -> None:
    got = translated({"role": "assistant", "content": "Hi.", "reasoning_content": "Hmm."})
    assert got["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": ""},
        {"type": "text", "text": "Hi."},
    ]


def test_reasoning_content_fills_a_thinking_block_that_came_with_its_signature_alone() -> None:
    message = {
        "role": "assistant",
        "content": "Hi.",
        "reasoning_content": "Hmm.",
        "thinking_blocks": [{"type": "thinking", "thinking": "", "signature": "sig-1"}],
    }
    assert translated(message)["content"][0] == {
        "type": "thinking",
        "thinking": "Hmm.",
        "signature": "sig-1",
    }


def test_a_refusal_text_is_text_and_null_content_is_none() -> None:
    got = translated({"role": "assistant", "content": None, "refusal": "I can't."})
    assert got["content"] == [{"type": "text", "text": "I can't."}]
    assert translated({"role": "assistant", "content": None})["content"] == []


@pytest.mark.parametrize(
    ("finish", "stop_reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
        ("something_new", "end_turn"),
        (["not", "a", "string"], "end_turn"),
    ],
)
def test_the_finish_reason_is_the_stop_reason(finish: Any, stop_reason: str) -> None:
    assert translated({"role": "assistant", "content": "x"}, finish)["stop_reason"] == stop_reason


def test_an_answer_with_tool_calls_stops_on_tool_use_whatever_its_finish_reason() -> None:
    assert translated(FULL, "stop")["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a":[1,2]}', {"a": [1, 2]}),
        ("", {}),
        ("  ", {}),
        (None, {}),
        ('{"a":', {UNPARSED: '{"a":'}),
        ("[1, 2]", {UNPARSED: "[1, 2]"}),
        ("plain words", {UNPARSED: "plain words"}),
    ],
)
def test_tool_arguments_that_are_not_a_json_object_are_kept_as_text(
    arguments: Any, expected: dict[str, Any]
) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    got = translated({"role": "assistant", "content": None, "tool_calls": [call]})
    assert got["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": expected}]


def test_an_answer_without_usage_counts_zeros() -> None:
    got = translated({"role": "assistant", "content": "x"}, usage=None)
    assert got["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


@pytest.mark.parametrize("name", ["cache_write_tokens", "cache_creation_tokens"])
def test_the_cache_writes_by_the_sdks_name_or_the_one_this_gateway_wrote_before(name: str) -> None:
    """``cache_write_tokens`` is OpenAI's name (its SDK's usage type); an older gateway
    upstream wrote ``cache_creation_tokens``."""
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {
        "cached_tokens": 30, name: 10
    }}  # fmt: skip
    got = translated({"role": "assistant", "content": "x"}, usage=usage)
    assert got["usage"] == {
        "input_tokens": 60,
        "output_tokens": 5,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 10,
    }


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1]", b"{}", b'{"choices": []}', b'{"choices": [{"message": "x"}]}'],
)
def test_an_answer_that_is_no_completion_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(UpstreamProtocolError) as raised:
        chat_answer_to_message(body, message_id="m")
    assert raised.value.status == 502


_JSON = chat_json(
    [
        *("choices", "message", "finish_reason", "usage", "model", "content", "refusal"),
        *("reasoning_content", "thinking_blocks", "type", "thinking", "signature", "data"),
        *("tool_calls", "id", "function", "name", "arguments", "prompt_tokens"),
        *("completion_tokens", "prompt_tokens_details", "cached_tokens"),
    ],
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON)
def test_any_json_is_a_message_or_a_protocol_error(value: Any) -> None:
    try:
        out = chat_answer_to_message(json.dumps(value).encode(), message_id="m")
    except UpstreamProtocolError:
        return
    assert json.loads(out)["type"] == "message"


# --- errors ---------------------------------------------------------------------------------

# The SDK's error types: those of Anthropic's documented ones it models.
SDK_ERROR_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "billing_error",
    "permission_error",
    "not_found_error",
    "rate_limit_error",
    "timeout_error",
    "api_error",
    "overloaded_error",
}


@pytest.mark.parametrize(
    ("status", "kind", "sdk_error"),
    [
        (400, "invalid_request_error", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (402, "billing_error", anthropic.PaymentRequiredError),
        (403, "permission_error", anthropic.PermissionDeniedError),
        (404, "not_found_error", anthropic.NotFoundError),
        (405, "invalid_request_error", anthropic.APIStatusError),
        (409, "conflict_error", anthropic.ConflictError),
        (413, "request_too_large", anthropic.ContentTooLargeError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
        (502, "api_error", anthropic.InternalServerError),
        (503, "overloaded_error", anthropic.ServiceUnavailableError),
        (504, "timeout_error", anthropic.GatewayTimeoutError),
        (529, "overloaded_error", anthropic.OverloadedError),
    ],
)
def test_an_error_s_type_follows_its_status(
    status: int, kind: str, sdk_error: type[anthropic.APIStatusError]
) -> None:
    body = error_body(status, "went wrong")
    assert json.loads(body) == {"type": "error", "error": {"type": kind, "message": "went wrong"}}
    if kind in SDK_ERROR_TYPES:
        ErrorResponse.model_validate_json(body, strict=True)
    with pytest.raises(sdk_error) as raised:
        sdk_create(body, status)
    assert type(raised.value) is sdk_error  # the SDK's class for the status
    assert raised.value.status_code == status
    assert raised.value.body == json.loads(body)


def test_a_given_error_type_wins() -> None:
    assert json.loads(error_body(500, "m", "overloaded_error"))["error"]["type"] == (
        "overloaded_error"
    )


def test_an_error_event_is_anthropic_s_error_event() -> None:
    assert error_event(529, "Overloaded") == (
        b'event: error\ndata: {"type":"error","error":'
        b'{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    )


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            429,
            chat.dumps(chat.error_body("Slow down", "requests", "rate_limit_exceeded")),
            ("rate_limit_error", "Slow down"),
        ),
        (
            404,
            ModelNotServed("no upstream serves model 'x'").to_json(),
            ("not_found_error", "no upstream serves model 'x'"),
        ),
        (502, b"<html>Bad Gateway</html>\n", ("api_error", "<html>Bad Gateway</html>")),
        (400, b'{"error": "plain text error"}', ("invalid_request_error", "plain text error")),
        (400, b'{"message": "top-level message"}', ("invalid_request_error", "top-level message")),
        (400, b'{"error": {"code": 7}}', ("invalid_request_error", '{"error": {"code": 7}}')),
        (503, b"", ("overloaded_error", "Service Unavailable")),
        (599, b"  ", ("api_error", "HTTP 599")),
        (500, b"caf\xe9", ("api_error", "caf\ufffd")),
    ],
)
def test_an_openai_error_or_any_text_keeps_its_message(
    status: int, body: bytes, expected: tuple[str, str]
) -> None:
    error = json.loads(error_from_chat(status, body))["error"]
    assert (error["type"], error["message"]) == expected
