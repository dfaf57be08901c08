"""The parts of a continued stream that need no I/O: the ``continuation`` setting
(app/upstream/catalog.py), what a cut stream showed (app/upstream/transcript.py) and how a
continuation's chunks join it (app/upstream/splice.py)."""

from __future__ import annotations

import json

import pytest

from app.request.events import malformed_chunk
from app.upstream.catalog import ConfigError, load
from app.upstream.splice import Before, Splice, add_usage
from app.upstream.transcript import Transcript
from llmgate_wire import sse
from simulator.playback import cut_short

TABLE = '[[upstreams]]\nname = "a"\nbase_url = "http://x/v1"\nmodels = ["m"]\n'


def event(data: dict | str) -> sse.Event:
    payload = data if isinstance(data, str) else json.dumps(data)
    return sse.Event(b"data: " + payload.encode() + b"\n\n", payload)


def chunk(delta: dict, finish: str | None = None, index: int = 0, **more) -> sse.Event:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return event({"id": "c-1", "created": 7, "model": "m", "choices": [choice], **more})


# -- the setting --------------------------------------------------------------------------------
def test_continuation_is_off_unless_set() -> None:
    (spec,) = load(TABLE, {})
    assert spec.continuation == "off" and not spec.continues("m")
    (spec,) = load(TABLE + 'continuation = "prefix"\n', {})
    assert spec.continues("m") and not spec.continues("other")


@pytest.mark.parametrize(
    "extra", ['continuation = "prefill"\n', 'kind = "anthropic"\ncontinuation = "prefix"\n']
)
def test_a_mode_the_kind_has_not_is_refused_at_start(extra: str) -> None:
    with pytest.raises(ConfigError, match="continuation"):
        load(TABLE + extra, {})


def test_another_model_is_continued_only_where_the_file_allows_it() -> None:
    table = TABLE.replace('["m"]', '["n", "n2"]') + 'continuation = "prefix"\n'
    (spec,) = load(table, {})
    assert not spec.continues("m") and spec.continues("n")
    (spec,) = load(table + 'continues_models = ["m"]\n', {})
    assert spec.continues("m") and not spec.continues("k") and spec.continues("n2")
    assert (spec.continued_as("m"), spec.continued_as("n2")) == ("n", "n2")


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ('continuation = "prefix"\ncontinues_models = []\n', "non-empty list"),
        ('continuation = "prefix"\ncontinues_models = [""]\n', "non-empty list"),
        ('continues_models = ["m"]\n', "needs upstreams.continuation"),
        ('continuation = "prefix"\ncontinues_models = "m"\n', "continues_models"),
    ],
)
def test_continues_models_is_checked_at_start(extra: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load(TABLE + extra, {})
    anything = TABLE.replace('["m"]', '["*"]') + 'continuation = "prefix"\n'
    with pytest.raises(ConfigError, match="named models"):
        load(anything + 'continues_models = ["m"]\n', {})


# -- what the caller was shown ------------------------------------------------------------------
def test_the_transcript_reads_the_text_and_the_identity() -> None:
    t = Transcript()
    t.read([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
            chunk({"content": "lo"}), event(sse.DONE)])  # fmt: skip
    assert (t.answer, t.outputs, t.id, t.created, t.blocker) == ("Hello", 2, "c-1", 7, None)


@pytest.mark.parametrize(
    ("shown", "why"),
    [
        (chunk({}, finish="stop"), "finished"),
        (chunk({"reasoning_content": "hmm"}), "thinking"),
        (chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), "tool_call"),
        (chunk({"content": "b"}, index=1), "choices"),
        (chunk({"refusal": "no"}), "finished"),
    ],
)
def test_what_cannot_be_continued_is_named(shown: sse.Event, why: str) -> None:
    t = Transcript()
    t.read([chunk({"content": "a"}), shown])
    assert t.blocker == why


def test_a_running_usage_is_known_only_with_every_output_before_it() -> None:
    t = Transcript()
    t.read([chunk({"content": "a"}, usage={"completion_tokens": 1}), chunk({"content": "b"})])
    assert t.usage_at == 1 and t.outputs == 2  # the last output came after it: not whole


# -- the join -----------------------------------------------------------------------------------
def test_usage_is_added_member_by_member() -> None:
    a = {"prompt_tokens": 2, "completion_tokens": 4, "details": {"cached": 1}, "tier": "x"}
    b = {"prompt_tokens": 6, "completion_tokens": 8, "details": {"cached": 2}, "tier": "y"}
    assert add_usage(a, b) == {
        "prompt_tokens": 8, "completion_tokens": 12, "details": {"cached": 3}, "tier": "x"
    }  # fmt: skip


def test_an_estimate_counts_each_cut_prompt_and_one_token_a_chunk() -> None:
    before = Before(calls=1, outputs=4)
    assert before.estimated
    assert before.of({"prompt_tokens": 6}) == {
        "prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6
    }  # fmt: skip
    assert Before(calls=2, outputs=4).of({"prompt_tokens": 6})["prompt_tokens"] == 4  # 2 cuts
    known = Before(calls=1, outputs=4, known={"prompt_tokens": 2, "completion_tokens": 4})
    assert not known.estimated and known.of({"prompt_tokens": 99})["prompt_tokens"] == 2


def test_the_continuation_s_chunks_go_on_in_the_caller_s_stream() -> None:
    t = Transcript()
    t.read([chunk({"role": "assistant", "content": "a"})])
    splice = Splice(t, Before(calls=1, outputs=1))
    theirs = {"id": "c-2", "created": 9, "model": "m"}
    out = splice.events([
        event({**theirs, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        event({**theirs, "choices": [{"index": 0, "delta": {"content": " b"}}]}),
        event({**theirs, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                   "total_tokens": 4}}),
        event(sse.DONE),
    ])  # fmt: skip
    got = [e.json() for e in out[:-1]]
    assert [(c["id"], c["created"]) for c in got] == [("c-1", 7)] * 2  # the role chunk is gone
    assert got[0]["choices"][0]["delta"] == {"content": " b"}
    assert got[1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert out[-1].data == sse.DONE


def test_after_a_prefill_the_whitespace_the_caller_has_is_not_sent_twice() -> None:
    t = Transcript()
    t.read([chunk({"content": "Hello "})])  # the prefill was "Hello"
    splice = Splice(t, Before(calls=1, outputs=1), relayed_space=True)
    texts = [" ", " world", " again"]
    out = splice.events([chunk({"content": piece}) for piece in texts])
    assert [e.json()["choices"][0]["delta"] for e in out] == [
        {"content": "world"},
        {"content": " again"},
    ]


# -- a malformed event ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "bad"),
    [
        ('{"id":"c-1","choices":[]}', False),
        (' {"id":"c-1"}\n', False),  # whitespace around an object
        (sse.DONE, False),
        ("", False),  # a keep-alive
        (None, False),  # a comment
        ('{"id":"c-1","choi', True),  # cut short
        ("upstream hiccup", True),
        ('["a"]', True),  # JSON, but no chunk
        ('"a"', True),
    ],
)
def test_a_malformed_chunk_is_told_by_its_braces(data: str | None, bad: bool) -> None:
    assert malformed_chunk(data) is bad


def test_the_simulator_cuts_a_piece_short_into_an_event_that_is_not_json() -> None:
    piece = b'data: {"a":1}\n\nevent: x\ndata: {"id":"c-1","choices":[]}\n\n'
    out = cut_short(piece)
    assert out.startswith(b'data: {"a":1}\n\nevent: x\ndata: ') and out.endswith(b"\n\n")
    events = sse.Decoder().feed(out)
    assert len(events) == 2 and events[0].data == '{"a":1}'
    with pytest.raises(ValueError):
        json.loads(events[1].data or "")
