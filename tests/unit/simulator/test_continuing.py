"""The simulator continues its own answer from a partial assistant turn (simulator/continuing.py):
the cut answer and its continuation join into the uncut one; a scripted one goes on after the
text handed back."""

from __future__ import annotations

from typing import Any

import pytest

from app.dialects.continuation import INSTRUCTION_TEXT
from simulator import endpoints, provider_endpoints
from simulator.behaviour import Behaviour
from simulator.continuing import REPEATED_CHARS, repeated, script_rest
from simulator.scripts import SCRIPTS

USER = {"role": "user", "content": "tell me"}


def answer(body: dict[str, Any], tokens: int | None = None) -> tuple[str, str]:
    reply = endpoints.chat({"model": "m", **body}, Behaviour(tokens=tokens), lambda p: p + "1", 0)
    choice = reply.body["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


@pytest.mark.parametrize(
    ("turn", "extra"),
    [({"prefix": True}, {}), ({}, {"continue_final_message": True})],
    ids=["prefix", "continue_final_message"],
)
def test_a_partial_turn_is_continued_where_it_stopped(turn: dict, extra: dict) -> None:
    whole, _ = answer({"messages": [USER]}, tokens=10)
    so_far = " ".join(whole.split(" ")[:3])
    messages = [USER, {"role": "assistant", "content": so_far, **turn}]
    rest, finish = answer({"messages": messages, **extra}, tokens=10)
    assert so_far + rest == whole and finish == "stop"


def test_a_bounded_answer_writes_as_many_more_as_its_bound() -> None:
    whole, finish = answer({"messages": [USER], "max_tokens": 10})
    so_far = " ".join(whole.split(" ")[:4])
    messages = [USER, {"role": "assistant", "content": so_far, "prefix": True}]
    rest, again = answer({"messages": messages, "max_tokens": 6})
    assert so_far + rest == whole and finish == again == "length"


def test_an_assistant_turn_not_marked_is_an_ordinary_prompt() -> None:
    whole, _ = answer({"messages": [USER]}, tokens=10)
    so_far = " ".join(whole.split(" ")[:3])
    messages = [USER, {"role": "assistant", "content": so_far}]
    other, _ = answer({"messages": messages}, tokens=10)
    assert not (so_far + other).startswith(whole)
    assert len(other.split()) == 10


def test_an_anthropic_prefill_is_continued_where_it_stopped() -> None:
    def said(messages: list, cap: int = 100) -> tuple[str, int]:
        body = {"model": "m", "max_tokens": cap, "messages": messages}
        reply = provider_endpoints.messages(body, Behaviour(tokens=10), lambda p: p + "1")
        return reply.body["content"][0]["text"], reply.body["usage"]["input_tokens"]

    whole, prompt = said([USER])
    so_far = " ".join(whole.split(" ")[:4])
    rest, continued_prompt = said([USER, {"role": "assistant", "content": so_far}])
    assert so_far + rest == whole and continued_prompt == prompt + 4
    capped, _ = said([USER, {"role": "assistant", "content": so_far}], cap=2)
    assert len(capped.split()) == 2 and whole.startswith(so_far + capped)


def test_the_text_handed_back_is_left_out_and_the_calls_stay_whole() -> None:
    tools = SCRIPTS["tools"]
    rest = script_rest(tools, "Let me check.")
    assert rest.blocks == tools.blocks[1:] and rest.finish == tools.finish
    assert rest.usage.output == tools.usage.output - 4
    part = script_rest(tools, "Let me")
    assert part.blocks[0].pieces == (" check", ".") and part.blocks[1:] == tools.blocks[1:]


def test_other_text_or_none_changes_nothing() -> None:
    tools = SCRIPTS["tools"]
    assert script_rest(tools, None) is tools and script_rest(tools, "Let us") is tools
    assert script_rest(tools, "") is tools


def gemini_said(contents: list, cap: int = 100) -> tuple[str, int]:
    body = {"contents": contents, "generationConfig": {"maxOutputTokens": cap}}
    reply = provider_endpoints.generate(body, "m", False, Behaviour(tokens=10), lambda p: p + "1")
    parts = reply.body["candidates"][0]["content"]["parts"]
    return "".join(p["text"] for p in parts), reply.body["usageMetadata"]["promptTokenCount"]


def test_a_gemini_model_turn_is_continued_where_it_stopped() -> None:
    asked = {"role": "user", "parts": [{"text": "tell me"}]}
    whole, prompt = gemini_said([asked])
    so_far = " ".join(whole.split(" ")[:4])
    turn = {"role": "model", "parts": [{"text": so_far}]}
    rest, continued_prompt = gemini_said([asked, turn])
    assert so_far + rest == whole and continued_prompt == prompt + 4
    capped, _ = gemini_said([asked, turn], cap=2)
    assert len(capped.split()) == 2 and whole.startswith(so_far + capped)


GO_ON = INSTRUCTION_TEXT  # the gateway's words (app/dialects/continuation.py)


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "gemini"])
def test_an_instruction_is_followed_with_a_repeat_of_the_answer_s_end(dialect: str) -> None:
    """After an instruction to go on, the answer repeats the answer so far's last words (at
    least REPEATED_CHARS characters of it), then writes the rest of the uncut answer."""

    def said(turns: list[tuple[str, str]]) -> str:
        if dialect == "gemini":
            roles = {"user": "user", "assistant": "model"}
            return gemini_said([{"role": roles[r], "parts": [{"text": t}]} for r, t in turns])[0]
        messages = [{"role": r, "content": t} for r, t in turns]
        if dialect == "openai":
            return answer({"messages": messages}, tokens=10)[0]
        body = {"model": "m", "max_tokens": 100, "messages": messages}
        reply = provider_endpoints.messages(body, Behaviour(tokens=10), lambda p: p + "1")
        return reply.body["content"][0]["text"]

    whole = said([("user", "tell me")])
    so_far = " ".join(whole.split(" ")[:4])
    got = said([("user", "tell me"), ("assistant", so_far), ("user", GO_ON)])
    rest = whole[len(so_far) :]
    assert got.endswith(rest), (got, whole)
    repeat = got[: len(got) - len(rest)]
    assert so_far.endswith(repeat) and len(repeat) >= REPEATED_CHARS, repeat
    assert not repeat.startswith(" ") and len(got.split()) == 10 - 4 + len(repeat.split())
    other = said([("user", "tell me"), ("assistant", so_far), ("user", "and then?")])
    assert not other.endswith(rest)  # another user turn is an ordinary prompt


def test_the_repeat_is_the_whole_answer_when_it_is_short() -> None:
    assert repeated("a b") == ["a", " b"]
    assert repeated("") == []
    assert "".join(repeated("the a gateway token stream")) == "gateway token stream"
