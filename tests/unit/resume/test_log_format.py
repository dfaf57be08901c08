"""A resumable stream's log format, ids and budget (app/resume/record.py, ids.py, budget.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.errors import GatewayError, UpstreamReset
from app.request import routes
from app.resume import ids
from app.resume.budget import ResumeBudget
from app.resume.record import (
    ENDED,
    OPEN,
    SEALED,
    LogFault,
    Meta,
    Overflow,
    decode_chunk,
    encode_chunk,
    end_record,
)
from app.streams.answer import Finished

events = st.lists(st.binary(max_size=300), max_size=20)


@given(events, st.sampled_from([OPEN, SEALED]))
def test_a_chunk_of_any_events_reads_back_as_written(raws: list[bytes], state: bytes) -> None:
    chunk = decode_chunk(encode_chunk(raws, state))
    assert chunk is not None
    assert (chunk.state, chunk.events, chunk.end) == (state, raws, None)


@given(events, st.binary(max_size=40))
def test_an_ended_chunk_keeps_its_end(raws: list[bytes], junk: bytes) -> None:
    error = UpstreamReset("The upstream reset the connection.")
    for end in (Finished(b""), Finished(b": tail"), error, None):
        chunk = decode_chunk(encode_chunk(raws, ENDED, end_record(end)))
        assert chunk is not None and chunk.events == raws
        if isinstance(end, Finished):
            assert chunk.end == end
        elif end is None:
            assert isinstance(chunk.end, Overflow)
        else:
            assert isinstance(chunk.end, GatewayError)
            assert (chunk.end.status, chunk.end.to_body()) == (end.status, end.to_body())
    # Anything else is not a chunk: a reader ends the resume with an error, never guesses.
    whole = encode_chunk(raws, ENDED, end_record(Finished(b"")))
    assert decode_chunk(whole + junk) is None or junk == b""


@pytest.mark.parametrize(
    "data",
    [b"", b"x", b"o5\nabc", b"o3\nabcd", b"ox\nabc", b"e", b"o!2\n{}", b"s3\nabc!9\n{}"],
)
def test_bytes_that_are_not_a_chunk_are_refused(data: bytes) -> None:
    assert decode_chunk(data) is None


def test_meta_reads_back_and_refuses_anything_else() -> None:
    meta = Meta(routes.MESSAGES, True, "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert Meta.decode(meta.encode()) == meta
    for bad in (b"", b"[]", b'{"route": 1, "hide_usage": true}', b'{"route": "chat"}'):
        assert Meta.decode(bad) is None


def test_stream_ids_are_unguessable_and_event_ids_parse_back() -> None:
    made = {ids.new_stream_id() for _ in range(1000)}
    assert len(made) == 1000 and all(ids.is_stream_id(s) for s in made)
    sid = made.pop()
    assert ids.parse_event_id(ids.event_id(sid, 42)) == (sid, 42)
    assert ids.parse_event_id(f" {sid}:0 ") == (sid, 0)
    for bad in ("", sid, f"{sid}:", f"{sid}:-1", f"{sid}:1e3", "short:3", f"{sid}:1234567890"):
        assert ids.parse_event_id(bad) is None
    assert ids.parse_after(None) == 0 and ids.parse_after("7") == 7
    assert ids.parse_after("x") is None and ids.parse_after("-1") is None


def test_a_log_key_depends_on_the_owner() -> None:
    sid = ids.new_stream_id()
    assert ids.log_key("key:a", sid) != ids.log_key("key:b", sid)
    assert ids.log_key("key:a", sid) == ids.log_key("key:a", sid)
    assert sid not in ids.log_key("key:a", sid)  # the id alone finds nothing


def test_the_budget_holds_a_reservation_until_its_log_expires() -> None:
    now = [0.0]
    budget = ResumeBudget(10, lambda: now[0])
    first = budget.reserve(6)
    assert first is not None and budget.reserve(6) is None
    second = budget.reserve(4)
    assert second is not None and budget.reserve(1) is None
    first.expire_at(30.0)
    now[0] = 29.9
    assert budget.reserve(6) is None  # the log is still in Memcached
    now[0] = 30.0
    assert budget.reserve(6) is not None
    first.expire_at(99.0)  # said once: a second end changes nothing
    assert len(budget.expiring) == 0


def test_an_id_line_goes_in_front_and_comes_off_again() -> None:
    from llmgate_wire import sse

    raw = b'data: {"a":1}\n\n'
    tagged = sse.with_id(raw, "S:3")
    assert tagged == b'id: S:3\ndata: {"a":1}\n\n'
    assert sse.split_id(tagged) == (b"id: S:3\n", raw)
    assert sse.split_id(raw) == (b"", raw)
    assert sse.with_id(b"\ndata: x\n\n", "S:4") == b"id: S:4\ndata: x\n\n"
    event = sse.Decoder.event_of(tagged)
    assert event is not None and event.id == "S:3" and event.data == '{"a":1}'


def test_a_lost_log_is_a_gateway_error() -> None:
    assert LogFault("x").status == 502 and LogFault("x").code == "resume_log_lost"
