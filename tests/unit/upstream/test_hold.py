"""A stream's tool calls held until the answer's finish (app/upstream/hold.py), and the
``hold_tool_calls`` setting (app/upstream/catalog.py)."""

from __future__ import annotations

import json

import pytest

from app.upstream.catalog import ConfigError, load
from app.upstream.hold import ToolHold
from llmgate_wire import sse

TABLE = '[[upstreams]]\nname = "a"\nbase_url = "http://x/v1"\ncontinuation = "prefix"\n'


def event(data: dict | str) -> sse.Event:
    payload = data if isinstance(data, str) else json.dumps(data)
    return sse.Event(b"data: " + payload.encode() + b"\n\n", payload)


def chunk(delta: dict, finish: str | None = None, **more: dict) -> sse.Event:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return event({"id": "c", "choices": [choice], **more})


def call(arguments: str, **start: str) -> sse.Event:
    return chunk({"tool_calls": [{"index": 0, **start, "function": {"arguments": arguments}}]})


PING = sse.Event(b": ping\n\n", comments=("ping",))
TEXT, FINISH, DONE = chunk({"content": "Let"}), chunk({}, "tool_calls"), event(sse.DONE)


def test_the_setting_is_off_unless_set_and_a_boolean() -> None:
    (spec,) = load(TABLE, {})
    assert spec.hold_tool_calls is False
    (spec,) = load(TABLE + "hold_tool_calls = true\n", {})
    assert spec.hold_tool_calls is True
    with pytest.raises(ConfigError, match="hold_tool_calls has the wrong type"):
        load(TABLE + 'hold_tool_calls = "yes"\n', {})


def test_off_every_event_goes_as_it_came() -> None:
    batch = [TEXT, call("{", id="c1"), call("}"), FINISH, DONE]
    assert ToolHold(False).take(batch) == batch


def test_on_a_call_is_held_until_the_finish_and_then_goes_in_order() -> None:
    hold = ToolHold(True)
    start, rest = call('{"a"', id="c1"), call(":1}")
    assert hold.take([TEXT, start]) == [TEXT]
    assert hold.take([PING, rest]) == [PING]  # a comment is not held
    assert hold.take([FINISH, DONE]) == [start, rest, FINISH, DONE]
    assert hold.take([TEXT]) == [TEXT] and hold.held == []


def test_on_done_releases_a_call_whose_finish_never_came() -> None:
    hold = ToolHold(True)
    start = call("{}", id="c1")
    assert hold.take([start]) == [] and hold.take([DONE]) == [start, DONE]


def test_on_an_error_event_drops_the_held_call_and_goes() -> None:
    hold = ToolHold(True)
    error = event({"error": {"type": "overloaded_error"}})
    assert hold.take([call("{", id="c1"), error]) == [error] and hold.held == []


def test_a_finish_is_not_a_call_and_a_whole_call_with_its_finish_goes() -> None:
    hold = ToolHold(True)
    assert hold.take([FINISH]) == [FINISH]  # "tool_calls" as a finish reason opens nothing
    whole = chunk({"tool_calls": [{"index": 0, "id": "c1"}]}, "tool_calls")
    assert hold.take([whole]) == [whole] and hold.held == []


def test_drop_lets_go_of_the_held_events_and_reads_them() -> None:
    hold = ToolHold(True)
    usage = {"completion_tokens": 9}
    hold.take([call("{", id="c1"), chunk({"tool_calls": [{"index": 0}]}, usage=usage)])
    lost = hold.drop()
    assert hold.held == [] and lost.outputs == 2 and lost.usage == usage
    assert lost.usage_at == 2 and lost.answer == ""
