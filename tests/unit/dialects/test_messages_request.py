"""app/dialects/request_from_anthropic.py: an Anthropic Messages request as a Chat Completions one,
member by member: what each becomes, what is dropped, and what is refused (a 400 naming the
member: ``Untranslatable`` for what this upstream cannot be asked, ``BadRequest`` for a
request that is not Anthropic's shape)."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.errors import BadRequest
from app.dialects.anthropic_door import chat_body
from app.dialects.chat import Untranslatable

HI = [{"role": "user", "content": "hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def body(**members: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 100, "messages": HI, **members}


def messages(*anthropic: dict[str, Any], **members: Any) -> list[dict[str, Any]]:
    return chat_body(body(messages=list(anthropic), **members))["messages"]


def test_the_sampling_members_are_kept_and_renamed() -> None:
    got = chat_body(
        body(
            temperature=0.3,
            top_p=0.9,
            stop_sequences=["END", "STOP"],
            metadata={"user_id": "user-7"},
        )
    )
    assert got == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["END", "STOP"],
        "user": "user-7",
    }


def test_members_chat_completions_has_no_field_for_are_dropped() -> None:
    got = chat_body(
        body(
            top_k=5,
            thinking={"type": "enabled", "budget_tokens": 2000},
            output_config={"effort": "high"},
            service_tier="auto",
            cache_control={"type": "ephemeral"},
            metadata={},
            stop_sequences=[],
            some_future_member=1,
        )
    )
    assert got == chat_body(body())
    assert set(got) == {"model", "messages", "max_tokens"}


def test_a_stream_asks_for_the_usage_too() -> None:
    got = chat_body(body(stream=True))
    assert (got["stream"], got["stream_options"]) == (True, {"include_usage": True})
    assert "stream" not in chat_body(body(stream=False))
    assert "stream_options" not in chat_body(body(stream=False))


@pytest.mark.parametrize(
    "system",
    [
        "Be brief.\n\nAnswer in French.",
        [
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Answer in French."},
        ],
    ],
)
def test_the_system_prompt_is_the_first_message(system: Any) -> None:
    assert messages(*HI, system=system) == [
        {"role": "system", "content": "Be brief.\n\nAnswer in French."},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize("system", ["", [], None])
def test_no_system_prompt_is_no_system_message(system: Any) -> None:
    assert messages(*HI, system=system) == [{"role": "user", "content": "hi"}]


def test_user_text_and_images_are_content_parts() -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    url = {"type": "url", "url": "https://example.test/cat.jpg"}
    content = [
        {"type": "text", "text": "What are these?", "cache_control": {"type": "ephemeral"}},
        {"type": "image", "source": png},
        {"type": "image", "source": url},
    ]
    assert messages({"role": "user", "content": content}) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What are these?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.test/cat.jpg"}},
            ],
        }
    ]


def test_assistant_blocks_are_content_tool_calls_and_thinking_blocks() -> None:
    content = [
        {"type": "thinking", "thinking": "The user wants", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "thinking", "thinking": " the weather.", "signature": "sig-2"},
        {"type": "text", "text": "Let me look.", "citations": []},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Zürich"}},
        {"type": "text", "text": "And the time."},
        {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
    ]
    assert messages(*HI, {"role": "assistant", "content": content})[1] == {
        "role": "assistant",
        "content": "Let me look.\n\nAnd the time.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'},
            },
            {"id": "toolu_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ],
        "reasoning_content": "The user wants the weather.",
        "thinking_blocks": [
            {"type": "thinking", "thinking": "The user wants", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "thinking", "thinking": " the weather.", "signature": "sig-2"},
        ],
    }


def test_an_assistant_message_of_tool_calls_alone_has_null_content() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}
    got = messages(*HI, {"role": "assistant", "content": [call]})[1]
    assert got["content"] is None
    assert messages(*HI, {"role": "assistant", "content": "Hello."})[1] == {
        "role": "assistant",
        "content": "Hello.",
    }
    assert messages(*HI, {"role": "assistant", "content": []})[1] == {
        "role": "assistant",
        "content": "",
    }


def test_tool_results_are_tool_messages_before_the_rest_of_their_user_message() -> None:
    content = [
        {"type": "text", "text": "Here you are."},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 degrees"},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "content": [{"type": "text", "text": "12:00"}, {"type": "text", "text": "UTC"}],
            "is_error": False,
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_3",
            "content": "no such city",
            "is_error": True,
        },
        {"type": "tool_result", "tool_use_id": "toolu_4"},
    ]
    assert messages({"role": "user", "content": content}) == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 degrees"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "12:00\n\nUTC"},
        {"role": "tool", "tool_call_id": "toolu_3", "content": "no such city"},
        {"role": "tool", "tool_call_id": "toolu_4", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": "Here you are."}]},
    ]


def test_a_user_message_of_tool_results_alone_is_no_user_message() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
    assert messages({"role": "user", "content": [result]}) == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"}
    ]


def test_tools_are_function_tools() -> None:
    minimal = {"type": "custom", "name": "now", "input_schema": {"type": "object"}}
    strict = {**WEATHER, "strict": True, "cache_control": {"type": "ephemeral"}}
    assert chat_body(body(tools=[WEATHER, minimal, strict]))["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather of a city",
                "parameters": WEATHER["input_schema"],
            },
        },
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather of a city",
                "parameters": WEATHER["input_schema"],
                "strict": True,
            },
        },
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "get_weather"},
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        ),
        (
            {"type": "auto", "disable_parallel_tool_use": True},
            {"tool_choice": "auto", "parallel_tool_calls": False},
        ),
        ({"type": "any", "disable_parallel_tool_use": False}, {"tool_choice": "required"}),
    ],
)
def test_the_tool_choice(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    got = chat_body(body(tools=[WEATHER], tool_choice=choice))
    assert {k: got[k] for k in ("tool_choice", "parallel_tool_calls") if k in got} == expected


def test_a_tool_choice_without_tools_is_dropped() -> None:
    # OpenAI refuses tool_choice and parallel_tool_calls in a request without tools.
    got = chat_body(body(tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
    assert "tool_choice" not in got
    assert "parallel_tool_calls" not in got


# --- refused --------------------------------------------------------------------------------


def _document() -> dict[str, Any]:
    source = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}
    return {"type": "document", "source": source, "citations": {"enabled": True}}


@pytest.mark.parametrize(
    ("members", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER, {"type": "bash_20250124", "name": "bash"}]}, "tools[1].type"),
        ({"mcp_servers": [{"type": "url", "url": "https://mcp.test"}]}, "mcp_servers"),
        ({"container": "container_1"}, "container"),
        (
            {"messages": [{"role": "user", "content": [_document()]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "search_result"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "see"},
                            {"type": "image", "source": {"type": "file", "file_id": "file_1"}},
                        ],
                    }
                ]
            },
            "messages[0].content[1].source.type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_1",
                                "content": [{"type": "image", "source": {"type": "url"}}],
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].content[0].type",
        ),
        (
            {
                "messages": [
                    *HI,
                    {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s"}]},
                ]
            },
            "messages[1].content[0].type",
        ),
        ({"system": [{"type": "image", "source": {}}]}, "system[0].type"),
    ],
)
def test_what_an_openai_upstream_cannot_be_asked_is_refused(
    members: dict[str, Any], param: str
) -> None:
    with pytest.raises(Untranslatable) as raised:
        chat_body(body(**members))
    assert (raised.value.status, raised.value.param) == (400, param)
    assert raised.value.code == "unsupported_by_upstream"


@pytest.mark.parametrize(
    ("members", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0].source",
        ),
        ({"tools": "get_weather"}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "some"}}, "tool_choice.type"),
    ],
)
def test_a_request_not_in_anthropic_s_shape_is_a_bad_request(
    members: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as raised:
        chat_body(body(**members))
    assert not isinstance(raised.value, Untranslatable)
    assert (raised.value.status, raised.value.param) == (400, param)


def test_output_config_format_is_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    asked = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    out = chat_body(
        {**asked, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    )
    assert out["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }
    with pytest.raises(BadRequest) as caught:
        chat_body({**asked, "output_config": {"format": {"type": "json_schema"}}})
    assert caught.value.param == "output_config.format"
