"""Flight, Listener and relay in one process: producers here are plain functions that publish,
so the ordering, the error paths and the memory bound are checked without sockets."""

from __future__ import annotations

import json
import time
import types

import gevent
import gevent.event
import pytest

from app.cache.coalesce import Flights
from app.cache.store import entry_from_flight
from app.core.config import Settings
from app.core.errors import ClientTooSlow, GatewayError, UpstreamProtocolError, UpstreamReset
from app.request import events as streams
from app.request import routes
from app.request.call import Trace
from app.streams.flight import CACHE, LEASE, ClientGone, Finished, Flight, Head
from app.streams.flight_life import CANCELLED, COMPLETE, FAILED, STREAMING, WAITING
from app.streams.relay import relay
from app.streams.reply import Replies
from llmgate_wire import sse
from tests.support.flights import script

HEAD = Head(200, [("Content-Type", "text/event-stream")], 1, None)


def _events(*datas: str) -> list[sse.Event]:
    raw = b"".join(sse.encode(d) for d in datas)
    return sse.Decoder().feed(raw)


def _drain(listener) -> list:
    out = []
    while True:
        item = listener.next_item(timeout=5)
        out.append(item)
        if not isinstance(item, sse.Event):
            return out


def test_a_listener_reads_head_events_and_end_in_order() -> None:
    a, b, done = _events("a", "b", "[DONE]")
    listener = Flight(script(HEAD, a, "sleep", b, done, Finished(b""))).join()
    assert listener.wait_head(5) == HEAD
    items = _drain(listener)
    assert items[:3] == [a, b, done] and isinstance(items[3], Finished)


def test_a_batch_is_every_event_in_and_unread_then_the_end() -> None:
    """What the relay reads: the events published while the listener was away come in one
    batch, in order, each once; then the end; None while nothing came."""
    a, b, c, done = _events("a", "b", "c", "[DONE]")
    gate = gevent.event.Event()
    flight = Flight(script(HEAD, a, b, gate, c, done, Finished(b"")))
    listener = flight.join()
    assert listener.wait_head(5) == HEAD
    gevent.sleep(0.01)  # a and b are in before the first read
    assert listener.next_batch(5) == [a, b] and listener.position == 2
    assert listener.next_batch(0.01) is None  # the producer waits on the gate
    gate.set()  # the producer publishes c and done before the listener runs again
    assert listener.next_batch(5) == [c, done] and listener.position == 4
    assert isinstance(listener.next_batch(5), Finished)


@pytest.mark.parametrize("error", [ValueError("boom"), KeyError("k"), ZeroDivisionError()])
def test_an_unexpected_exception_before_the_head_is_a_502_protocol_error(error) -> None:
    listener = Flight(script("sleep", error)).join()
    with pytest.raises(UpstreamProtocolError) as caught:
        listener.wait_head(5)
    assert caught.value.status == 502 and caught.value.code == "upstream_protocol_error"


def test_an_unexpected_exception_mid_stream_ends_with_an_error_event() -> None:
    a, b = _events("a", "b")
    listener = Flight(script(HEAD, a, b, "sleep", ValueError("x"))).join()
    told: list[str] = []
    batches = relay(listener, heartbeat=5, end=streams.DONE, on_error=told.append)
    out = [chunk for batch in batches for chunk in batch]
    assert out[:2] == [a.raw, b.raw]
    last = sse.Decoder().feed(out[2])[0].json()
    assert last["error"]["code"] == "upstream_protocol_error"
    assert len(out) == 3
    assert told == ["upstream_protocol_error"]  # for the trace (edge/finish.py)


def test_events_in_when_the_caller_reads_go_out_as_one_batch() -> None:
    """One write for what arrived together (or piled up), one per event when they trickle."""
    a, b, c, d, done = _events("a", "b", "c", "d", "[DONE]")
    listener = Flight(script(HEAD, a, b, c, "sleep", d, "sleep", done, Finished(b""))).join()
    told: list[str] = []
    batches = list(relay(listener, heartbeat=5, end=streams.DONE, on_error=told.append))
    assert batches == [[a.raw, b.raw, c.raw], [d.raw], [done.raw]]
    assert told == []  # a whole stream
    assert listener.bytes_read == sum(len(e.raw) for e in (a, b, c, d, done))


def test_a_stream_ending_without_done_gets_an_error_event() -> None:
    (a,) = _events("a")
    listener = Flight(script(HEAD, a, Finished(b""))).join()
    told: list[str] = []
    batches = relay(listener, heartbeat=5, end=streams.DONE, on_error=told.append)
    out = [chunk for batch in batches for chunk in batch]
    assert out[0] == a.raw
    assert sse.Decoder().feed(out[1])[0].json()["error"]["code"] == UpstreamReset.code
    assert told == [UpstreamReset.code]


@pytest.mark.parametrize(
    ("kind", "told"), [("response.failed", ["upstream_error"]), ("response.completed", [])]
)
def test_a_responses_stream_that_ends_failed_is_reported_broken(kind: str, told: list[str]) -> None:
    raw = sse.encode('{"type": "response.created"}', event="response.created")
    raw += sse.encode(json.dumps({"type": kind}), event=kind)
    events = sse.Decoder().feed(raw)
    listener = Flight(script(HEAD, *events, Finished(b""))).join()
    heard: list[str] = []
    out = list(relay(listener, heartbeat=5, end=streams.TERMINAL, on_error=heard.append))
    assert out == [[e.raw for e in events]] and heard == told  # relayed as is, either way


@pytest.mark.parametrize(
    ("steps", "heard"),
    [
        (("a", "[DONE]", Finished(b"")), [False]),  # whole
        (("a", "[DONE]", Finished(b"", usage_estimated=True)), [True]),  # whole, estimated
        (("a", Finished(b"")), []),  # cut before [DONE]
        (("a", '{"error": {"message": "x"}}', Finished(b"")), []),  # the upstream's error
        (("a", UpstreamReset("cut")), []),  # broken
    ],
)
def test_only_a_stream_that_reached_its_end_is_told_complete(steps, heard) -> None:
    """``on_complete`` (what a settlement bills on, app/edge/finish.py) hears a stream that
    reached its route's end without an error, with whether its usage is an estimate; never a
    cut, broken or failed one."""
    items = [_events(s)[0] if isinstance(s, str) else s for s in steps]
    listener = Flight(script(HEAD, *items)).join()
    told: list[bool] = []
    list(relay(listener, heartbeat=5, end=streams.DONE, on_complete=told.append))
    assert told == heard


def test_a_resumable_stream_whose_log_was_withdrawn_says_so_once() -> None:
    """The comment after the batch in which the log was given up, once; events go on."""
    a, b, c, done = _events("a", "b", "c", "[DONE]")
    gate = gevent.event.Event()
    listener = Flight(script(HEAD, a, gate, b, "sleep", c, done, Finished(b""))).join()
    why: list[str] = []
    batches = relay(
        listener,
        heartbeat=5,
        end=streams.DONE,
        stream_id="S",
        withdrawn=lambda: why[0] if why else None,
    )
    assert next(batches) == [sse.with_id(a.raw, "S:1")]
    why.append("withdrawn")
    gate.set()
    rest = [chunk for batch in batches for chunk in batch]
    notes = [chunk for chunk in rest if chunk.startswith(b":")]
    assert notes == [b": llmgate: resumable=no; reason=withdrawn\n\n"]
    assert rest[1:] == [sse.with_id(e.raw, f"S:{n}") for n, e in ((2, b), (3, c), (4, done))]


class Counted:
    """A callable that counts its calls (the relay's end work, a watcher's stop)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1

    def stop(self) -> None:
        self.calls += 1


@pytest.mark.parametrize("how", ["to its end", "ended by an error", "closed midway"])
def test_the_relays_end_work_runs_once_however_its_body_ends(how: str) -> None:
    a, b, done = _events("a", "b", "[DONE]")
    failure: object = ValueError("x") if how == "ended by an error" else done
    listener = Flight(script(HEAD, a, "sleep", b, failure, Finished(b""))).join()
    ended = Counted()
    batches = relay(listener, heartbeat=5, end=streams.DONE, on_end=ended)
    assert next(batches) == [a.raw] and ended.calls == 0  # still being sent
    if how == "closed midway":
        assert isinstance(batches, types.GeneratorType)
        batches.close()  # the server closes the body: the caller left
    else:
        assert sum(map(len, batches)) == 2  # b, then [DONE] or the error event
    assert ended.calls == 1


def test_a_streams_body_stops_its_watcher_and_leaves_its_listener_at_its_end() -> None:
    a, done = _events("a", "[DONE]")
    listener = Flight(script(HEAD, a, done, Finished(b""))).join()
    assert listener.wait_head(5) == HEAD
    watcher = Counted()
    replies = Replies(Settings(), lambda name: {})
    body = replies._stream(routes.CHAT, Trace(), listener, watcher)  # type: ignore[arg-type]
    assert [chunk for batch in body for chunk in batch] == [a.raw, done.raw]
    assert watcher.calls == 1 and listener.left


def test_a_late_joiner_reads_every_event_from_the_first() -> None:
    events = _events(*"abcdef", "[DONE]")
    flight = Flight(script(HEAD, *events[:3], "sleep", "sleep", *events[3:], Finished(b"")))
    first = flight.join()
    first.wait_first_event(5)
    late = flight.join()
    assert 0 < flight.event_count < len(events)  # it joins mid-stream
    assert _drain(late)[:-1] == events
    assert _drain(first)[:-1] == events


def test_without_a_kept_log_only_unread_events_stay_in_memory() -> None:
    """A single caller's stream: memory is what the caller has yet to read, not the log."""
    many = _events(*(str(i) for i in range(5000)))
    flight = Flight(script(HEAD, *[x for e in many for x in (e, "sleep")]), keep_log=False)
    listener = flight.join()
    most = 0
    for expected in many:
        assert listener.next_item(5) == expected
        most = max(most, len(flight.log.held))
    assert most <= 64
    assert not flight.log_whole
    with pytest.raises(RuntimeError):
        _ = flight.events


def test_past_the_log_limit_the_flight_stops_logging_takes_no_followers_and_is_not_stored() -> None:
    events = _events(*("x" * 100 for _ in range(50)), "[DONE]")
    flights = Flights()
    flight = Flight(
        script(HEAD, *[x for e in events for x in (e, "sleep")], Finished(b"")), log_limit=1000
    )
    flights.put("k", flight)
    reader = flight.join()
    assert flights.get("k") is flight  # small so far: followers welcome
    got: list[sse.Event | Finished | GatewayError | None] = []
    while len(got) < 20:
        got.append(reader.next_item(5))
    assert not flight.log_whole and not flight.keep_log
    assert flights.get("k") is None  # too large to replay to a late joiner
    rest = _drain(reader)
    assert got + rest[:-1] == events  # the caller already reading still gets every event
    assert len(flight.log.held) <= 64
    assert entry_from_flight(flight, now=0.0) is None


def test_a_listener_waiting_for_the_whole_answer_does_not_hold_the_log_back() -> None:
    many = _events(*(str(i) for i in range(500)))
    flight = Flight(
        script(HEAD, *[x for e in many for x in (e, "sleep")], Finished(b"")), keep_log=False
    )
    reader, waiter = flight.join(), flight.join()
    waiting = gevent.spawn(waiter.wait_complete, 5)
    assert len(_drain(reader)) == 501
    waiting.get(timeout=5)
    assert len(flight.log.held) <= 64


def test_the_last_listener_leaving_cancels_the_flight() -> None:
    (a,) = _events("a")
    flight = Flight(script(HEAD, a, *["sleep"] * 10_000))
    listener = flight.join()
    assert listener.next_item(5) == a
    listener.leave()
    assert flight.cancelled
    late = flight.join()
    assert late.next_item(5) == a  # what was published stays readable
    with pytest.raises(ClientGone):
        late.next_item(5)  # but nothing more comes


def test_flights_skip_cancelled_and_failed_ones() -> None:
    flights = Flights()
    failed = Flight(script(ValueError("x")))
    flights.put("f", failed)
    with pytest.raises(UpstreamProtocolError):
        failed.join().wait_head(5)
    assert failed.failure is not None and flights.get("f") is None
    ok = Flight(script(HEAD, *["sleep"] * 100))
    flights.put("k", ok)
    assert flights.get("k") is ok
    flights.remove("k", failed)  # only the registered flight is removed
    assert flights.get("k") is ok
    flights.remove("k", ok)
    assert flights.get("k") is None


def _big_events(count: int, size: int) -> list[sse.Event]:
    return _events(*("x" * size for _ in range(count)))


def test_a_slow_reader_holds_the_producer_back_at_the_buffer_limit() -> None:
    """Back-pressure: the producer (which reads the upstream) waits while the reader is more
    than buffer_limit bytes behind, so memory per stream is the buffer, not the stream."""
    events = _big_events(200, 10_000)
    flight = Flight(
        script(HEAD, *events, Finished(b"")), keep_log=False, buffer_limit=64_000, send_timeout=5
    )
    reader = flight.join()
    most_behind = 0
    for expected in events:
        gevent.sleep(0)  # the producer runs as far as it may
        most_behind = max(most_behind, flight.bytes_published - reader.bytes_read)
        assert reader.next_item(5) == expected
    assert isinstance(reader.next_item(5), Finished)
    assert 64_000 <= most_behind <= 64_000 + len(events[0].raw)


def test_without_the_limit_the_producer_runs_ahead() -> None:
    """The control for the test above: the same flight without a buffer limit."""
    events = _big_events(200, 10_000)
    flight = Flight(script(HEAD, *events, Finished(b"")), keep_log=False)
    reader = flight.join()
    gevent.sleep(0)
    assert flight.bytes_published - reader.bytes_read > 1_000_000


def test_a_reader_that_takes_nothing_for_the_send_timeout_is_dropped() -> None:
    events = _big_events(50, 10_000)
    flight = Flight(
        script(HEAD, *events, Finished(b"")), keep_log=False, buffer_limit=20_000, send_timeout=0.05
    )
    reader = flight.join()
    assert reader.wait_head(5) == HEAD
    gevent.sleep(0.2)  # the caller stalls
    assert reader.left  # dropped
    assert isinstance(flight.failure, ClientTooSlow)  # nobody left: the upstream is closed
    assert flight.event_count < 10
    with pytest.raises(ClientGone):
        while True:
            reader.next_item(5)


def test_a_stalled_follower_is_dropped_without_stopping_the_others() -> None:
    events = _big_events(50, 10_000)
    flight = Flight(
        script(HEAD, *events, Finished(b"")), keep_log=False, buffer_limit=20_000, send_timeout=0.05
    )
    stalled, reading = flight.join(), flight.join()
    got = []
    while isinstance(item := reading.next_item(5), sse.Event):
        got.append(item)
    assert got == events and isinstance(item, Finished)
    assert stalled.left and flight.failure is None


def test_a_reader_leaving_frees_a_producer_waiting_for_it() -> None:
    events = _big_events(50, 10_000)
    flight = Flight(
        script(HEAD, *events, Finished(b"")), keep_log=False, buffer_limit=20_000, send_timeout=30
    )
    slow, fast = flight.join(), flight.join()
    gevent.sleep(0)
    got = [fast.next_item(5) for _ in range(flight.event_count)]  # fast is caught up
    gevent.sleep(0)  # the producer looks again: still too far ahead of slow, it waits
    assert flight._unread() > 20_000
    slow.leave()
    while isinstance(item := fast.next_item(5), sse.Event):
        got.append(item)
    assert got == events and isinstance(item, Finished)


# -- the flight's life, as Flight.state tells it ---------------------------------------------
def test_a_stream_is_waiting_then_streaming_then_complete() -> None:
    (a,) = _events("a")
    go, end = gevent.event.Event(), gevent.event.Event()
    flight = Flight(script(go, HEAD, a, end, Finished(b"")))
    listener = flight.join()
    seen = [flight.state]
    go.set()
    listener.wait_first_event(5)
    seen.append(flight.state)
    end.set()
    listener.wait_complete(5)
    seen.append(flight.state)
    listener.leave()
    assert seen == [WAITING, STREAMING, COMPLETE]


def test_a_whole_body_waits_until_the_flight_settled() -> None:
    """A non-stream answer is not streaming at any point: its head carries the whole body,
    which listeners get only once ``on_done`` ran (the entry stored first)."""
    body = Head(200, [("Content-Type", "application/json")], 1, b"{}")
    states: list[str] = []
    flight = Flight(script(body, "sleep"), on_done=lambda f: states.append(f.state))
    listener = flight.join()
    listener.wait_complete(5)
    listener.leave()
    assert states == [WAITING] and flight.state == COMPLETE


def test_a_flight_that_failed_or_was_left_says_so() -> None:
    failed = Flight(script(HEAD, UpstreamReset("cut")))
    listener = failed.join()
    with pytest.raises(GatewayError):
        listener.wait_complete(5)
    listener.leave()
    assert failed.state == FAILED and not failed.open_to_followers

    hold = gevent.event.Event()
    left = Flight(script(HEAD, *_events("a"), hold, Finished(b"")))
    reader = left.join()
    reader.wait_first_event(5)
    assert left.state == STREAMING and left.open_to_followers
    reader.leave()  # the last listener of an unfinished flight cancels it
    assert left.state == CANCELLED and not left.open_to_followers


def test_whoever_starts_a_flight_says_its_shape_and_source_and_the_producer_may_correct_it():
    def produce(flight: Flight) -> None:
        flight.took_lease()
        flight.answered_from(CACHE)
        flight.publish_head(HEAD, at=time.monotonic())
        flight.finish()

    flight = Flight(produce, stream=True, source=LEASE)
    assert (flight.stream, flight.source, flight.lease_held) == (True, LEASE, False)
    listener = flight.join()
    listener.wait_complete(5)
    listener.leave()
    assert (flight.source, flight.lease_held) == (CACHE, True)
    assert flight.head_at is not None and flight.head_at >= flight.started
