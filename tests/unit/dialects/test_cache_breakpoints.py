"""Cache breakpoints on an Anthropic request (app/dialects/cache_breakpoints.py): placed on
the tools, the system prompt and the turn before the newest user message, only where the
prefix reaches the model's minimum, never on a block that cannot carry one, never more than
Anthropic's four, and never when the caller placed its own; the request given unchanged."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from app.dialects.cache_breakpoints import (
    EPHEMERAL,
    HAIKU_MINIMUM,
    MINIMUM,
    minimum_for,
    with_breakpoints,
)

LONG = "word " * 1200  # 6,000 characters: about 1,500 tokens by the gateway's estimate
SHORT = "a short note"
TOOL = {"name": "read_file", "description": LONG, "input_schema": {"type": "object"}}


def _marks(value: Any) -> list[str]:
    """Where the marks are: a JSON path per ``cache_control`` found."""
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "cache_control" in node:
                found.append(path)
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(value, "$")
    return found


def _agent(turns: int, system: str = LONG) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in main.py."}]
    for i in range(turns):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": f"Reading {i}."},
                    {"type": "tool_use", "id": f"t{i}", "name": "read_file", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": SHORT}],
            },
        ]
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "system": system,
        "tools": [TOOL],
        "messages": messages,
    }


def test_the_tools_the_system_and_the_turn_before_the_newest_user_message_are_marked() -> None:
    body = _agent(3)
    given = copy.deepcopy(body)
    out = with_breakpoints(body, MINIMUM)
    assert body == given  # the request given is not changed
    assert out is not None
    assert _marks(out) == [
        "$.system[0]",
        "$.tools[0]",
        "$.messages[5].content[2]",  # the assistant's last turn, its tool call (not thinking)
    ]
    assert out["system"] == [{"type": "text", "text": LONG, "cache_control": EPHEMERAL}]
    # Everything else is as it was.
    unmarked = json.loads(json.dumps(out).replace(', "cache_control": {"type": "ephemeral"}', ""))
    unmarked["system"] = unmarked["system"][0]["text"]
    assert unmarked == given


def test_only_where_the_prefix_reaches_the_minimum() -> None:
    assert with_breakpoints(_agent(3, system=SHORT) | {"tools": []}, MINIMUM) is None
    # The tools alone are long enough: each mark where its prefix is.
    short_tools = _agent(3, system=LONG) | {"tools": [{"name": "t", "input_schema": {}}]}
    out = with_breakpoints(short_tools, MINIMUM)
    assert out is not None and _marks(out) == ["$.system[0]", "$.messages[5].content[2]"]
    # A conversation that grows past the minimum is marked from then on.
    chat: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": SHORT},
            {"role": "user", "content": "more"},
        ],
    }
    assert with_breakpoints(chat, MINIMUM) is None
    chat["messages"][1]["content"] = LONG
    out = with_breakpoints(chat, MINIMUM)
    assert out is not None and out["messages"][1]["content"] == [
        {"type": "text", "text": LONG, "cache_control": EPHEMERAL}
    ]
    # Haiku's minimum is twice Sonnet's: 1,500 tokens are enough for one, not the other.
    assert minimum_for("claude-haiku-4-5") == HAIKU_MINIMUM and minimum_for("claude-x") == MINIMUM
    assert with_breakpoints(chat, HAIKU_MINIMUM) is None


def test_the_first_turn_has_no_turn_before_it_to_mark() -> None:
    out = with_breakpoints(_agent(0), MINIMUM)
    assert out is not None and _marks(out) == ["$.system[0]", "$.tools[0]"]


@pytest.mark.parametrize(
    "where",
    ["top", "tool", "system", "message", "tool_result"],
)
def test_the_callers_own_breakpoints_are_kept_and_none_added(where: str) -> None:
    body = _agent(2)
    body["system"] = [{"type": "text", "text": LONG}]
    if where == "top":
        body["cache_control"] = EPHEMERAL
    elif where == "tool":
        body["tools"][0] = {**TOOL, "cache_control": EPHEMERAL}
    elif where == "system":
        body["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    elif where == "message":
        body["messages"][-1]["content"].append(
            {"type": "text", "text": "go on", "cache_control": EPHEMERAL}
        )
    else:
        body["messages"][-1]["content"][0]["content"] = [
            {"type": "text", "text": SHORT, "cache_control": EPHEMERAL}
        ]
    assert with_breakpoints(body, MINIMUM) is None


def test_a_turn_with_no_block_that_can_carry_a_mark_gets_none() -> None:
    body = _agent(1) | {"tools": []}
    body["messages"][1]["content"] = [
        {"type": "text", "text": "Reading."},
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": ""},
    ]
    out = with_breakpoints(body, MINIMUM)
    assert out is not None and _marks(out) == ["$.system[0]", "$.messages[1].content[0]"]
    body["messages"][1]["content"] = [{"type": "redacted_thinking", "data": "x"}]
    out = with_breakpoints(body, MINIMUM)
    assert out is not None and _marks(out) == ["$.system[0]"]


def test_never_more_than_anthropics_four() -> None:
    for turns in range(6):
        out = with_breakpoints(_agent(turns), MINIMUM)
        assert out is not None and len(_marks(out)) <= 3 < 4
