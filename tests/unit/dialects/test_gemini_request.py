"""A Chat Completions request as Gemini's body (app/dialects/request_to_gemini.py): a table for
every field, the refusals with the field they name, and the messages of a whole tool-using
conversation.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.dialects.chat import Untranslatable
from app.dialects.gemini import request_body

HI = [{"role": "user", "content": "Hi"}]
HI_CONTENTS = [{"role": "user", "parts": [{"text": "Hi"}]}]


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "gemini-2.5-flash", "messages": HI, **fields}


def test_a_tool_using_conversation() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these, and the weather?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://x.test/a/cat.WEBP?s=1", "detail": "low"},
                },
                {"type": "image_url", "image_url": {"url": "http://x.test/render?id=3"}},
            ],
        },
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "clock", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "09:00"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain"}]},
        {"role": "user", "content": "Thanks", "name": "ann"},
        {"role": "assistant", "content": [{"type": "text", "text": "You're welcome."}]},
    ]
    assert request_body(_body(messages=messages)) == {
        "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Use tools."}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "What is in these, and the weather?"},
                    {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                    {
                        "fileData": {
                            "fileUri": "https://x.test/a/cat.WEBP?s=1",
                            "mimeType": "image/webp",
                        }
                    },
                    {
                        "fileData": {
                            "fileUri": "http://x.test/render?id=3",
                            "mimeType": "image/jpeg",
                        }
                    },
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "Looking."},
                    {"functionCall": {"name": "weather", "args": {"city": "Oslo"}, "id": "c1"}},
                    {"functionCall": {"name": "clock", "args": {}, "id": "c2"}},
                ],
            },
            # The tool answers and the next user turn: one content (Gemini wants the parallel
            # answers together, and one role at a time).
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "clock",
                            "id": "c2",
                            "response": {"result": "09:00"},
                        }
                    },
                    {
                        "functionResponse": {
                            "name": "weather",
                            "id": "c1",
                            "response": {"result": "rain"},
                        }
                    },
                    {"text": "Thanks"},
                ],
            },
            {"role": "model", "parts": [{"text": "You're welcome."}]},
        ],
    }


def test_the_callers_body_is_left_as_it_was() -> None:
    body = _body(
        messages=[
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
            {"role": "tool", "tool_call_id": "c", "content": "again"},
        ],
        stop=["a"],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    )
    before = copy.deepcopy(body)
    request_body(body)
    assert body == before


def test_empty_messages_are_left_out() -> None:
    messages = [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "Yo"}]},
    ]
    assert request_body(_body(messages=messages)) == {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}, {"text": "Yo"}]}]
    }


@pytest.mark.parametrize(
    ("fields", "config"),
    [
        ({"temperature": 0.2}, {"temperature": 0.2}),
        ({"temperature": 0}, {"temperature": 0}),
        ({"top_p": 0.9}, {"topP": 0.9}),
        ({"max_tokens": 50}, {"maxOutputTokens": 50}),
        ({"max_completion_tokens": 70}, {"maxOutputTokens": 70}),
        # Both given: the smaller, never above the one a key's reservation counted.
        ({"max_completion_tokens": 70, "max_tokens": 50}, {"maxOutputTokens": 50}),
        ({"stop": "END"}, {"stopSequences": ["END"]}),
        ({"stop": ["a", "b"]}, {"stopSequences": ["a", "b"]}),
        ({"seed": 7}, {"seed": 7}),
        ({"presence_penalty": 0.5}, {"presencePenalty": 0.5}),
        ({"frequency_penalty": -0.5}, {"frequencyPenalty": -0.5}),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, {"responseMimeType": "application/json"}),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "p",
                        "strict": True,
                        "schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
                    },
                }
            },
            {
                "responseMimeType": "application/json",
                "responseJsonSchema": {"type": "object", "properties": {"x": {"type": "integer"}}},
            },
        ),
        (
            {"reasoning_effort": "low"},
            {"thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True}},
        ),
        (
            {"reasoning_effort": "medium"},
            {"thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": True}},
        ),
        (
            {"reasoning_effort": "high"},
            {"thinkingConfig": {"thinkingBudget": 24576, "includeThoughts": True}},
        ),
        (
            {"temperature": 1, "max_tokens": 9, "stop": "x"},
            {"temperature": 1, "maxOutputTokens": 9, "stopSequences": ["x"]},
        ),
    ],
)
def test_generation_config(fields: dict[str, Any], config: dict[str, Any] | None) -> None:
    got = request_body(_body(**fields))
    assert got.get("generationConfig") == config
    assert got["contents"] == HI_CONTENTS


WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
CLOCK = {"type": "function", "function": {"name": "clock"}}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"tools": [WEATHER, CLOCK]},
            {
                "tools": [
                    {
                        "functionDeclarations": [
                            {
                                "name": "weather",
                                "description": "The weather in a city.",
                                "parametersJsonSchema": {
                                    "type": "object",
                                    "properties": {"city": {"type": "string"}},
                                },
                            },
                            {"name": "clock"},
                        ]
                    }
                ]
            },
        ),
        ({"tool_choice": "auto"}, {"toolConfig": {"functionCallingConfig": {"mode": "AUTO"}}}),
        ({"tool_choice": "none"}, {"toolConfig": {"functionCallingConfig": {"mode": "NONE"}}}),
        ({"tool_choice": "required"}, {"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}),
        (
            {"tool_choice": {"type": "function", "function": {"name": "clock"}}},
            {
                "toolConfig": {
                    "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["clock"]}
                }
            },
        ),
        ({"tools": []}, {}),
    ],
)
def test_tools_and_tool_choice(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert request_body(_body(**fields)) == {"contents": HI_CONTENTS, **expected}


@pytest.mark.parametrize(
    "fields",
    [
        {"stream": True, "stream_options": {"include_usage": True}},
        {"store": True, "metadata": {"a": "b"}},
        {"user": "u-1"},  # Gemini's body has no such field
        {"n": 1, "logprobs": False, "logit_bias": {}, "top_logprobs": None},
        {"parallel_tool_calls": True, "modalities": ["text"], "audio": None},
    ],
)
def test_fields_that_mean_nothing_to_the_body(fields: dict[str, Any]) -> None:
    assert request_body(_body(**fields)) == {"contents": HI_CONTENTS}


def _user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


def _called(arguments: str, answered: str = "c1") -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": answered, "content": "ok"},
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"reasoning_effort": "minimal"}, "reasoning_effort"),
        ({"response_format": {"type": "grammar"}}, "response_format"),
        ({"tool_choice": "any"}, "tool_choice"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0]"),
        ({"tools": [WEATHER, "clock"]}, "tools[1]"),
        ({"messages": "Hi"}, "messages"),
        ({"messages": ["Hi"]}, "messages[0]"),
        ({"messages": [{"role": "function", "name": "f", "content": "1"}]}, "messages[0].role"),
        (
            {
                "messages": _user(
                    {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}
                )
            },
            "messages[0].content[0]",
        ),
        (
            {
                "messages": _user(
                    {"type": "text", "text": "a"}, {"type": "file", "file": {"file_id": "f"}}
                )
            },
            "messages[0].content[1]",
        ),
        (
            {"messages": _user({"type": "image_url", "image_url": {"url": "gs://b/cat.png"}})},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": _user(
                    {"type": "image_url", "image_url": {"url": "data:image/png,%89PNG"}}
                )
            },
            "messages[0].content[0]",
        ),
        (
            {"messages": _user({"type": "image_url", "image_url": "https://x.test/a.png"})},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "system", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": _called("[1, 2]")}, "messages[0].tool_calls[0]"),
        ({"messages": _called("{not json")}, "messages[0].tool_calls[0]"),
        ({"messages": _called("{}", answered="c9")}, "messages[1].tool_call_id"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
            "messages[0].tool_call_id",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]},
            "messages[0].tool_calls[0]",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}
                ]
            },
            "messages[0].function_call",
        ),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        request_body(_body(**fields))
    assert refused.value.param == param
    assert (refused.value.status, refused.value.code) == (400, "unsupported_by_upstream")


def test_a_thought_signature_goes_back_on_the_first_function_call() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assistant = {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [call, {**call, "id": "c2"}],
        "thinking_blocks": [{"type": "thinking", "thinking": "", "signature": "U2ln"}],
    }
    out = request_body({"model": "m", "messages": [{"role": "user", "content": "hi"}, assistant]})
    parts = out["contents"][1]["parts"]
    assert [p.get("thoughtSignature") for p in parts] == [None, "U2ln", None]


def test_the_signature_sent_back_is_the_first_that_is_not_empty() -> None:
    """A thinking block no signature closed (a thought not signed, then the signature in a
    block of its own, as a stream may end) carries "": Gemini is sent the real one, on the
    first part when the turn made no call."""
    assistant = {
        "role": "assistant",
        "content": "The answer.",
        "thinking_blocks": [
            {"type": "thinking", "thinking": "t", "signature": ""},
            {"type": "thinking", "thinking": "", "signature": "U2ln"},
        ],
    }
    out = request_body({"model": "m", "messages": [{"role": "user", "content": "hi"}, assistant]})
    assert out["contents"][1]["parts"] == [{"text": "The answer.", "thoughtSignature": "U2ln"}]
