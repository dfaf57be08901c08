"""The parts of a continued ``/v1/messages`` stream that need no I/O: what the cut message
showed (app/upstream/message_splice.py's ``MessageTranscript``) and how a continuation's
named events join it (``MessageSplice``): one message_start, the block indexes going on, the
usage summed."""

from __future__ import annotations

import json

import pytest

from app.request.routes import CHAT, MESSAGES
from app.upstream.continued_doors import CHAT_DOOR, MESSAGES_DOOR, door_of
from app.upstream.hold import ToolHold
from app.upstream.message_hold import MessageToolHold
from app.upstream.message_splice import MessageSplice, MessageTranscript
from app.upstream.splice import Before
from llmgate_wire import sse


def ev(kind: str, **members) -> sse.Event:
    payload = json.dumps({"type": kind, **members})
    return sse.Event(f"event: {kind}\ndata: {payload}\n\n".encode(), payload, event=kind)


def start(id: str = "msg_1", input_tokens: int = 5) -> sse.Event:
    usage = {"input_tokens": input_tokens, "output_tokens": 1}
    return ev("message_start", message={"id": id, "model": "m", "usage": usage})


def block(index: int, kind: str = "text") -> sse.Event:
    empty = {"text": {"type": "text", "text": ""}, "thinking": {"type": "thinking"}}
    return ev("content_block_start", index=index, content_block=empty.get(kind, {"type": kind}))


def text(index: int, words: str) -> sse.Event:
    return ev("content_block_delta", index=index, delta={"type": "text_delta", "text": words})


def stop(index: int) -> sse.Event:
    return ev("content_block_stop", index=index)


def finish(output: int, reason: str = "end_turn") -> sse.Event:
    return ev("message_delta", delta={"stop_reason": reason}, usage={"output_tokens": output})


def read(*events: sse.Event) -> MessageTranscript:
    t = MessageTranscript()
    t.read(events)
    return t


def data(events: list[sse.Event]) -> list[dict]:
    return [json.loads(e.data) for e in events if e.data]


def test_each_route_is_continued_in_its_door_s_dialect() -> None:
    assert door_of(MESSAGES) is MESSAGES_DOOR and door_of(CHAT) is CHAT_DOOR
    assert isinstance(MESSAGES_DOOR.hold(True), MessageToolHold)
    assert type(CHAT_DOOR.hold(True)) is ToolHold


def test_the_transcript_reads_the_text_and_the_open_block() -> None:
    t = read(start(), ev("ping"), block(0), text(0, "Hello"), text(0, " wor"))
    assert (t.answer, t.id, t.model, t.outputs, t.shown) == ("Hello wor", "msg_1", "m", 2, 5)
    assert t.open == (0, "text") and t.blocks == 1 and t.blocker is None and t.usage is None
    t.read([stop(0)])
    assert t.open is None and t.blocker is None


@pytest.mark.parametrize(
    ("events", "why"),
    [
        ([block(0, "thinking")], "thinking"),
        ([block(0, "redacted_thinking")], "thinking"),
        ([block(0, "tool_use")], "tool_call"),
        ([block(0, "server_tool_use")], "tool_call"),
        ([block(0), text(0, "x"), stop(0), finish(1)], "finished"),
        ([ev("message_stop")], "finished"),
    ],
)
def test_what_the_message_showed_says_why_it_cannot_be_continued(events, why) -> None:
    assert read(start(), *events).blocker == why


def test_the_cut_text_goes_on_in_its_block_and_the_usage_is_both_calls() -> None:
    t = read(start(), block(0), text(0, "Hello"), text(0, " wor"))
    splice = MessageSplice(t, Before(calls=1, outputs=2), relayed_space=False)
    rest = [start("msg_2", input_tokens=7), ev("ping"), block(0), text(0, "ld"), stop(0)]
    out = splice.events([*rest, finish(3), ev("message_stop")])
    assert [e.event for e in out] == [
        "ping",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    got = data(out)
    assert got[1]["index"] == got[2]["index"] == 0 and got[1]["delta"]["text"] == "ld"
    # The cut call's prompt is the continuation's less the 2 output events shown.
    assert got[3]["usage"] == {"input_tokens": 5 + 7, "output_tokens": 2 + 3}
    assert got[3]["delta"]["stop_reason"] == "end_turn"


def test_a_continuation_s_other_blocks_follow_the_caller_s() -> None:
    """Cut inside a text block, continued with a tool call: the text block is ended, the
    call is the next block; cut between blocks, the continuation's blocks come after."""
    t = read(start(), block(0), text(0, "Let me"))
    splice = MessageSplice(t, Before(calls=1, outputs=1), relayed_space=False)
    out = data(splice.events([start(), block(0, "tool_use"), stop(0), block(1), stop(1)]))
    assert [(d["type"], d["index"]) for d in out] == [
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_stop", 2),
    ]
    t = read(start(), block(0), text(0, "Done."), stop(0))
    splice = MessageSplice(t, Before(calls=1, outputs=1), relayed_space=False)
    out = data(splice.events([start(), block(0), text(0, " More"), stop(0)]))
    assert [(d["type"], d["index"]) for d in out] == [
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
    ]


def test_after_a_prefill_the_continuation_s_leading_space_is_not_relayed_twice() -> None:
    t = read(start(), block(0), text(0, "Hello "))
    splice = MessageSplice(t, Before(calls=1, outputs=1), relayed_space=True)
    out = splice.events([start(), block(0), text(0, " "), text(0, " world"), text(0, " !")])
    assert [d["delta"]["text"] for d in data(out)] == ["world", " !"]


def test_a_message_the_caller_never_began_keeps_the_continuation_s_start() -> None:
    splice = MessageSplice(read(), Before(calls=1, outputs=0), relayed_space=False)
    out = splice.events([start("msg_2"), ev("ping"), ev("message_stop")])
    assert [e.event for e in out] == ["message_start", "ping", "message_stop"]


def test_a_held_tool_call_waits_for_the_finish_and_a_cut_drops_it() -> None:
    """Text passes; from a tool_use block's start nothing but pings, until message_delta;
    an error event drops the held part; a cut's drop says how much output it held."""
    hold = MessageToolHold(True)
    args = ev(
        "content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": "{"}
    )
    opened = [block(0), text(0, "Hi"), stop(0), block(1, "tool_use"), ev("ping"), args]
    assert [e.event for e in hold.take(opened)] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "ping",
    ]
    assert [e.event for e in hold.take([stop(1), finish(3), ev("message_stop")])] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    hold.take([block(2, "tool_use"), args])
    lost = hold.drop()
    assert lost.outputs == 1 and lost.tool_call and hold.held == []
    hold.take([block(2, "tool_use")])
    assert [e.event for e in hold.take([args, ev("error")])] == ["error"]
    off = MessageToolHold(False)
    assert off.take(opened) == opened


def test_after_an_instruction_the_repeat_is_trimmed_and_a_held_start_let_go() -> None:
    """The continuation's repeat of the answer's end is not relayed; a start held as a
    possible repeat goes, before the event that shows it was none."""
    t = read(start(), block(0), text(0, "Hello there world"))
    splice = MessageSplice(t, Before(calls=1, outputs=1), trim=True)
    out = splice.events([start(), block(0), text(0, " there"), text(0, " world"), text(0, " ok")])
    assert [d["delta"]["text"] for d in data(out)] == [" ok"]
    splice = MessageSplice(t, Before(calls=1, outputs=1), trim=True)
    out = splice.events([start(), block(0), text(0, " there wor"), ev("ping"), stop(0)])
    assert [
        (e.event, d.get("delta", {}).get("text")) for e, d in zip(out, data(out), strict=True)
    ] == [
        ("ping", None),
        ("content_block_delta", " there wor"),
        ("content_block_stop", None),
    ]
    assert [d["index"] for d in data(out)[1:]] == [0, 0]
