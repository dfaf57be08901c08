"""Streamed answers from an Anthropic-kind upstream as the OpenAI SDK accumulates them, and
sent back on the next turn (issue 41, D and E), through the whole stack (nginx, a gevent
worker) with the real SDK.

D: a tool call without arguments, streamed as Anthropic streams it (``input: {}``, then
``partial_json: ""``), must accumulate to JSON arguments, ``"{}"``, as the same answer not
streamed has them. The upstream is tests/support/scripted_server.py sending the raw fixture
tests/data/dialects/anthropic/tool_no_arguments.sse (the simulator writes no such call).
E: the simulator's ``thinking`` script streamed from its Anthropic dialect, accumulated by
the SDK's own stream helper and sent back as the SDK sends a message object: the simulator's
request log must show Anthropic's thinking block with its text and its signature.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from simulator import scripts
from tests.conftest import ROOT
from tests.support.scripted_server import Exchange, LoopbackServer, Request
from tests.support.sdks import openai_sdk
from tests.support.sim import sim_requests
from tests.support.stack import config_stack

NO_ARGUMENTS = ROOT / "tests" / "data" / "dialects" / "anthropic" / "tool_no_arguments.sse"
WHOLE = {
    "id": "msg_noargs",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [
        {"type": "tool_use", "id": "toolu_01N", "name": "get_time", "input": {}},
        {"type": "tool_use", "id": "toolu_01M", "name": "list_rooms", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 120, "output_tokens": 31},
}
QUESTION: Any = [{"role": "user", "content": "What time is it, and which rooms are there?"}]


def _anthropic(request: Request, exchange: Exchange) -> None:
    """Anthropic's Messages API answering every call with the two calls without arguments:
    the raw stream in pieces cut mid-event, or the whole message."""
    if not request.json().get("stream"):
        exchange.respond(200, WHOLE)
        return
    raw = NO_ARGUMENTS.read_bytes()
    exchange.start_stream()
    for i in range(0, len(raw), 97):
        exchange.send(raw[i : i + 97])
    exchange.finish()


@pytest.fixture(scope="module")
def scripted() -> Iterator[LoopbackServer]:
    with LoopbackServer(_anthropic) as server:
        yield server


@pytest.fixture(scope="module")
def scripted_gw(make_stack, tmp_path_factory, scripted: LoopbackServer):
    toml = f"""
[[upstreams]]
name = "claude"
kind = "anthropic"
base_url = "{scripted.url}/v1"
models = ["m-anthropic"]
"""
    return config_stack(make_stack, tmp_path_factory, toml)


def test_a_tool_call_without_arguments_streams_as_json(scripted_gw) -> None:
    with openai_sdk(scripted_gw.url) as sdk:
        with sdk.chat.completions.stream(model="m-anthropic", messages=QUESTION) as stream:
            for _ in stream:
                pass
            streamed = stream.current_completion_snapshot.choices[0].message
        whole = sdk.chat.completions.create(model="m-anthropic", messages=QUESTION)
    calls = _calls(streamed.model_dump())
    assert calls == [("toolu_01N", "get_time", "{}"), ("toolu_01M", "list_rooms", "{}")]
    assert _calls(whole.choices[0].message.model_dump()) == calls


def _calls(message: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]


def test_a_streamed_thinking_block_goes_back_with_its_text_and_signature(
    kinds_gw, upstream_sim
) -> None:
    (thinking,) = scripts.SCRIPTS["thinking"].of_kind("thinking")
    script = {"x-sim-script": "thinking"}
    with openai_sdk(kinds_gw.url) as sdk:
        with sdk.chat.completions.stream(
            model="m-anthropic", messages=QUESTION, extra_headers=script
        ) as stream:
            for _ in stream:
                pass
            message = stream.current_completion_snapshot.choices[0].message
        assert message.content == "The answer is 42."
        turn = [*QUESTION, message, {"role": "user", "content": "Why?"}]
        sdk.chat.completions.create(model="m-anthropic", messages=turn, extra_headers=script)
    sent = sim_requests(upstream_sim)[-1]["body"]
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thinking.text, "signature": thinking.signature},
            {"type": "text", "text": "The answer is 42."},
        ],
    }
    assert thinking.text == "Let me think it through."
