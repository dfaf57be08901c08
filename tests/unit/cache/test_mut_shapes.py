"""Stream → object and stream replay edges the mutation run found untested (app/cache/shapes.py).

Expected values: the OpenAI chat/legacy streaming formats (a chunk's delta carries `role` once
or repeated, text fields, `tool_calls` fragments merged by `index`; the default role and tool
type are "assistant" and "function"), the SSE rules (a comment or an `event: message` line is
not data of its own), and the normalisation rules in the module docstring. Every ShapeError
is checked by its message, so a test passes only when the intended check fired.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.cache import shapes
from app.cache.shapes import ShapeError
from llmgate_wire import sse

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}
LEGACY = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m"}
DONE = b"data: [DONE]\n\n"
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _event({**HEAD, "choices": [choice], **extra})


def _stop() -> bytes:
    return _chunk({}, "stop")


def _message(*deltas: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    events = [_chunk(d) for d in deltas] + [_chunk({}, finish), DONE]
    return shapes.assemble_chat(events)["choices"][0]["message"]


def _rejects(events: list[bytes], message: str, *, legacy: bool = False) -> None:
    assemble = shapes.assemble_completion if legacy else shapes.assemble_chat
    with pytest.raises(ShapeError, match="^" + re.escape(message) + "$"):
        assemble(events)


# --- events that are not data ----------------------------------------------------------------


def test_a_heartbeat_comment_mid_stream_is_skipped_not_the_end() -> None:
    events = [_chunk({"content": "a"}), b": ping\n\n", _chunk({"content": "b"}), _stop(), DONE]
    assert shapes.assemble_chat(events)["choices"][0]["message"]["content"] == "ab"
    # Without [DONE] after the comment the stream is still incomplete.
    _rejects(events[:2], "the stream did not end with data: [DONE]")


def test_an_explicit_message_event_type_is_the_default_type() -> None:
    typed = b"event: message\n" + _chunk({"content": "hi"})
    assert shapes.assemble_chat([typed, _stop(), DONE])["choices"][0]["message"]["content"] == "hi"
    _rejects(
        [b"event: error\n" + _chunk({"content": "x"}), DONE],
        "unexpected 'error' event in the stream",
    )


# --- rejected streams, each by the check that should reject it ------------------------------


def test_rejections_name_what_is_wrong() -> None:
    _rejects([b"data: {nope\n\n", DONE], "event data is not JSON")
    _rejects([_event([1]), DONE], "the stream carries an error or a non-object event")
    _rejects(
        [_event({"error": {"message": "overloaded"}}), DONE],
        "the stream carries an error or a non-object event",
    )
    _rejects(
        [_event({**LEGACY, "choices": []}), DONE],
        "not a chat.completion.chunk chunk: 'text_completion'",
    )
    _rejects(
        [_event({**HEAD, "choices": []}), DONE],
        "not a text_completion chunk: 'chat.completion.chunk'",
        legacy=True,
    )
    _rejects([DONE], "the stream has no chunks")
    _rejects(
        [_event({"object": "chat.completion.chunk", "choices": []}), DONE],
        "id, created or model is missing",
    )
    _rejects([_event({**HEAD, "choices": []}), DONE], "the stream has no choices")
    _rejects([_chunk({"content": "a"}), DONE], "choice 0 never finished: a truncated stream")
    _rejects(
        [_event({**LEGACY, "choices": [{"index": 1, "text": "a"}]}), DONE],
        "choice 1 never finished: a truncated stream",
        legacy=True,
    )
    _rejects(
        [_event({**LEGACY, "choices": [{"index": 0, "text": 5}]}), DONE],
        "text is not a string",
        legacy=True,
    )
    _rejects([_chunk({}, finish=5), DONE], "finish_reason is not a string")  # type: ignore[arg-type]
    _rejects(
        [_event({**HEAD, "choices": [{"index": 0, "delta": "x", "finish_reason": "stop"}]}), DONE],
        "delta is not an object",
    )
    _rejects([_chunk({"content": 1}, "stop"), DONE], "content is not a string")
    _rejects([_chunk({"role": 1}, "stop"), DONE], "role is not a string")
    _rejects([_chunk({"annotations": {}}, "stop"), DONE], "annotations is not a list")
    _rejects([_chunk({"function_call": []}, "stop"), DONE], "function is not an object")
    _rejects([_chunk({"function_call": {"name": 1}}, "stop"), DONE], "name is not a string")
    _rejects(
        [
            _chunk(
                {},
                "stop",
                **{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": []}]},
            ),
            DONE,
        ],
        "logprobs is not an object",
    )
    _rejects(
        [
            _event(
                {
                    **HEAD,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {},
                            "finish_reason": "stop",
                            "logprobs": {"content": {}},
                        }
                    ],
                }
            ),
            DONE,
        ],
        "logprobs.content is not a list",
    )
    # An error chunk that otherwise looks like a chunk (some compatible servers send these).
    _rejects(
        [_chunk({}, error={"message": "overloaded"}), DONE],
        "the stream carries an error or a non-object event",
    )
    # A stream that ends with [DONE] but whose last data is not JSON is still rejected by
    # the first check that sees it, the JSON one.
    _rejects([_chunk({"content": "a"}, "stop"), b"data: [DONE\n\n", DONE], "event data is not JSON")


@pytest.mark.parametrize("choice", [{"delta": {}, "finish_reason": "stop"}, "x", {"index": "0"}])
def test_a_choice_must_have_an_integer_index(choice: Any) -> None:
    _rejects([_event({**HEAD, "choices": [choice]}), DONE], "a choice without an index")


@pytest.mark.parametrize("call", [{"id": "t", "function": {"name": "f"}}, "x", {"index": None}])
def test_a_tool_call_fragment_must_have_an_integer_index(call: Any) -> None:
    _rejects(
        [_chunk({"tool_calls": [call]}, "tool_calls"), DONE], "a tool call delta without an index"
    )


def test_tool_call_field_types_are_checked() -> None:
    _rejects([_chunk({"tool_calls": {}}, "stop"), DONE], "tool_calls is not a list")
    bad_id = {"index": 0, "id": 5, "function": {"name": "f"}}
    _rejects([_chunk({"tool_calls": [bad_id]}, "tool_calls"), DONE], "tool call id is not a string")
    bad_type = {"index": 0, "id": "t", "type": 5, "function": {"name": "f"}}
    _rejects(
        [_chunk({"tool_calls": [bad_type]}, "tool_calls"), DONE], "tool call type is not a string"
    )
    no_id = {"index": 0, "function": {"name": "f"}}
    _rejects([_chunk({"tool_calls": [no_id]}, "tool_calls"), DONE], "tool calls [0] have no id")


# --- custom tool calls: not converted (README: a miss, never a partial answer) ---------------


def test_a_custom_tool_call_is_not_assembled_into_an_empty_function_call() -> None:
    custom = {"index": 0, "id": "t1", "type": "custom", "custom": {"name": "grep", "input": "x"}}
    _rejects(
        [_chunk({"tool_calls": [custom]}, "tool_calls"), DONE],
        "tool call 0 is a 'custom' call, not a function call",
    )


def test_a_tool_call_fragment_with_an_unknown_field_is_not_dropped_silently() -> None:
    later = {"index": 0, "custom": {"input": "more"}}
    first = {"index": 0, "id": "t1", "type": "function", "function": {"name": "f", "arguments": ""}}
    events = [_chunk({"tool_calls": [first]}), _chunk({"tool_calls": [later]}, "tool_calls"), DONE]
    _rejects(events, "tool call 0 has a field that is not converted: 'custom'")


# --- message normalisation -----------------------------------------------------------------


def test_the_role_defaults_to_assistant_and_a_repeated_role_is_not_concatenated() -> None:
    assert _message({"content": "hi"})["role"] == "assistant"
    repeated = _message(
        {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}
    )
    assert (repeated["role"], repeated["content"]) == ("assistant", "ab")


def test_a_tool_call_without_a_type_is_a_function_call() -> None:
    call = {"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{}"}}
    message = _message({"tool_calls": [call]}, finish="tool_calls")
    assert message["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]


@pytest.mark.parametrize(
    ("deltas", "content", "refusal"),
    [
        # Empty content with a tool call, a function call or a refusal: null (the API's shape).
        (
            [{"content": ""}, {"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f"}}]}],
            None,
            None,
        ),
        ([{"content": ""}, {"function_call": {"name": "f", "arguments": "{}"}}], None, None),
        ([{"content": ""}, {"refusal": "I can't."}], None, "I can't."),
        # An empty refusal is no refusal; a plain empty answer keeps its "".
        ([{"content": "", "refusal": ""}], "", None),
        ([{"content": "hi", "refusal": ""}], "hi", None),
        ([{"refusal": "no"}], None, "no"),
    ],
)
def test_empty_text_normalisation(deltas: list[dict[str, Any]], content: Any, refusal: Any) -> None:
    message = _message(*deltas)
    assert (message["content"], message["refusal"]) == (content, refusal)
    assert set(message) <= shapes.MESSAGE_KEYS


# --- the header --------------------------------------------------------------------------


def test_optional_header_fields_take_the_first_non_null_value_sent() -> None:
    events = [
        _chunk({"content": "a"}, system_fingerprint=None),
        _chunk({"content": "b"}, system_fingerprint="fp_1", service_tier=None),
        _chunk({}, "stop", system_fingerprint="fp_2"),
        DONE,
    ]
    completion = shapes.assemble_chat(events)
    assert (completion["system_fingerprint"], completion["service_tier"]) == ("fp_1", None)


def test_optional_header_fields_that_are_always_null_stay_null() -> None:
    events = [_chunk({"content": "a"}, system_fingerprint=None), _stop(), DONE]
    completion = shapes.assemble_chat(events)
    assert completion["system_fingerprint"] is None and "service_tier" not in completion


# --- replay ----------------------------------------------------------------------------------


def _usage_chunk() -> bytes:
    return _event({**HEAD, "choices": [], "usage": USAGE})


def test_a_hit_decodes_only_the_tail_of_a_stream_stored_one_event_per_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the cache stores: one whole event per item. A hit replays them as they are; only
    # the events from [DONE] back to the last choice chunk are decoded, not all fifty.
    stored = [_chunk({"content": str(i)}) for i in range(48)] + [_stop(), DONE]
    decoded: list[bytes] = []
    feed = sse.Decoder.feed

    def counting(self: sse.Decoder, chunk: bytes) -> list[sse.Event]:
        decoded.append(chunk)
        return feed(self, chunk)

    monkeypatch.setattr(sse.Decoder, "feed", counting)
    for include_usage in (True, False):
        decoded.clear()
        assert shapes.replay_events(stored, include_usage=include_usage) == stored
        assert decoded == [DONE, _stop()]


def test_a_stream_stored_as_it_arrived_replays_one_event_per_item() -> None:
    # Items cut anywhere (as the upstream's reads came) are decoded whole; the replay is one
    # event per item all the same (the stream observer counts and reads each item as one
    # event), then the unfinished rest, if any: never an empty item.
    events = [_chunk({"content": "a"}), b": ping\n\n", _stop(), DONE]
    whole = b"".join(events)
    for cut in ([whole], [whole[:9], whole[9:40], whole[40:]]):
        for include_usage in (True, False):
            assert shapes.replay_events(cut, include_usage=include_usage) == events
    assert shapes.replay_events([whole + b"data: x"], include_usage=True) == [*events, b"data: x"]


def test_replay_keeps_the_bytes_after_done() -> None:
    stored = [_chunk({"content": "a"}), _stop(), DONE, b": trailing"]
    for include_usage in (True, False):
        assert shapes.replay_events(stored, include_usage=include_usage) == stored


def test_replay_needs_done_and_says_so() -> None:
    with pytest.raises(ShapeError, match=r"^the stream did not end with data: \[DONE\]$"):
        shapes.replay_events([_stop()], include_usage=False)


def test_replay_of_a_stream_without_choice_chunks() -> None:
    assert shapes.replay_events([DONE], include_usage=True) == [DONE]
    assert shapes.replay_events([DONE], include_usage=False) == [DONE]
    # Only a usage chunk: dropped when not wanted, kept when wanted.
    assert shapes.replay_events([_usage_chunk(), DONE], include_usage=False) == [DONE]
    assert shapes.replay_events([_usage_chunk(), DONE], include_usage=True) == [
        _usage_chunk(),
        DONE,
    ]


def test_replay_finds_the_usage_chunk_behind_a_heartbeat() -> None:
    stored = [_chunk({"content": "a"}), _stop(), _usage_chunk(), b": ping\n\n", DONE]
    assert shapes.replay_events(stored, include_usage=False) == [
        stored[0],
        stored[1],
        b": ping\n\n",
        DONE,
    ]
    assert shapes.replay_events(stored, include_usage=True) == stored


def test_replay_does_not_add_a_second_usage_chunk() -> None:
    # A server that put usage on the last choice chunk and also sent a usage chunk.
    stored = [_chunk({"content": "a"}), _chunk({}, "stop", usage=USAGE), _usage_chunk(), DONE]
    assert shapes.replay_events(stored, include_usage=True) == stored


def test_a_synthesized_usage_chunk_does_not_invent_an_object_type() -> None:
    last = {k: v for k, v in HEAD.items() if k != "object"}
    stored = [_event({**last, "choices": [{"index": 0, "delta": {}}], "usage": USAGE}), DONE]
    replayed = shapes.replay_events(stored, include_usage=True)
    assert json.loads(replayed[1][len(b"data: ") :]) == {
        **last,
        "object": "",
        "choices": [],
        "usage": USAGE,
    }


def test_replay_rejects_a_tail_that_is_not_completion_chunks() -> None:
    for bad, message in [
        (b"data: {nope\n\n", "event data is not JSON"),
        (_event([1]), "not a completion chunk"),
        (_event({**HEAD}), "not a completion chunk"),
    ]:
        with pytest.raises(ShapeError, match="^" + re.escape(message) + "$"):
            shapes.replay_events([bad, DONE], include_usage=False)


def test_a_chunk_that_cannot_be_encoded_is_a_shape_error() -> None:
    with pytest.raises(ShapeError, match=r"^cannot encode the chunk: "):
        shapes.encode_chunk({"content": "\ud800"})
