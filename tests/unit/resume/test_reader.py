"""A resume reads a stream's log back (app/resume/reader.py): the events after the caller's
last, the rest as the log grows, the end; a log that stops growing ends in an error. The store
is the real in-process backend; only the clock and the sleeps are the test's."""

from __future__ import annotations

from collections.abc import Sequence

from app.request import routes
from app.resume import ids
from app.resume.reader import StoredStream
from app.resume.record import ENDED, OPEN, SEALED, LogFault, Meta, encode_chunk, end_record
from app.store.memory import MemoryBackend
from app.streams.answer import Finished
from llmgate_wire import sse
from tests.support.clock import Clock

KEY = ids.log_key("key:test", "A" * 24)


def event(n: int) -> bytes:
    return sse.encode_json({"n": n})


def reader(store: MemoryBackend, clock: Clock, after: int) -> StoredStream:
    store.set(KEY, Meta(routes.CHAT, False).encode(), 3600)  # the writer wrote it first
    return StoredStream(store, KEY, after=after, window_s=30, patience_s=60.0, clock=clock,
                        sleep=clock.sleep)  # fmt: skip


def numbers(items: Sequence[object]) -> list[int]:
    return [int(item.json()["n"]) for item in items if isinstance(item, sse.Event)]


def test_the_events_after_the_callers_last_then_the_live_rest_then_the_end() -> None:
    clock, store = Clock(), MemoryBackend(1 << 20)
    store.set(ids.chunk_key(KEY, 0), encode_chunk([event(1), event(2), event(3)], SEALED), 60)
    store.set(ids.chunk_key(KEY, 1), encode_chunk([event(4), event(5)], OPEN), 60)
    stream = reader(store, clock, after=2)
    # Every event from the first: the relay reads 1 and 2 for how the stream ended, and
    # sends the rest (tests/unit/streams' relay tests).
    got = [stream.next_item(1.0) for _ in range(5)]
    assert numbers(got) == [1, 2, 3, 4, 5] and stream.position == 5
    assert stream.next_item(1.0) is None  # nothing new within the timeout: the relay pings
    more = [event(4), event(5), event(6), event(7)]
    store.set(ids.chunk_key(KEY, 1), encode_chunk(more, ENDED, end_record(Finished(b""))), 60)
    assert numbers([stream.next_item(1.0)]) == [6]
    assert numbers(stream.ready_events()) == [7] and stream.position == 7
    assert stream.next_item(1.0) == Finished(b"")
    assert stream.replayed == 3  # 3, 4 and 5 were in the log when it began; 6 and 7 came live


def test_a_batch_is_every_event_read_back_and_not_yet_out() -> None:
    """What the relay reads (``next_batch``): the same events as one by one, in batches."""
    clock, store = Clock(), MemoryBackend(1 << 20)
    store.set(ids.chunk_key(KEY, 0), encode_chunk([event(1), event(2), event(3)], SEALED), 60)
    stream = reader(store, clock, after=0)
    got = stream.next_batch(1.0)
    assert isinstance(got, list) and numbers(got) == [1, 2, 3] and stream.position == 3
    assert stream.next_batch(1.0) is None  # nothing new within the timeout
    store.set(ids.chunk_key(KEY, 1), encode_chunk([event(4)], ENDED, end_record(Finished(b""))), 60)
    got = stream.next_batch(1.0)
    assert isinstance(got, list) and numbers(got) == [4] and stream.position == 4
    assert stream.next_batch(1.0) == Finished(b"")
    assert stream.replayed == 3  # 1, 2 and 3 were in the log when it began; 4 came live


def test_an_overflowed_log_ends_in_its_error() -> None:
    clock, store = Clock(), MemoryBackend(1 << 20)
    store.set(ids.chunk_key(KEY, 0), encode_chunk([event(1)], ENDED, end_record(None)), 60)
    stream = reader(store, clock, after=1)
    assert numbers([stream.next_item(1.0)]) == [1]
    end = stream.next_item(1.0)
    assert not isinstance(end, sse.Event) and getattr(end, "code", "") == "resume_log_overflow"


def test_a_log_that_stops_growing_ends_in_an_error_not_a_hang() -> None:
    clock = Clock()
    store = MemoryBackend(1 << 20, clock=clock)
    store.set(ids.chunk_key(KEY, 0), encode_chunk([event(1)], OPEN), 3600)
    stream = reader(store, clock, after=0)
    assert numbers([stream.next_item(1.0)]) == [1]
    item = None
    while item is None:
        item = stream.next_item(5.0)  # the relay's pings between waits
    assert isinstance(item, LogFault) and clock.now > 60.0


def test_a_stream_its_writer_stopped_ends_the_resume_within_a_second_or_two() -> None:
    clock = Clock()
    store = MemoryBackend(1 << 20, clock=clock)
    store.set(ids.chunk_key(KEY, 0), encode_chunk([event(1)], OPEN), 3600)
    stream = reader(store, clock, after=1)
    assert numbers([stream.next_item(5.0)]) == [1]
    assert stream.next_item(5.0) is None  # the stream runs on, nothing new yet
    store.delete(KEY)  # the writer stopped the stream: the log is deleted
    item = None
    while item is None:
        item = stream.next_item(1.0)
    assert isinstance(item, LogFault) and clock.now < 10.0


def test_a_damaged_chunk_ends_the_resume_with_an_error() -> None:
    clock, store = Clock(), MemoryBackend(1 << 20)
    store.set(ids.chunk_key(KEY, 0), b"o99\nshort", 60)
    assert isinstance(reader(store, clock, after=0).next_item(1.0), LogFault)


def test_a_reader_tells_the_writer_it_is_there() -> None:
    clock = Clock()
    store = MemoryBackend(1 << 20, clock=clock)
    store.set(ids.chunk_key(KEY, 0), encode_chunk([event(1)], OPEN), 3600)
    stream = reader(store, clock, after=0)
    stream.next_item(1.0)
    assert store.get(ids.resumed_key(KEY)) == b"1"


def relayed(store: MemoryBackend, after: int) -> list[bytes]:
    from app.request.events import DONE
    from app.streams.relay import relay

    body = relay(reader(store, Clock(), after), heartbeat=5.0, end=DONE, stream_id="S", after=after)
    return [chunk for batch in body for chunk in batch]


def test_the_relay_sends_only_what_the_caller_has_not_and_knows_how_it_ended() -> None:
    store = MemoryBackend(1 << 20)
    done = [event(1), event(2), sse.DONE_EVENT]
    store.set(ids.chunk_key(KEY, 0), encode_chunk(done, ENDED, end_record(Finished(b""))), 60)
    assert relayed(store, 1) == [sse.with_id(event(2), "S:2"), sse.with_id(sse.DONE_EVENT, "S:3")]
    # After the last event: nothing more, and no error for a [DONE] it did not send again.
    assert relayed(store, 3) == []
    cut = [event(1), event(2)]  # a log that ended without [DONE]: the error event, again
    store.set(ids.chunk_key(KEY, 0), encode_chunk(cut, ENDED, end_record(Finished(b""))), 60)
    (error,) = relayed(store, 2)
    assert b'"code": "upstream_reset"' in error or b"upstream_reset" in error
