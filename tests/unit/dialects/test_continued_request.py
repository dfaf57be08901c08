"""A continuation's request (app/dialects/continuation.py): the caller's request with the
answer so far as the upstream's mode takes it, and what is left of the output bound."""

from __future__ import annotations

import pytest

from app.dialects.continuation import (
    CONTINUE_FINAL,
    OFF,
    PREFILL,
    PREFIX,
    CannotContinue,
    Partial,
    continued_chat,
)

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
    [(OFF, Partial("a", 1)), ("instruction", Partial("a", 1)), (PREFIX, Partial("a", 40))],
    ids=["off", "not-built", "bound-used"],
)
def test_what_cannot_be_continued_says_so(mode: str, partial: Partial) -> None:
    with pytest.raises(CannotContinue):
        continued_chat(ASKED, partial, mode)
