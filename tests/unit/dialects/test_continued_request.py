"""A continuation's request (app/dialects/continuation.py): the caller's request with the
answer so far as the upstream's mode takes it, and what is left of the output bound."""

from __future__ import annotations

import pytest

from app.dialects.continuation import (
    CONTINUE_FINAL,
    INSTRUCTION,
    INSTRUCTION_TEXT,
    MODEL_TURN,
    OFF,
    PREFILL,
    PREFIX,
    CannotContinue,
    Partial,
    continued_chat,
)
from app.dialects.request_to_gemini import request_body
from app.upstream.catalog import ConfigError, load

ASKED = {"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}


def test_prefix_appends_a_marked_assistant_turn_and_leaves_the_caller_s_body_alone() -> None:
    doc = continued_chat(ASKED, Partial("Hello wor", used=3), PREFIX)
    assert doc["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello wor", "prefix": True},
    ]
    assert doc["max_tokens"] == 37 and "continue_final_message" not in doc
    assert ASKED["messages"] == [{"role": "user", "content": "hi"}] and ASKED["max_tokens"] == 40


def test_continue_final_message_leaves_the_turn_open() -> None:
    doc = continued_chat(ASKED, Partial("Hello", used=1), CONTINUE_FINAL)
    assert doc["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert doc["continue_final_message"] is True and doc["add_generation_prompt"] is False


def test_a_prefill_goes_without_its_trailing_whitespace_and_never_after_thinking() -> None:
    doc = continued_chat(ASKED, Partial("Hello \n", used=1), PREFILL)
    assert doc["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert continued_chat(ASKED, Partial(" \n", used=1), PREFILL)["messages"] == ASKED["messages"]
    for thinking in ({"reasoning_effort": "low"}, {"thinking": {"type": "enabled"}}):
        with pytest.raises(CannotContinue, match="thinking"):
            continued_chat({**ASKED, **thinking}, Partial("Hello", used=1), PREFILL)


def test_the_newer_bound_is_the_one_lessened() -> None:
    both = {**ASKED, "max_completion_tokens": 10}
    doc = continued_chat(both, Partial("a b", used=2), PREFIX)
    assert (doc["max_completion_tokens"], doc["max_tokens"]) == (8, 40)


def test_nothing_said_yet_is_the_request_as_it_was() -> None:
    assert continued_chat(ASKED, Partial("", used=0), PREFIX) == ASKED


@pytest.mark.parametrize(
    ("mode", "partial"),
    [(OFF, Partial("a", 1)), ("sideways", Partial("a", 1)), (PREFIX, Partial("a", 40))],
    ids=["off", "not-a-mode", "bound-used"],
)
def test_what_cannot_be_continued_says_so(mode: str, partial: Partial) -> None:
    with pytest.raises(CannotContinue):
        continued_chat(ASKED, partial, mode)


def test_a_model_turn_is_gemini_s_last_content_with_its_whitespace_and_never_after_thinking():
    """The answer so far, trailing whitespace and all (Gemini refuses none), becomes the
    Gemini request's last content, a ``model`` turn, once translated."""
    doc = continued_chat(ASKED, Partial("Hello \n", used=1), MODEL_TURN)
    assert doc["messages"][-1] == {"role": "assistant", "content": "Hello \n"}
    assert request_body(doc)["contents"] == [
        {"role": "user", "parts": [{"text": "hi"}]},
        {"role": "model", "parts": [{"text": "Hello \n"}]},
    ]
    for thinking in ({"reasoning_effort": "low"}, {"thinking": {"type": "enabled"}}):
        with pytest.raises(CannotContinue, match="thinking"):
            continued_chat({**ASKED, **thinking}, Partial("Hello", used=1), MODEL_TURN)


def test_an_instruction_follows_the_answer_so_far_as_a_whole_turn() -> None:
    """The answer so far as it was (not marked, not left open), then the user's instruction
    to go on; thinking is no obstacle (the model answers a user turn)."""
    asked = {**ASKED, "reasoning_effort": "low"}
    doc = continued_chat(asked, Partial("Hello wor", used=3), INSTRUCTION)
    assert doc["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello wor"},
        {"role": "user", "content": INSTRUCTION_TEXT},
    ]
    assert doc["max_tokens"] == 37 and "continue_final_message" not in doc
    assert continued_chat(ASKED, Partial("", used=0), INSTRUCTION) == ASKED


@pytest.mark.parametrize(
    ("kind", "mode", "taken"),
    [
        ("gemini", MODEL_TURN, True),
        ("gemini", INSTRUCTION, True),
        ("openai", INSTRUCTION, True),
        ("anthropic", INSTRUCTION, True),
        ("openai", MODEL_TURN, False),
        ("gemini", PREFILL, False),
    ],
)
def test_each_kind_takes_its_own_modes_and_the_instruction(kind: str, mode: str, taken: bool):
    table = f'[[upstreams]]\nname = "a"\nkind = "{kind}"\nbase_url = "http://x/v1"\n'
    table += f'models = ["m"]\ncontinuation = "{mode}"\n'
    if taken:
        assert load(table, {})[0].continues("m")
    else:
        with pytest.raises(ConfigError, match="continuation"):
            load(table, {})


@pytest.mark.parametrize(
    ("kind", "default"), [("openai", "off"), ("anthropic", "prefill"), ("gemini", "model_turn")]
)
def test_an_upstream_that_sets_no_continuation_takes_its_kind_s_own(kind: str, default: str):
    table = f'[[upstreams]]\nname = "a"\nkind = "{kind}"\nbase_url = "http://x/v1"\n'
    spec = load(table + 'models = ["m"]\n', {})[0]
    assert spec.continuation == default
    assert spec.continues("m") is (default != "off")
    # Set, it is what it says (off included).
    assert load(table + 'models = ["m"]\ncontinuation = "off"\n', {})[0].continues("m") is False
