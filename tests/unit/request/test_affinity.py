"""A call's affinity key (app/request/affinity.py): what names its conversation, the same on
every turn of it, and never the caller's own text."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.request.affinity import (
    CACHE_KEY,
    PREFIX,
    SESSION,
    USER,
    Routing,
    affinity_of,
)
from app.request.routes import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, PASSTHROUGH, RESPONSES

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def _chat_turns(task: str, turns: int) -> list[dict[str, Any]]:
    """An agent loop's chat body at each turn: the same head, a growing tail."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": task},
    ]
    bodies = []
    for turn in range(turns):
        bodies.append({"model": "m", "tools": TOOLS, "messages": copy.deepcopy(messages)})
        messages += [
            {"role": "assistant", "content": f"step {turn}", "tool_calls": []},
            {"role": "user", "content": f"result {turn}"},
        ]
    return bodies


def test_a_conversation_keeps_its_key_over_twenty_turns_and_another_has_its_own() -> None:
    keys = {affinity_of(CHAT, body, []) for body in _chat_turns("fix the bug", 20)}
    assert len(keys) == 1
    (key,) = keys
    assert key is not None and key.source == PREFIX and len(key.key) == 16
    other = affinity_of(CHAT, _chat_turns("write the docs", 1)[0], [])
    assert other is not None and other.key != key.key
    no_tools = _chat_turns("fix the bug", 1)[0]
    del no_tools["tools"]
    assert affinity_of(CHAT, no_tools, []) != key  # the tools are part of the head
    system = _chat_turns("fix the bug", 1)[0]
    system["messages"][0]["content"] = "You are a hasty agent."
    assert affinity_of(CHAT, system, []) != key


def test_the_callers_breakpoints_do_not_move_the_key() -> None:
    """A client that marks its newest turn each time (as Anthropic's guide does) marks the
    first user turn on turn one only."""
    mark = {"type": "ephemeral"}
    first: dict[str, Any] = {
        "model": "m",
        "system": [{"type": "text", "text": "Be brief.", "cache_control": mark}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": mark}]}
        ],
    }
    later = copy.deepcopy(first)
    del later["messages"][0]["content"][0]["cache_control"]
    later["messages"] += [
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": mark}]},
    ]
    assert affinity_of(MESSAGES, first, []) == affinity_of(MESSAGES, later, [])
    changed = copy.deepcopy(later)
    changed["messages"][0]["content"][0]["text"] = "hey"
    assert affinity_of(MESSAGES, changed, []) != affinity_of(MESSAGES, first, [])


def test_a_turn_marked_as_a_part_once_and_sent_as_a_string_after_keeps_the_key() -> None:
    """A chat client marks its system prompt and its newest message, each a text part with
    ``cache_control`` (the bench's agent, bench/load/agent_loop.py): its first user turn is
    a part on turn one and a string from turn two on. A provider reads both as one prompt;
    the key must not move with it. A part with more than its text is not its text."""
    mark = {"type": "ephemeral"}

    def part(text: str) -> list[dict[str, Any]]:
        return [{"type": "text", "text": text, "cache_control": mark}]

    first: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": part("Be brief.")},
            {"role": "user", "content": part("fix the bug")},
        ],
    }
    later: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": part("Be brief.")},
            {"role": "user", "content": "fix the bug"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": part("thanks")},
        ],
    }
    assert affinity_of(CHAT, first, []) == affinity_of(CHAT, later, [])
    as_strings = copy.deepcopy(later)
    as_strings["messages"][0]["content"] = "Be brief."
    assert affinity_of(CHAT, as_strings, []) == affinity_of(CHAT, first, [])
    # Anthropic's system prompt: a string, or one text block.
    messages: dict[str, Any] = {
        "model": "m",
        "system": "Be brief.",
        "messages": [later["messages"][1]],
    }
    blocks = {**messages, "system": part("Be brief.")}
    assert affinity_of(MESSAGES, messages, []) == affinity_of(MESSAGES, blocks, [])
    cited = copy.deepcopy(first)
    cited["messages"][1]["content"][0]["citations"] = [{"type": "char_location"}]
    assert affinity_of(CHAT, cited, []) != affinity_of(CHAT, first, [])
    two = copy.deepcopy(first)
    two["messages"][1]["content"] = [*part("fix the bug"), *part("and the test")]
    assert affinity_of(CHAT, two, []) != affinity_of(CHAT, first, [])


def test_a_responses_call_is_keyed_by_its_instructions_and_first_input() -> None:
    one = {"model": "m", "instructions": "Be brief.", "input": "What is 2+2?"}
    assert affinity_of(RESPONSES, one, []) is not None
    items: dict[str, Any] = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "What is 2+2?"},
            {"type": "function_call_output", "call_id": "c", "output": "4"},
        ],
    }
    grown = copy.deepcopy(items)
    grown["input"].append({"role": "user", "content": "And 3+3?"})
    assert affinity_of(RESPONSES, items, []) == affinity_of(RESPONSES, grown, [])
    other = {**one, "instructions": "Be long."}
    assert affinity_of(RESPONSES, other, []) != affinity_of(RESPONSES, one, [])


def test_the_callers_own_key_comes_first_in_its_order() -> None:
    body = {**_chat_turns("task", 1)[0], "prompt_cache_key": "pk-1", "user": "u-1"}
    session = affinity_of(CHAT, body, [("X-LLMGate-Session", "s-1")])
    assert session is not None and session.source == SESSION
    assert affinity_of(CHAT, body, [("x-llmgate-session", "s-1")]) == session  # any case
    keyed = affinity_of(CHAT, body, [("X-LLMGate-Session", "")])  # empty: not given
    assert keyed is not None and keyed.source == CACHE_KEY
    user = affinity_of(CHAT, {**body, "prompt_cache_key": None}, [])
    assert user is not None and user.source == USER
    # The door of Anthropic's callers: its user is in metadata; a chat-style user is not one.
    messages: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "user": "u-1",
    }
    assert affinity_of(MESSAGES, messages, []).source == PREFIX  # type: ignore[union-attr]
    messages["metadata"] = {"user_id": "u-1"}
    assert affinity_of(MESSAGES, messages, []).source == USER  # type: ignore[union-attr]
    # A key is a digest of its source and value, never the value: the same value from two
    # sources makes two keys, and the hex sent as prompt_cache_key tells nothing of it.
    as_key = affinity_of(CHAT, {"messages": [], "prompt_cache_key": "u-1"}, [])
    assert as_key is not None and user is not None and as_key.key != user.key
    assert "u-1" not in user.hex and len(user.hex) == 32


@pytest.mark.parametrize("route", [EMBEDDINGS, COMPLETIONS, PASSTHROUGH])
def test_routes_without_a_prompt_to_keep_have_no_key(route) -> None:
    assert affinity_of(route, {"model": "m", "input": "x", "prompt": "x"}, []) is None


def test_a_body_with_nothing_to_key_has_no_key() -> None:
    assert affinity_of(CHAT, None, []) is None
    assert affinity_of(CHAT, {"model": "m", "messages": []}, []) is None
    empty_turn = {"model": "m", "messages": [{"role": "user", "content": ""}]}
    assert affinity_of(CHAT, empty_turn, []) is None
    assert affinity_of(RESPONSES, {"model": "m"}, []) is None


def test_routing_says_its_choice_reason_and_key_as_the_log_line_has_them() -> None:
    assert Routing("a", "affine", "prefix").fields() == {
        "choice": "a",
        "reason": "affine",
        "key": "prefix",
    }
    assert Routing("b", "weighted").fields()["key"] is None
