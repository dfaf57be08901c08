"""A call's usage (app/request/usage.py): where it is found in an answer or a stream, the
object kept as the provider sent it, and the counts each reader takes from it."""

from __future__ import annotations

import json

from app.request.usage import (
    Usage,
    may_carry_usage,
    usage_chunk,
    usage_in_body,
    usage_in_event,
)


def test_the_counts_of_both_apis() -> None:
    chat = {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    responses = {
        "input_tokens": 6,
        "output_tokens": 1,
        "input_tokens_details": {"cached_tokens": 0},
    }
    assert Usage(chat).tokens() == (5, 2, 4)
    assert Usage(responses).tokens() == (6, 1, 0)
    assert Usage({}).tokens() == (None, None, None)


def test_the_receipt_stays_as_sent_and_each_reader_counts_by_its_rule() -> None:
    sent = {
        "prompt_tokens": "12",  # not a count: the log shows it, the bill counts nothing
        "completion_tokens": True,
        "prompt_tokens_details": {"cached_tokens": -3},
        "total_tokens": 7.5,
        "input_tokens": 4,  # the other API's name: read only where the first is absent
        "output_tokens": 9,
        "extra": {"kept": [1, 2]},
    }
    usage = Usage(sent)
    assert usage.sent is sent  # the very object: logged byte for byte, never normalised
    assert usage.tokens() == ("12", True, -3)
    assert usage.billable() == (0, 0, 0)
    assert usage.total() == 4 + 9  # no integer total: the positive counts under both names
    assert Usage({"total_tokens": -5, "prompt_tokens": 3}).total() == 0
    assert Usage({"total_tokens": True, "prompt_tokens": 3}).total() == 3
    over = Usage({"input_tokens": 8, "input_tokens_details": {"cached_tokens": 20}})
    assert over.billable() == (8, 0, 8)  # cached tokens are a part of the prompt's
    assert Usage({"prompt_tokens_details": "4"}).cached is None


def test_an_empty_usage_is_no_usage_and_only_an_object_is_one() -> None:
    assert not Usage({}) and Usage({"total_tokens": 0})
    assert Usage.of({"total_tokens": 1}) == Usage({"total_tokens": 1})
    nothing: list[object] = [None, [], "usage", 3]
    for value in nothing:
        assert Usage.of(value) is None


def test_usage_is_read_from_the_end_of_a_large_answer() -> None:
    floats = b",".join(b"0.123456" for _ in range(200_000))
    body = (
        b'{"data":[{"embedding":[' + floats + b']}],"usage":{"prompt_tokens":7,"total_tokens":7}}'
    )
    assert usage_in_body(body) == Usage({"prompt_tokens": 7, "total_tokens": 7})
    assert usage_in_body(b'{"id": 1}') is None
    assert usage_in_body(b'{"usage": null}') is None
    assert usage_in_body(b'{"usage": {broken') is None


USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def _event(doc: object) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def test_a_stream_event_carries_its_usage_wherever_the_server_put_it() -> None:
    usage_chunk_event = _event({"id": "c", "choices": [], "usage": USAGE})
    last_choice = _event({"id": "c", "choices": [{"index": 0, "delta": {}}], "usage": USAGE})
    for raw in (usage_chunk_event, last_choice):
        assert may_carry_usage(raw) and usage_in_event(raw) == Usage(USAGE)
    plain = _event({"id": "c", "choices": [], "usage": None})
    assert not may_carry_usage(plain) and usage_in_event(plain) is None
    assert usage_in_event(b'data: ["usage",{}]\n\n') is None  # not an object
    assert usage_in_event(b'data: {"usage":{"a":\n\n') is None  # cut short


def test_the_usage_chunk_is_the_one_without_choices() -> None:
    assert usage_chunk(_event({"id": "c", "choices": [], "usage": USAGE})) == Usage(USAGE)
    assert usage_chunk(_event({"id": "c", "choices": [], "usage": {}})) == Usage({})
    assert usage_chunk(_event({"choices": [{"index": 0}], "usage": USAGE})) is None
    assert usage_chunk(_event({"choices": [], "usage": None})) is None
    assert usage_chunk(b'data: {"choices":[],"usage":{\n\n') is None
    assert usage_chunk(b": ping\n\n") is None


def test_a_chunk_with_a_null_usage_is_not_parsed(monkeypatch) -> None:
    """OpenAI's chunks before the usage chunk carry ``"usage":null`` once it is asked for:
    each is told apart by its bytes, not by parsing it (a JSON parse per event)."""
    parsed = []
    real = json.loads

    def loads(text):
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(json, "loads", loads)
    chunk = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'
    assert usage_chunk(chunk) is None and parsed == []
    said = b'data: {"id":"c","choices":[],"usage":{"total_tokens":3},"x":"\\"usage\\":null"}\n\n'
    assert usage_chunk(said) == Usage({"total_tokens": 3})  # the member, not a string's text
    assert len(parsed) == 1
