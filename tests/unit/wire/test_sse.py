"""The SSE codec against a folder of raw streams, fed whole, byte by byte, and in pairs."""

from __future__ import annotations

import json
import re

import pytest

from llmgate_wire import sse
from tests.conftest import ROOT
from tests.support.sse_feed import decode, steps

STREAMS = ROOT / "tests" / "data" / "sse"
CASES = sorted(p.stem for p in STREAMS.glob("*.sse"))


def _fields(event: sse.Event) -> dict:
    out: dict = {}
    for name in ("data", "event", "id", "retry"):
        if getattr(event, name) is not None:
            out[name] = getattr(event, name)
    if event.comments:
        out["comments"] = list(event.comments)
    return out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("step", [10**6, 1, 2, 3, 7])
def test_stream_folder(case: str, step: int) -> None:
    raw = (STREAMS / f"{case}.sse").read_bytes()
    expected = json.loads((STREAMS / f"{case}.json").read_text())
    events, leftover = decode(steps(raw, step))
    assert [_fields(e) for e in events] == expected["events"]
    # Byte-faithful whatever the chunking: the relay forwards exactly what it received.
    assert b"".join(e.raw for e in events) + leftover == raw
    if step == 10**6:
        assert leftover == expected["leftover"].encode()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("per_chunk", [1, 2])
def test_stream_folder_in_whole_event_chunks(case: str, per_chunk: int) -> None:
    """Cut after the first event, then after every (second) blank line: how upstreams
    usually write, one read holding whole events and nothing of the next. After the first
    chunk, each LF-only chunk takes the decoder's fast path: the events, their bytes and the
    leftover must be what the general path makes of the stream fed whole."""
    raw = (STREAMS / f"{case}.sse").read_bytes()
    expected = json.loads((STREAMS / f"{case}.json").read_text())
    ends = [m.end() for m in re.finditer(b"\n\n", raw)]
    cuts = ends[:1] + ends[per_chunk::per_chunk]
    decoder = sse.Decoder()
    events: list[sse.Event] = []
    for start, end in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        events += decoder.feed(raw[start:end])
    leftover = decoder.close()
    assert [_fields(e) for e in events] == expected["events"]
    assert [e.raw for e in events] == [e.raw for e in decode(steps(raw, 10**6))[0]]
    assert b"".join(e.raw for e in events) + leftover == raw
    assert leftover == expected["leftover"].encode()


def test_trailing_data_after_complete_events_stays_buffered() -> None:
    decoder = sse.Decoder()
    events = decoder.feed(b"data: one\n\ndata: tw")
    assert [e.data for e in events] == ["one"]
    assert [e.data for e in decoder.feed(b"o\n\n")] == ["two"]


def test_cr_at_chunk_end_dispatches_at_once_and_pairs_with_next_lf() -> None:
    decoder = sse.Decoder()
    # The blank line's CR arrives alone: the event must not wait for the next chunk.
    assert [e.data for e in decoder.feed(b"data: a\r\n\r")] == ["a"]
    later = decoder.feed(b"\ndata: b\r\n\r\n")
    assert [e.data for e in later] == ["b"]  # the LF completed the CRLF, no empty event
    assert later[0].raw.startswith(b"\n")


def test_event_helpers() -> None:
    ping, done, err = decode(steps(b': ping\n\ndata: [DONE]\n\ndata: {"error": {}}\n\n', 5))[0]
    assert ping.is_comment and not ping.is_done
    assert done.is_done and not done.is_comment
    assert err.json() == {"error": {}}
    with pytest.raises(ValueError):
        ping.json()


def test_encoder_round_trips_through_decoder() -> None:
    encoded = sse.encode("line1\nline2", event="message", id="9") + sse.comment() + sse.DONE_EVENT
    events, leftover = decode(steps(encoded, 1))
    assert leftover == b""
    assert [_fields(e) for e in events] == [
        {"data": "line1\nline2", "event": "message", "id": "9"},
        {"comments": ["ping"]},
        {"data": "[DONE]"},
    ]
    assert sse.encode_json({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()


def test_event_of_takes_exactly_one_whole_event() -> None:
    one = b'event: x\ndata: {"a":1}\n\n'
    event = sse.Decoder.event_of(one)
    assert event is not None and (event.raw, event.event, event.data) == (one, "x", '{"a":1}')
    assert sse.Decoder.event_of(b": ping\n\n") is not None
    for other in (one + one, b"data: 1\n", b"", b"\ndata: 1\n\n", b"data: 1\n\ndata: 2"):
        assert sse.Decoder.event_of(other) is None, other
