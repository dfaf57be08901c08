"""The SSE decoder never raises on any input, keeps every byte, and stays linear.

Property tests feed random bytes (and random streams built from SSE's own pieces) in random
chunkings: the events must be the same as when the input is fed whole, and the bytes of the
events plus the leftover must be the input.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgate_wire import sse
from tests.support.sse_feed import cut_at, decode
from tests.support.strategies import cut_places

# Line contents that exercise every branch of the grammar (fields, comments, BOM, invalid
# UTF-8, NUL, non-ASCII digits), joined by line ends in all three forms or none.
_CONTENT = st.sampled_from(
    [
        b"", b"data", b"data:", b"data: x", b"data:  two spaces", b": ping", b":", b":ping",
        b"event: e", b"event", b"id: 1", b"id: a\x00b", b"id", b"retry: 10", b"retry: 0",
        "retry: \u00b2".encode(), "retry: \u0663".encode(), b"retry: 1x", b"retry:", b"retry",
        b"unknown: y", b"\xef\xbb\xbf", b"\xff\xfe", b" data: x", b"data: [DONE]",
        b"x" * 40, b"\x00", "data: \u00e9".encode(),
    ]
)  # fmt: skip
_EOLS = st.sampled_from([b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n", b""])
_STREAMS = st.lists(st.tuples(_CONTENT, _EOLS).map(b"".join), max_size=40).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(
    raw=st.one_of(st.binary(max_size=300), _STREAMS),
    cuts=cut_places(400, 30),
)
def test_any_bytes_in_any_chunking_decode_the_same_and_keep_every_byte(
    raw: bytes, cuts: list[int]
) -> None:
    whole, whole_rest = decode([raw])
    chunked, rest = decode(cut_at(raw, cuts))
    # A CRLF split by a chunk edge travels as CR + LF in two events' raw bytes: the bytes
    # and the meaning are the same, the split between events may differ.
    assert [_semantics(e) for e in chunked] == [_semantics(e) for e in whole]
    assert b"".join(e.raw for e in chunked) + rest == raw
    assert b"".join(e.raw for e in whole) + whole_rest == raw


# LF-only streams: after the first chunk, a chunk of whole events takes the decoder's fast path.
_LF_STREAMS = st.lists(
    st.tuples(_CONTENT, st.sampled_from([b"\n", b"\n\n"])).map(b"".join), max_size=40
).map(b"".join)


@settings(max_examples=200, deadline=None)
@given(raw=_LF_STREAMS, every=st.integers(min_value=1, max_value=3))
def test_chunks_of_whole_events_decode_as_the_stream_fed_whole(raw: bytes, every: int) -> None:
    blank_line_ends = [i + 2 for i in range(len(raw) - 1) if raw[i : i + 2] == b"\n\n"]
    chunked, rest = decode(cut_at(raw, blank_line_ends[every - 1 :: every]))
    whole, whole_rest = decode([raw])
    assert (chunked, rest) == (whole, whole_rest)  # every field and every event's raw bytes


_DATA_LINES = st.sampled_from(
    [b"data: x", b"data:x", b"data:  two spaces", b"data: a: b", b"data: \xff\xfe", b"data: \xc3",
     "data: \u00e9".encode(), b"data: ", b"data: [DONE]", b"data: \x00", b"data: x\n: ping"]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.one_of(_DATA_LINES, _CONTENT), max_size=20))
def test_an_event_a_chunk_decodes_as_the_stream_fed_a_byte_at_a_time(lines: list[bytes]) -> None:
    """Each event its own chunk (a token a read, the usual stream): the decoder's quickest
    paths give every field and every raw byte the general path gives."""
    raw = b"".join(line + b"\n\n" for line in lines)
    blank_line_ends = [i + 2 for i in range(len(raw) - 1) if raw[i : i + 2] == b"\n\n"]
    assert decode(cut_at(raw, blank_line_ends)) == decode(cut_at(raw, range(len(raw))))


def _semantics(event: sse.Event) -> tuple:
    return (event.data, event.event, event.id, event.retry, event.comments)


@settings(max_examples=200, deadline=None)
@given(
    raw=_STREAMS,
    cuts=cut_places(400, 30),
    limit=st.integers(min_value=1, max_value=200),
)
def test_with_a_size_limit_only_event_too_large_is_raised(
    raw: bytes, cuts: list[int], limit: int
) -> None:
    try:
        events, _ = decode(cut_at(raw, cuts), limit)
    except sse.EventTooLarge as exc:
        assert exc.limit == limit
        assert all(len(e.raw) <= limit for e in exc.events)
    else:
        assert all(len(e.raw) <= limit for e in events)


def test_retry_takes_only_ascii_digits() -> None:
    decoder = sse.Decoder()
    events = decoder.feed(
        "retry: ²\ndata: a\n\nretry: ٣\ndata: b\n\nretry: 25\ndata: c\n\n".encode()
    )
    assert [(e.data, e.retry) for e in events] == [("a", None), ("b", None), ("c", 25)]


def test_retry_too_long_for_int_is_ignored_not_raised() -> None:
    events = sse.Decoder().feed(b"retry: " + b"9" * 10_000 + b"\ndata: x\n\n")
    assert [(e.data, e.retry) for e in events] == [("x", None)]


def test_event_too_large_keeps_the_events_before_it() -> None:
    decoder = sse.Decoder(max_event_bytes=64)
    with pytest.raises(sse.EventTooLarge) as caught:
        decoder.feed(b"data: one\n\ndata: two\n\ndata: " + b"x" * 100)
    assert [e.data for e in caught.value.events] == ["one", "two"]


def test_event_too_large_while_still_arriving() -> None:
    decoder = sse.Decoder(max_event_bytes=1000)
    for _ in range(15):
        decoder.feed(b"data: " + b"y" * 60)  # lines of one unfinished event, no line end
    with pytest.raises(sse.EventTooLarge):
        decoder.feed(b"y" * 200)


def test_an_event_of_exactly_the_limit_passes() -> None:
    raw = b"data: " + b"z" * 10 + b"\n\n"
    assert [e.raw for e in sse.Decoder(max_event_bytes=len(raw)).feed(raw)] == [raw]
    with pytest.raises(sse.EventTooLarge):
        sse.Decoder(max_event_bytes=len(raw) - 1).feed(raw)


class _CountingBuffer(bytearray):
    """The decoder's buffer, counting the bytes its line-end searches may look at."""

    searched = 0

    def find(self, sub, start=0, *rest):
        _CountingBuffer.searched += len(self) - start
        return super().find(sub, start, *rest)


def test_a_long_line_in_small_reads_is_searched_once() -> None:
    """Linear: a 1 MiB line arriving in 4 KiB reads is searched about once per byte for each
    of CR and LF (rescanning the line from its start on every read would be ~128 times more)."""
    decoder = sse.Decoder()
    decoder._buf = _CountingBuffer()
    _CountingBuffer.searched = 0
    line = b"data: " + b"x" * (1 << 20) + b"\n\n"
    events = []
    for i in range(0, len(line), 4096):
        events += decoder.feed(line[i : i + 4096])
    assert [len(e.raw) for e in events] == [len(line)]
    assert _CountingBuffer.searched <= 3 * len(line)


def test_a_whole_crlf_at_a_chunk_end_does_not_swallow_the_next_lf() -> None:
    """Found by the property test: after a complete CRLF ends a chunk, an LF that starts the
    next chunk is a blank line of its own (it dispatches), not the rest of a CRLF."""
    decoder = sse.Decoder()
    assert [e.data for e in decoder.feed(b"data: a\r\n")] == []
    assert [e.data for e in decoder.feed(b"\n")] == ["a"]
