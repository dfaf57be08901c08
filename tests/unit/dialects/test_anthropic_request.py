"""Chat requests as Anthropic Messages requests: each field mapped, refused or dropped.

Every translated body is also checked against the Anthropic SDK's own request types, so a
block of the wrong shape fails here and not at the upstream.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

from app.core.errors import BadRequest
from app.dialects.chat import Untranslatable
from app.dialects.request_to_anthropic import request_body

_PARAMS = pydantic.TypeAdapter(MessageCreateParamsNonStreaming)
HI = [{"role": "user", "content": "hi"}]


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def user(*parts: dict[str, Any], role: str = "user") -> dict[str, Any]:
    """A message whose content is ``parts``."""
    return {"role": role, "content": list(parts)}


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def budget(tokens: int) -> dict[str, Any]:
    return {"type": "enabled", "budget_tokens": tokens}


def _materialize(value: Any) -> None:
    """Run the SDK types' lazy validators (pydantic checks an Iterable when it is iterated)."""
    if isinstance(value, Iterator):
        value = list(value)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            _materialize(item)


def translate(messages: list[Any] = HI, **fields: Any) -> dict[str, Any]:
    body = {"model": "claude-x", "messages": messages, **fields}
    before = copy.deepcopy(body)
    out = request_body(body, default_max_tokens=4096)
    assert body == before  # the caller's body is not edited
    checked = dict(out)
    checked.pop("stream", None)
    _materialize(_PARAMS.validate_python(checked))
    return out


def test_a_plain_request() -> None:
    assert translate() == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 4096,
    }


def test_system_and_developer_messages_anywhere_become_system_in_order() -> None:
    out = translate(
        [
            {"role": "system", "content": "A"},
            {"role": "user", "content": "hi"},
            {"role": "developer", "content": [{"type": "text", "text": "B"}]},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "system", "content": "C"},
        ]
    )
    assert out["system"] == [{"type": "text", "text": t} for t in "ABC"]
    assert out["messages"] == [
        user(text("hi"), text("again")),
        user(text("ok"), role="assistant"),
    ]


def test_images_as_base64_or_url_sources() -> None:
    parts = [
        {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "low"}},
    ]
    (message,) = translate([{"role": "user", "content": parts}])["messages"]
    assert message["content"] == [
        {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


def test_a_tool_round_trip_with_thinking() -> None:
    """thinking_blocks first, tool calls as tool_use, consecutive tool messages (and the user
    text after them) one user turn of tool_result blocks."""
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig=="}
    calls = [
        {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "toolu_2", "type": "function", "function": {"name": "g", "arguments": ""}},
    ]
    out = translate(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": calls,
                "thinking_blocks": [thinking, {"type": "redacted_thinking", "data": "abc"}],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "one"},
            {
                "role": "tool",
                "tool_call_id": "toolu_2",
                "content": [{"type": "text", "text": "two"}],
            },
            {"role": "user", "content": "and?"},
        ]
    )
    assert out["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                thinking,
                {"type": "redacted_thinking", "data": "abc"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
                {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "one"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [text("two")]},
                text("and?"),
            ],
        },
    ]


def test_a_thinking_block_without_a_signature_is_left_out() -> None:
    """Anthropic checks each thinking block's signature: one without (another provider's
    thought, a stream cut before its signature) is not sent; the signed and redacted are."""
    signed = {"type": "thinking", "thinking": "b", "signature": "sig=="}
    blocks = [
        {"index": 0, "type": "thinking", "thinking": "a"},
        {"type": "thinking", "thinking": "a", "signature": ""},
        {**signed, "index": 1},
        {"type": "redacted_thinking", "data": "abc"},
    ]
    out = translate([*HI, {"role": "assistant", "content": "ok", "thinking_blocks": blocks}])
    assert out["messages"][1] == {
        "role": "assistant",
        "content": [signed, {"type": "redacted_thinking", "data": "abc"}, text("ok")],
    }


@pytest.mark.parametrize("arguments", ["[1, 2]", "not json", '"a string"', "{"])
def test_tool_call_arguments_that_are_not_an_object_are_refused(arguments: str) -> None:
    call = {"id": "t", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [*HI, {"role": "assistant", "tool_calls": [call]}]
    with pytest.raises(Untranslatable) as refused:
        translate(messages)
    assert refused.value.param == "messages[1].tool_calls[0].function.arguments"


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "f", "description": "does f", "parameters": SCHEMA},
}


def test_tools() -> None:
    bare = {"type": "function", "function": {"name": "g"}}
    assert translate(tools=[TOOL, bare])["tools"] == [
        {"name": "f", "description": "does f", "input_schema": SCHEMA},
        {"name": "g", "input_schema": {"type": "object", "properties": {}}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (None, None, None),
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ({"type": "function", "function": {"name": "f"}}, None, {"type": "tool", "name": "f"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("none", False, {"type": "none"}),
        (None, True, None),
    ],
)
def test_tool_choice(choice: Any, parallel: Any, expected: Any) -> None:
    fields = {"tool_choice": choice, "parallel_tool_calls": parallel}
    out = translate(tools=[TOOL], **{k: v for k, v in fields.items() if v is not None})
    assert out.get("tool_choice") == expected
    # Without tools, OpenAI's choices mean nothing: none is sent.
    assert "tool_choice" not in translate(**{k: v for k, v in fields.items() if v is not None})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"stop": "END"}, {"stop_sequences": ["END"]}),
        ({"stop": ["a", "b"]}, {"stop_sequences": ["a", "b"]}),
        (
            {"temperature": 0.2, "top_p": 0.9, "top_k": 5},
            {"temperature": 0.2, "top_p": 0.9, "top_k": 5},
        ),
        ({"max_tokens": 100}, {"max_tokens": 100}),
        ({"max_tokens": 100, "max_completion_tokens": 50}, {"max_tokens": 50}),
        ({"user": "u-1"}, {"metadata": {"user_id": "u-1"}}),
        ({"stream": True, "stream_options": {"include_usage": True}}, {"stream": True}),
        ({"reasoning_effort": "low"}, {"thinking": budget(1024)}),
        (
            {"reasoning_effort": "medium", "max_tokens": 5000},
            {"thinking": budget(4096), "max_tokens": 5000},
        ),
        # The bound holds the thinking too (issue 41 C): the budget is cut below it, never
        # the bound raised above it; without a bound, the upstream's setting (4096) is it.
        (
            {"reasoning_effort": "medium", "max_tokens": 4096},
            {"thinking": budget(4095), "max_tokens": 4096},
        ),
        ({"reasoning_effort": "high"}, {"thinking": budget(4095), "max_tokens": 4096}),
        ({"reasoning_effort": "low", "max_tokens": 1024}, {"max_tokens": 1024}),
        ({"thinking": budget(2000), "reasoning_effort": "high"}, {"thinking": budget(2000)}),
        # Carrying no meaning for Anthropic: dropped.
        (
            {
                "seed": 7,
                "store": True,
                "metadata": {"k": "v"},
                "service_tier": "flex",
                "prediction": {"type": "content", "content": "x"},
                "n": 1,
                "logprobs": False,
                "presence_penalty": 0,
                "frequency_penalty": 0.0,
                "logit_bias": {},
                "response_format": {"type": "text"},
                "modalities": ["text"],
            },
            {},
        ),
    ],
)
def test_fields(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    out = translate(**fields)
    plain = translate()
    assert {k: v for k, v in out.items() if plain.get(k) != v} == {
        k: v for k, v in expected.items() if plain.get(k) != v
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"reasoning_effort": "minimal"}, "reasoning_effort"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0]"),
        ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        (
            {"messages": [user({"type": "input_audio", "input_audio": {}})]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [*HI, user(text("x"), {"type": "file", "file": {}})]},
            "messages[1].content[1]",
        ),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        ({"messages": [user(image("ftp://x"))]}, "messages[0].content[0].image_url"),
        (
            {"messages": [user(image("data:image/png,notbase64"))]},
            "messages[0].content[0].image_url",
        ),
        ({"messages": [user(image("https://x"), role="system")]}, "messages[0].content[0]"),
        (
            {"messages": [{"role": "assistant", "thinking_blocks": [{"type": "x"}]}]},
            "messages[0].thinking_blocks[0]",
        ),
    ],
)
def test_refusals_name_their_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        translate(**fields)
    assert refused.value.param == param
    assert refused.value.status == 400 and refused.value.code == "unsupported_by_upstream"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (["hi"], "messages[0]"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
        ([{"role": "assistant", "tool_calls": [{"function": "f"}]}], "messages[0].tool_calls[0]"),
    ],
)
def test_malformed_messages_are_bad_requests_naming_the_field(
    messages: list[Any], param: str
) -> None:
    with pytest.raises(BadRequest) as bad:
        request_body({"model": "m", "messages": messages}, default_max_tokens=10)
    assert not isinstance(bad.value, Untranslatable)
    assert bad.value.param == param


def test_the_answer_is_json() -> None:
    """What goes upstream is serialized as it is: nothing in it that JSON cannot hold."""
    json.dumps(translate(tools=[TOOL], tool_choice="required", stop="x", user="u"))


def test_response_format_is_anthropics_structured_output() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    asked = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    out = request_body(
        {"model": "m", "messages": HI, "response_format": asked}, default_max_tokens=100
    )
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    out = request_body(
        {"model": "m", "messages": HI, "response_format": {"type": "json_object"}},
        default_max_tokens=1,
    )
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    out = request_body(
        {"model": "m", "messages": HI, "response_format": {"type": "text"}}, default_max_tokens=1
    )
    assert "output_config" not in out
