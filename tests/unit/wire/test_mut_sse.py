"""SSE decoder edges the mutation run found untested (llmgate_wire/sse.py).

Expected values come from the WHATWG event-stream rules (HTML Living Standard, 9.2.5/9.2.6):
the stream is UTF-8-decoded with replacement (invalid bytes become U+FFFD); lines end with
CRLF, LF or CR; a blank line dispatches; a line starting with ":" is a comment; `id` with a
NUL is ignored; `retry` counts only when it is all ASCII digits; unknown fields are ignored.
And from the decoder's own contract (its docstring): every byte is kept in some event's
``raw`` or in ``close()``; a line end at the end of a chunk is acted on at once; an event
larger than ``max_event_bytes`` raises ``EventTooLarge``, one of exactly that size does not.
"""

from __future__ import annotations

import pytest

from llmgate_wire import sse
from tests.support.sse_feed import decode


def _data(events: list[sse.Event]) -> list[str | None]:
    return [e.data for e in events]


def _check_bytes(chunks: list[bytes], events: list[sse.Event], rest: bytes) -> None:
    assert b"".join(e.raw for e in events) + rest == b"".join(chunks)


# --- line ends at the start of a chunk or of the buffer --------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_a_blank_line_as_the_first_bytes_of_a_stream_is_acted_on_at_once(eol: bytes) -> None:
    decoder = sse.Decoder()
    events = decoder.feed(eol)
    assert [e.raw for e in events] == [eol]  # an empty event: no data, nothing held back
    assert events[0].data is None
    assert _data(decoder.feed(b"data: x\n\n")) == ["x"]


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_a_chunk_that_starts_with_a_blank_line_dispatches_the_pending_event(eol: bytes) -> None:
    decoder = sse.Decoder()
    assert decoder.feed(b"data: a" + eol) == []
    assert _data(decoder.feed(eol + b"data: b" + eol + eol)) == ["a", "b"]


def test_a_cr_at_offset_zero_after_a_dispatch_is_a_line_end() -> None:
    # After the first event the buffer is compacted: the next chunk's CR sits at offset 0.
    chunks = [b"data: a\n\n", b"\rdata: b\r\r"]
    events, rest = decode(chunks)
    assert [e.data for e in events] == ["a", None, "b"]
    assert [e.raw for e in events] == [b"data: a\n\n", b"\r", b"data: b\r\r"]
    assert rest == b""


def test_a_cr_at_offset_zero_before_an_lf_terminated_line() -> None:
    chunks = [b"data: a\n\n", b"\rdata: b\n\n"]
    events, rest = decode(chunks)
    assert [e.data for e in events] == ["a", None, "b"]
    _check_bytes(chunks, events, rest)


def test_crlf_then_lf_fed_byte_by_byte_is_two_line_ends() -> None:
    raw = b"data: a\r\n\ndata: b\r\n\r\n"
    events, rest = decode([raw[i : i + 1] for i in range(len(raw))])
    assert _data(events) == ["a", "b"]
    _check_bytes([raw], events, rest)


def test_an_lf_after_a_completed_crlf_in_the_next_chunk_is_a_blank_line() -> None:
    events, _ = decode([b"data: a\r", b"\n", b"\n", b"data: b\n", b"\n"])
    assert _data(events) == ["a", "b"]


# --- decoding and fields -------------------------------------------------------------------


def test_invalid_utf8_becomes_the_replacement_character() -> None:
    events, _ = decode([b"data: a\xffb\xc3\n", b"event: \xe2\x82\n\n"])
    assert (events[0].data, events[0].event) == ("a\ufffdb\ufffd", "\ufffd")


def test_an_id_with_nul_is_ignored_but_nul_elsewhere_is_kept() -> None:
    events, _ = decode([b"id: 1\x002\ndata: a\x00b\nevent: e\x00\n\n", b"id: 7\ndata: c\n\n"])
    assert [(e.id, e.data, e.event) for e in events] == [
        (None, "a\x00b", "e\x00"),
        ("7", "c", None),
    ]


@pytest.mark.parametrize("value", [b"abc", b"1.5", b" 10", b"-1", b"1e3", b""])
def test_a_retry_that_is_not_all_ascii_digits_is_ignored(value: bytes) -> None:
    # One leading space after the colon is removed, so "retry:  10" keeps " 10": invalid.
    events, _ = decode([b"retry: " + value + b"\ndata: x\n\n"])
    assert [(e.data, e.retry) for e in events] == [("x", None)]


def test_unknown_fields_and_a_field_without_colon_are_ignored() -> None:
    events, _ = decode([b"foo: bar\nDATA: up\nid\ndata\ndata: z\n\n"])
    # "data" alone is the data field with an empty value; "id" alone sets an empty id.
    assert [(e.data, e.id, e.event) for e in events] == [("\nz", "", None)]


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b":ping", "ping"),
        (b": ping", "ping"),
        (b":  two", "two"),
        (b":\tping", "\tping"),  # only spaces follow the colon as a separator
        (b":XOX", "XOX"),
        (b":", ""),
    ],
)
def test_comment_text(line: bytes, text: str) -> None:
    events, _ = decode([line + b"\n\n"])
    assert [(e.comments, e.is_comment) for e in events] == [((text,), True)]


def test_json_of_an_event_without_data_says_so() -> None:
    with pytest.raises(ValueError, match=r"^event has no data$"):
        sse.Event(raw=b": ping\n\n", comments=("ping",)).json()


# --- the size limit ----------------------------------------------------------------------


def test_event_too_large_says_the_limit() -> None:
    with pytest.raises(sse.EventTooLarge) as caught:
        sse.Decoder(max_event_bytes=8).feed(b"data: 0123456789\n\n")
    assert (caught.value.limit, str(caught.value)) == (8, "an event is larger than 8 bytes")


def test_an_unfinished_event_of_exactly_the_limit_is_not_too_large() -> None:
    decoder = sse.Decoder(max_event_bytes=10)
    assert decoder.feed(b"data: abcd") == []  # 10 bytes, still arriving
    with pytest.raises(sse.EventTooLarge):
        decoder.feed(b"e")


def test_a_bom_counts_toward_the_first_event() -> None:
    with pytest.raises(sse.EventTooLarge):
        sse.Decoder(max_event_bytes=2).feed(b"\xef\xbb\xbf")


def test_close_resets_the_stream_but_keeps_the_limit() -> None:
    decoder = sse.Decoder(max_event_bytes=16)
    assert decoder.feed(b"data: a\n\ndata: b") != []
    assert decoder.close() == b"data: b"
    assert decoder.max_event_bytes == 16
    with pytest.raises(sse.EventTooLarge):
        decoder.feed(b"data: " + b"x" * 20)


# --- a chunk of whole events (the decoder's fast path) ------------------------------------
# Once the first chunk is read, a chunk that holds whole LF-ended events and nothing of the
# next, with nothing buffered before it, is decoded in one pass: it must mean what it means
# to the general path, limits and the CRLF split included.


def test_a_whole_event_chunk_after_a_lone_cr_starts_with_the_rest_of_that_crlf() -> None:
    decoder = sse.Decoder()
    assert _data(decoder.feed(b"data: a\r\r")) == ["a"]  # the last CR may pair with an LF
    later = decoder.feed(b"\ndata: b\n\n")
    assert [(e.data, e.raw) for e in later] == [("b", b"\ndata: b\n\n")]  # no empty event


def test_the_size_limit_holds_in_a_chunk_of_whole_events() -> None:
    first = b"data: 1\n\n"
    at = b"data: " + b"a" * 10 + b"\n\n"  # the limit: it passes
    over = b"data: " + b"b" * 11 + b"\n\n"
    decoder = sse.Decoder(max_event_bytes=len(at))
    assert _data(decoder.feed(first)) == ["1"]
    with pytest.raises(sse.EventTooLarge) as caught:
        decoder.feed(at + at + over + first)
    assert caught.value.limit == len(at)
    assert [e.raw for e in caught.value.events] == [at, at]  # the events before it


@pytest.mark.parametrize("tail", [b"d", b"data: 3", b":", b"XX", b"\xef\xbb"])
def test_whole_events_then_the_start_of_the_next_in_a_later_chunk(tail: bytes) -> None:
    # Any bytes may follow a chunk's last blank line (the next event's start): they wait for
    # the rest. Only a chunk that ends with a blank line is taken whole in one pass.
    decoder = sse.Decoder()
    assert _data(decoder.feed(b"data: 1\n\n")) == ["1"]
    assert _data(decoder.feed(b"data: XX\n\n" + tail)) == ["XX"]
    assert decoder.close() == tail


# The most usual chunk of all, one event of one `data:` line (a token), has a path of its own:
# the same event as the general path (the stream fed a byte at a time), its size limit too.


def test_a_one_line_data_chunk_of_exactly_the_limit_passes_one_byte_more_does_not() -> None:
    at = b"data: " + b"a" * 10 + b"\n\n"
    decoder = sse.Decoder(max_event_bytes=len(at))
    assert _data(decoder.feed(b"data: 1\n\n")) == ["1"]  # the first chunk: the BOM's check
    assert [(e.raw, e.data) for e in decoder.feed(at)] == [(at, "a" * 10)]
    with pytest.raises(sse.EventTooLarge) as caught:
        decoder.feed(b"data: " + b"b" * 11 + b"\n\n")
    error = caught.value
    assert (error.limit, error.events, str(error)) == (
        len(at),
        [],
        f"an event is larger than {len(at)} bytes",
    )


@pytest.mark.parametrize(
    "chunk",
    [
        b"DATA: b\n\n",  # field names are case-sensitive: an unknown field, no data
        b"data: b\n\n\n",  # a blank line more: an empty event after it
        b"data: b\n\n",
        b"data: \xff\n\n",
        b"data:b\n\n",
    ],
)
def test_a_one_line_chunk_means_what_it_means_to_the_general_path(chunk: bytes) -> None:
    first = b"data: 1\n\n"
    fast, rest = decode([first, chunk])
    general, general_rest = decode([bytes([b]) for b in first + chunk])
    assert fast == general and rest == general_rest == b""


# --- a resumable stream's ids (docs/streams.md) ------------------------------------------


@pytest.mark.parametrize("raw", [b"data: x\n\n", b"\ndata: x\n\n", b"\r\ndata: x\n\n"])
def test_with_id_puts_an_id_line_in_front_and_split_id_takes_it_off(raw: bytes) -> None:
    tagged = sse.with_id(raw, "S:3")
    assert tagged == b"id: S:3\ndata: x\n\n"  # a leading line end (half a CRLF) dropped
    (event,) = sse.Decoder().feed(tagged)
    assert (event.id, event.data) == ("S:3", "x")
    assert sse.split_id(tagged) == (b"id: S:3\n", b"data: x\n\n")


def test_with_id_keeps_every_other_leading_byte_and_split_id_leaves_an_event_without_one() -> None:
    for line in (b"XY: z\n", b" x\n", b"\t\x0bx\n"):  # fields no reader knows: kept as sent
        assert sse.with_id(line + b"data: x\n\n", "S:1") == b"id: S:1\n" + line + b"data: x\n\n"
    assert sse.with_id(b"data: x\r\n\r\n", "é") == "id: é\ndata: x\r\n\r\n".encode()
    for raw in (b"data: x\n\n", b"data: id: 1\n\n", b"", b"id"):
        assert sse.split_id(raw) == (b"", raw)
    assert sse.split_id(b"id: 1\nid: 2\n\n") == (b"id: 1\n", b"id: 2\n\n")
