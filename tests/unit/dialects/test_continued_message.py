"""A continuation's request on the /v1/messages door (app/dialects/continuation_messages.py):
the caller's Messages request with the answer so far as its last turn, and, for an
OpenAI-kind upstream, that turn marked as its mode says once translated."""

from __future__ import annotations

from typing import Any

import pytest

from app.dialects.anthropic_door import chat_body
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
)
from app.dialects.continuation_messages import continued_message, partial_chat

USER = {"role": "user", "content": "hi"}
ASKED: dict[str, Any] = {"model": "m", "max_tokens": 40, "messages": [USER]}


def test_a_prefill_is_the_answer_so_far_without_its_trailing_space() -> None:
    doc = continued_message(ASKED, Partial("Hello wor ", used=3), PREFILL)
    assert doc["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    assert doc["max_tokens"] == 37 and ASKED["max_tokens"] == 40 and len(ASKED["messages"]) == 1


def test_a_caller_s_own_prefill_goes_on_with_the_answer_so_far() -> None:
    asked = {**ASKED, "messages": [USER, {"role": "assistant", "content": "{"}]}
    doc = continued_message(asked, Partial('"a": 1 ', used=2), PREFILL)
    assert doc["messages"][1:] == [{"role": "assistant", "content": '{"a": 1'}]
    blocks = {
        **ASKED,
        "messages": [USER, {"role": "assistant", "content": [{"type": "text", "text": "{"}]}],
    }
    doc = continued_message(blocks, Partial('"a": 1 ', used=2), PREFILL)
    assert doc["messages"][-1]["content"] == [{"type": "text", "text": '{"a": 1'}]


@pytest.mark.parametrize("mode", [PREFIX, CONTINUE_FINAL])
def test_an_openai_kind_upstream_gets_the_turn_marked_once_translated(mode: str) -> None:
    doc = continued_message(ASKED, Partial("Hello wor", used=3), mode)
    chat = partial_chat(chat_body(doc), mode)
    assert chat["messages"][-1]["content"] == "Hello wor" and chat["max_tokens"] == 37
    if mode == PREFIX:
        assert chat["messages"][-1]["prefix"] is True
    else:
        assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False


def test_what_cannot_be_continued_is_refused() -> None:
    with pytest.raises(CannotContinue):
        continued_message(ASKED, Partial("x", used=40), PREFILL)
    with pytest.raises(CannotContinue):
        continued_message({**ASKED, "thinking": {"type": "enabled"}}, Partial("x", 1), PREFILL)
    with pytest.raises(CannotContinue):
        continued_message(ASKED, Partial("x", 1), OFF)
    with pytest.raises(CannotContinue):
        partial_chat(chat_body(ASKED), PREFIX)  # no assistant turn last
    doc = continued_message({**ASKED, "thinking": {"type": "disabled"}}, Partial("", 0), PREFILL)
    assert doc["messages"] == ASKED["messages"]  # nothing said yet: the request as it was


def test_an_instruction_is_a_whole_turn_then_the_user_s_ask_and_a_model_turn_the_text() -> None:
    doc = continued_message(ASKED, Partial("Hello wor ", used=3), INSTRUCTION)
    assert doc["messages"][1:] == [
        {"role": "assistant", "content": "Hello wor "},
        {"role": "user", "content": INSTRUCTION_TEXT},
    ]
    assert partial_chat(chat_body(doc), INSTRUCTION)["messages"][-1]["role"] == "user"
    doc = continued_message(ASKED, Partial("Hello wor ", used=3), MODEL_TURN)
    assert doc["messages"][-1] == {"role": "assistant", "content": "Hello wor "}
    with pytest.raises(CannotContinue):
        continued_message({**ASKED, "thinking": {"type": "enabled"}}, Partial("x", 1), MODEL_TURN)
