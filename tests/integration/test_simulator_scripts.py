"""Scripted answers (``script=<name>``) on the OpenAI chat route, read by the OpenAI SDK, and
the same script asked of all three dialects over real TCP saying the same answer.

The cross-dialect check reads each dialect's whole answer into one neutral form (text,
thinking, signatures, tool calls with parsed arguments, finish in Chat Completions' names,
prompt/completion/cached counts), the mapping the gateway's translators follow
(app/dialects/: end_turn/STOP -> stop, max_tokens/MAX_TOKENS -> length,
tool_use -> tool_calls, refusal/SAFETY -> content_filter), so a script means one answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from simulator import scripts
from tests.support.sdks import openai_sdk
from tests.support.sim import SimProcess

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
FINISHED = [n for n in scripts.NAMES if n != "overload"]
pytestmark = pytest.mark.usefixtures("fresh_sim")  # each test starts from /sim/reset


@pytest.fixture
def client(sim: SimProcess) -> Iterator[openai.OpenAI]:
    with openai_sdk(sim.url) as sdk:
        yield sdk


def post(sim: SimProcess, path: str, body: Any, **headers: str) -> tuple[int, Any]:
    status, _, data = sim.send("POST", path, body, headers)
    return status, json.loads(data)


def test_tools_stream_through_the_openai_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="sim/script=tools",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict[str, str]] = {}
    content, finish, usage = "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                assert call.function is not None
                slot["id"] += call.id or ""
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
    assert content == "Let me check." and finish == "tool_calls"
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("call_sim_weather", "get_weather", scripts.WEATHER_ARGS),
        ("call_sim_time", "get_time", scripts.TIME_ARGS),
    ]
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (40, 52)


def test_thinking_whole_through_the_openai_sdk(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="sim/script=thinking", messages=MESSAGES)
    message = completion.choices[0].message
    assert message.content == "The answer is 42."
    extra = message.model_extra or {}
    assert extra["reasoning_content"] == "Let me think it through."
    assert extra["thinking_blocks"] == [
        {
            "type": "thinking",
            "thinking": "Let me think it through.",
            "signature": "c2ltLXNpZ25hdHVyZS0x",
        }
    ]
    assert completion.usage is not None
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 18


def test_overload_fails_the_stream_part_way_and_the_whole_answer_with_503(
    sim: SimProcess, client: openai.OpenAI
) -> None:
    seen: list[str] = []
    with pytest.raises(openai.APIError, match="Overloaded"):
        for chunk in client.chat.completions.create(
            model="sim/script=overload", messages=MESSAGES, stream=True
        ):
            seen.extend(c.delta.content for c in chunk.choices if c.delta.content)
    assert seen == ["Working", " on", " it"]
    status, body = post(
        sim,
        "/v1/chat/completions",
        {"model": "m", "messages": MESSAGES},
        **{"x-sim-script": "overload"},
    )
    assert status == 503 and body["error"]["type"] == "overloaded_error"


def test_script_is_refused_where_it_means_nothing(sim: SimProcess) -> None:
    status, body = post(
        sim, "/v1/completions", {"model": "m", "prompt": "x"}, **{"x-sim-script": "text"}
    )
    assert status == 400 and body["error"]["param"] == "script"


# --- the same script in every dialect ------------------------------------------------------


def from_chat(body: Any) -> dict[str, Any]:
    (choice,) = body["choices"]
    message, usage = choice["message"], body["usage"]
    return {
        "text": message["content"] or "",
        "thinking": message.get("reasoning_content", ""),
        "signatures": [b["signature"] for b in message.get("thinking_blocks", [])],
        "calls": [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls", [])
        ],
        "finish": choice["finish_reason"],
        "usage": (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"],
        ),
    }


def from_anthropic(body: Any) -> dict[str, Any]:
    blocks, usage = body["content"], body["usage"]
    of = lambda kind: [b for b in blocks if b["type"] == kind]  # noqa: E731
    prompt = sum(usage[k] for k in ("input_tokens", "cache_read_input_tokens"))
    return {
        "text": "".join(b["text"] for b in of("text")),
        "thinking": "".join(b["thinking"] for b in of("thinking")),
        "signatures": [b["signature"] for b in of("thinking")],
        "calls": [(b["id"], b["name"], b["input"]) for b in of("tool_use")],
        "finish": {
            "end_turn": "stop",
            "max_tokens": "length",
            "tool_use": "tool_calls",
            "refusal": "content_filter",
        }[body["stop_reason"]],
        "usage": (
            prompt + usage["cache_creation_input_tokens"],
            usage["output_tokens"],
            usage["cache_read_input_tokens"],
        ),
    }


def from_gemini(body: Any) -> dict[str, Any]:
    (candidate,) = body["candidates"]
    parts, meta = candidate["content"]["parts"], body["usageMetadata"]
    calls = [p["functionCall"] for p in parts if "functionCall" in p]
    finish = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter"}
    return {
        "text": "".join(p.get("text", "") for p in parts if not p.get("thought")),
        "thinking": "".join(p["text"] for p in parts if p.get("thought")),
        "signatures": [p["thoughtSignature"] for p in parts if "thoughtSignature" in p],
        "calls": [(c["id"], c["name"], c["args"]) for c in calls],
        "finish": "tool_calls" if calls else finish[candidate["finishReason"]],
        "usage": (
            meta["promptTokenCount"],
            meta["candidatesTokenCount"] + meta.get("thoughtsTokenCount", 0),
            meta.get("cachedContentTokenCount", 0),
        ),
    }


READERS = (from_chat, from_anthropic, from_gemini)


@pytest.mark.parametrize("name", FINISHED)
def test_a_script_is_one_answer_in_every_dialect(sim: SimProcess, name: str) -> None:
    control = {"x-sim-script": name}
    ask = {"model": "m", "max_tokens": 100, "messages": MESSAGES}
    gemini_ask = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    replies = [
        post(sim, "/v1/chat/completions", ask, **control),
        post(sim, "/v1/messages", ask, **control, **{"anthropic-version": "1"}),
        post(sim, "/v1beta/models/m:generateContent", gemini_ask, **control),
    ]
    assert [status for status, _ in replies] == [200, 200, 200]
    answers = [read(body) for read, (_, body) in zip(READERS, replies, strict=True)]
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["text"] == scripts.SCRIPTS[name].text
    stats = sim.stats()
    assert stats["requests_by_dialect"] == {"openai": 1, "anthropic": 1, "gemini": 1}
