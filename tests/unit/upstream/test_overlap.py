"""An instructed continuation's repeat of the answer so far, trimmed (app/upstream/overlap.py):
the longest suffix of the answer that starts the continuation, at least MIN_OVERLAP long (or
the whole answer), is not relayed, however the continuation's text is cut into chunks."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.upstream.overlap import MIN_OVERLAP, WINDOW, Trim, overlap
from app.upstream.splice import Before, Splice
from app.upstream.transcript import Transcript
from llmgate_wire import sse
from tests.support.strategies import cut_places


def fed(answer: str, continuation: str, cuts: list[int] | None = None) -> str:
    """What a Trim lets go of ``continuation``, fed in the pieces ``cuts`` make, the last
    one with the stream's next say (its finish)."""
    size = len(continuation) + 1
    places = sorted({0, len(continuation), *(c % size for c in cuts or [])})
    pieces = [continuation[a:b] for a, b in itertools.pairwise(places)] or [""]
    trim = Trim(answer)
    out = [trim.feed(piece) for piece in pieces[:-1]]
    return "".join(out) + trim.feed(pieces[-1], end=True)


@pytest.mark.parametrize(
    ("answer", "continuation", "relayed"),
    [
        ("The quick brown", "quick brown fox jumps", " fox jumps"),
        ("The quick brown", " brown fox", " brown fox"),  # 6 characters: kept
        ("in the", "the end", "the end"),  # a short match is the model's own words
        ("Hi", "Hi there", " there"),  # the whole answer so far, however short
        ("Hello wor", "ld and more", "ld and more"),  # no repeat at all
        ("one two three four", "one two three four five", " five"),
        ("", "anything", "anything"),
    ],
)
def test_the_longest_repeat_of_the_answer_s_end_is_left_out(
    answer: str, continuation: str, relayed: str
) -> None:
    assert fed(answer, continuation) == relayed
    assert fed(answer, continuation, list(range(len(continuation)))) == relayed  # a char a chunk


def test_the_start_is_held_only_while_it_could_still_be_a_repeat() -> None:
    trim = Trim("The quick brown")
    assert trim.feed("quick") == ""  # the answer has it: more may come
    assert trim.feed(" brown") == ""  # the answer's very end: still held (a finish may come)
    assert trim.feed(" fox") == " fox"  # no longer in the answer: let go, trimmed
    assert trim.feed(" jumps") == " jumps" and trim.done
    other = Trim("The quick brown")
    assert other.feed("A new") == "A new"  # not in the answer: nothing held at all


def test_only_the_window_is_searched() -> None:
    answer = "x" * WINDOW + " and the end of it"
    assert overlap(answer, "and the end of it, then more") == len("and the end of it")
    assert overlap(answer, answer + " more") == 0  # the whole long answer again: not found


words = st.lists(st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8), min_size=2)


@settings(max_examples=300, deadline=None)
@given(
    text=words.map(" ".join),
    split=st.integers(min_value=1),
    repeat=st.integers(min_value=0),
    cuts=cut_places(None, 8),
)
def test_any_split_and_any_repeat_join_into_the_text(
    text: str, split: int, repeat: int, cuts: list[int]
) -> None:
    """Any text cut anywhere, its continuation repeating any part of the answer's end long
    enough to count (or none), in any chunks: the answer and what is relayed are the text.
    (A text where a longer suffix of the answer also starts the continuation, by chance,
    is ambiguous: the longest is trimmed, as it must be, and such texts are left out.)"""
    at = 1 + split % (len(text) - 1)
    answer, rest = text[:at], text[at:]
    j = repeat % (at + 1)
    assume(j == 0 or j >= MIN_OVERLAP or j == at)
    continuation = answer[len(answer) - j :] + rest
    longest = max(k for k in range(at + 1) if answer.endswith(continuation[:k]))
    assume(longest == j or (longest < MIN_OVERLAP and longest != len(answer)))
    assert answer + fed(answer, continuation, cuts) == text


@settings(max_examples=300, deadline=None)
@given(answer=st.text(max_size=30), continuation=st.text(max_size=30), cuts=cut_places(None, 8))
def test_chunks_never_change_what_is_relayed(
    answer: str, continuation: str, cuts: list[int]
) -> None:
    """However the continuation arrives, the same text is relayed: all of it but its overlap."""
    got = fed(answer, continuation, cuts)
    assert got == continuation[overlap(answer, continuation) :] == fed(answer, continuation)


# -- in the caller's stream (app/upstream/splice.py) ------------------------------------------
def event(data: dict | str) -> sse.Event:
    payload = data if isinstance(data, str) else json.dumps(data)
    return sse.Event(b"data: " + payload.encode() + b"\n\n", payload)


def chunk(delta: dict, finish: str | None = None) -> sse.Event:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return event({"id": "c-2", "created": 9, "model": "m", "choices": [choice]})


def spliced(said: str, batch: list[sse.Event]) -> list[Any]:
    """The caller's events (each chunk's JSON, or ``[DONE]``) of a continuation ``batch``
    after the answer ``said`` (its id c-1), continued by an instruction."""
    t = Transcript()
    first = {"id": "c-1", "created": 7, "model": "m"}
    t.read([event({**first, "choices": [{"index": 0, "delta": {"content": said}}]})])
    out = Splice(t, Before(calls=1, outputs=1), trim=True).events(batch)
    return [e.data if e.data == sse.DONE else e.json() for e in out]


def test_the_repeat_is_not_relayed_and_what_is_held_goes_with_the_finish() -> None:
    pieces = [{"role": "assistant", "content": ""}, {"content": "quick"}, {"content": " bro"}]
    got = spliced("The quick brown", [*map(chunk, pieces), chunk({}, "stop"), event(sse.DONE)])
    # "quick bro" could still have become the whole repeat: held to the finish, and then,
    # a repeat of no whole end of the answer, let go of with it.
    assert [c["choices"][0] for c in got[:-1]] == [
        {"index": 0, "delta": {"content": "quick bro"}, "finish_reason": "stop"}
    ]
    assert got[-1] == sse.DONE
    got = spliced(
        "The quick brown", [chunk({"content": "quick brown"}), chunk({"content": " fox"})]
    )
    assert [c["choices"][0]["delta"] for c in got] == [{"content": " fox"}]


def test_what_is_held_at_the_end_goes_before_it_and_before_a_tool_call() -> None:
    got = spliced("The quick brown", [chunk({"content": "qu"}), event(sse.DONE)])
    assert got[0]["choices"][0]["delta"] == {"content": "qu"}
    assert (got[0]["id"], got[0]["created"], got[1]) == ("c-1", 7, sse.DONE)
    call = {"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": ""}}]}
    got = spliced("The quick brown", [chunk({"content": "qu"}), chunk(call)])
    assert got[0]["choices"][0]["delta"] == {**call, "content": "qu"}
