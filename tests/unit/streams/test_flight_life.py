"""A flight's life as a table (app/streams/flight_life.py): every allowed move leads where the
table says, with what its listeners see and wait on; every other move is illegal and changes
nothing; a producer's bug (a second head or end, an event before the head or after the end)
raises where it is made; a producer not yet told of the drain's stop may still end its
answer, one told of nothing moves nothing once the flight settled."""

from __future__ import annotations

import logging
from collections.abc import Callable

import gevent
import gevent.event
import pytest

from app.core.errors import GatewayShutdown, UpstreamProtocolError, UpstreamReset
from app.core.moves import IllegalMove
from app.request import events as streams
from app.streams import flight_life as life
from app.streams.answer import Finished, Head
from app.streams.flight import Flight
from app.streams.flight_life import LIFE, SEEN
from app.streams.relay import relay
from llmgate_wire import sse
from tests.support.flights import script

HEAD = Head(200, [("Content-Type", "text/event-stream")], 1, None)
BODY = Head(200, [("Content-Type", "application/json")], 1, b"{}")
A, B, DONE = sse.Decoder().feed(b"data: a\n\ndata: b\n\ndata: [DONE]\n\n")

# A way to each state from ``waiting``, move by move.
WAY = {
    life.WAITING: [],
    life.STREAMING: [life.HEAD],
    life.ANSWERED: [life.BODY],
    life.FAILING: [life.FAIL],
    life.STOPPING: [life.STOP],
    life.CANCELLING: [life.CANCEL],
    life.COMPLETE: [life.BODY, life.SETTLE],
    life.FAILED: [life.FAIL, life.SETTLE],
    life.CANCELLED: [life.CANCEL, life.SETTLE],
}
MOVES = {move for row in LIFE.values() for move in row}


def _held() -> Flight:
    """A flight whose producer never runs: its greenlet is gone before it started, and the
    test makes the moves (``_move``, the one door every method goes through)."""
    flight = Flight(lambda f: None)
    flight._greenlet.kill()
    return flight


def _at(state: str) -> Flight:
    flight = _held()
    for move in WAY[state]:
        flight._move(move)
    assert flight.life == state
    return flight


def _seen(flight: Flight) -> tuple[str, str, bool, bool]:
    return flight.life, flight.state, flight.settled, flight.cancelled


def test_the_ways_reach_every_state_of_the_table() -> None:
    assert set(WAY) == set(LIFE)
    assert set(SEEN.values()) == {life.WAITING, life.STREAMING, life.COMPLETE, life.FAILED,
                                  life.CANCELLED}  # fmt: skip


@pytest.mark.parametrize(
    ("state", "move"), [(s, m) for s in LIFE for m in sorted(LIFE[s])], ids=str
)
def test_every_allowed_move_leads_where_the_table_says(state: str, move: str) -> None:
    flight = _at(state)
    before = flight.state
    flight._move(move)
    to = LIFE[state][move]
    assert flight.life == to
    assert flight.state == SEEN.get(to, before)  # what listeners see, or as it was
    assert flight.settled == (to in (life.COMPLETE, life.FAILED, life.CANCELLED))
    assert flight.cancelled == (to in (life.CANCELLING, life.CANCELLED))
    assert flight.complete == (to in (life.ANSWERED, life.COMPLETE))


@pytest.mark.parametrize(
    ("state", "move"),
    [(s, m) for s in LIFE for m in sorted(MOVES) if m not in LIFE[s]],
    ids=str,
)
def test_every_other_move_is_illegal_and_changes_nothing(state: str, move: str) -> None:
    flight = _at(state)
    before = _seen(flight)
    with pytest.raises(IllegalMove, match=f"a flight cannot {move} when {state}"):
        flight._move(move)
    assert _seen(flight) == before


# -- a producer's bugs raise where they are made --------------------------------------------
def _producing(*steps: object) -> tuple[Flight, list[IllegalMove]]:
    """A flight whose producer runs ``steps``: tests/support/flights.py's, or a call to
    make on the flight, refused or not (what it refused is kept)."""
    refused: list[IllegalMove] = []
    done = gevent.event.Event()

    def produce(flight: Flight) -> None:
        for step in steps:
            if callable(step):
                try:
                    step(flight)
                except IllegalMove as exc:
                    refused.append(exc)
            else:
                script(step)(flight)
        done.set()

    flight = Flight(produce)
    done.wait(5)
    return flight, refused


BUGS: dict[str, tuple[list[object], Callable[[Flight], object], str, str]] = {
    "a second head": ([HEAD, A], lambda f: f.publish_head(HEAD), "streaming", "head"),
    "a head after the end": (
        [HEAD, A, Finished(b"")],
        lambda f: f.publish_head(HEAD),
        "answered",
        "head",
    ),
    "a body after a body": ([BODY], lambda f: f.publish_head(BODY), "answered", "body"),
    "an event before the head": ([], lambda f: f.publish(A), "waiting", "events"),
    "an event after the end": (
        [HEAD, A, Finished(b"")],
        lambda f: f.publish(B),
        "answered",
        "events",
    ),
    "an event after a whole body": ([BODY], lambda f: f.publish(A), "answered", "events"),
    "finishing twice": ([HEAD, A, Finished(b"")], lambda f: f.finish(), "answered", "finish"),
    "finishing before the head": ([], lambda f: f.finish(), "waiting", "finish"),
    "failing after the end": (
        [HEAD, A, Finished(b"")],
        lambda f: f.fail(UpstreamReset("x")),
        "answered",
        "fail",
    ),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_producers_illegal_move_raises_and_the_flight_stays_as_it_was(bug: str) -> None:
    steps, wrong, state, move = BUGS[bug]
    flight, refused = _producing(*steps, wrong)
    assert [(e.state, e.move) for e in refused] == [(state, move)]
    listener = flight.join()
    if state in (life.WAITING, life.STREAMING):
        # Its producer then returned with no end: its listeners hear it was given up.
        assert flight.life == life.CANCELLED
    else:
        listener.wait_complete(5)
        assert flight.life == life.COMPLETE and flight.failure is None
    # The refused move added nothing, and changed no end.
    if flight.head is not None and flight.head.body is None:
        assert flight.events == [A]
        assert flight.end == (Finished(b"") if state == life.ANSWERED else None)
    listener.leave()


def test_an_event_before_the_head_uncaught_is_a_502_the_log_explains(caplog) -> None:
    """The bug reaches the callers as any producer's bug does: a 502, the traceback in the
    log, never a stream that passes for an answer."""
    with caplog.at_level(logging.ERROR):
        flight = Flight(script(A, HEAD, Finished(b"")))
        with pytest.raises(UpstreamProtocolError):
            flight.join().wait_head(5)
    assert "answer producer failed" in caplog.text and "a flight cannot events" in caplog.text
    assert flight.life == life.FAILED


def test_nothing_moves_a_settled_flight() -> None:
    flight = Flight(script(HEAD, A, DONE, Finished(b"")))
    listener = flight.join()
    listener.wait_complete(5)
    for wrong in (
        lambda: flight.publish(B),
        lambda: flight.publish_head(HEAD),
        flight.finish,
        lambda: flight.fail(UpstreamReset("late")),
    ):
        with pytest.raises(IllegalMove):
            wrong()
    assert flight.life == life.COMPLETE and flight.end == Finished(b"")
    flight.shut_down(GatewayShutdown("drain"))  # the drain finds it done: left alone
    assert flight.life == life.COMPLETE and flight.failure is None
    listener.leave()


# -- the producer is told of a stop or a cancel only at its next switch ----------------------
def test_a_producer_the_drain_stopped_may_still_end_its_answer_before_it_hears() -> None:
    """The drain's kill reaches the producer at its next switch: what it publishes until
    then is taken, and a stream it ends is complete, as if the drain came after."""
    hold = gevent.event.Event()
    flight = Flight(script(HEAD, A, hold))
    listener = flight.join()
    assert listener.wait_first_event(5)
    flight.shut_down(GatewayShutdown("drain"))  # its kill is on its way
    assert (flight.life, flight.state) == (life.STOPPING, life.STREAMING)
    flight.publish_all([B, DONE])  # as the producer would, woken before the kill
    flight.finish()
    out = [chunk for batch in relay(listener, heartbeat=5, end=streams.DONE) for chunk in batch]
    assert out == [A.raw, B.raw, DONE.raw]
    assert (flight.life, flight.complete) == (life.COMPLETE, True)


def test_a_stopped_flight_that_hears_in_time_fails_with_the_drains_error() -> None:
    flight = Flight(script(HEAD, A, gevent.event.Event()))
    listener = flight.join()
    assert listener.wait_first_event(5)
    flight.shut_down(GatewayShutdown("drain"))
    assert isinstance(listener.next_batch(5), list)  # A
    assert isinstance(listener.next_batch(5), GatewayShutdown)
    assert flight.life == life.FAILED


def test_a_producer_woken_as_its_last_listener_leaves_is_cancelled_all_the_same() -> None:
    """Its wake-up is ahead of the kill: it publishes and ends, and the flight stays
    cancelled (nobody is left to read it, nothing is stored)."""
    go = gevent.event.Event()
    flight = Flight(script(HEAD, A, go, B, DONE, Finished(b"")))
    listener = flight.join()
    assert listener.wait_first_event(5)
    go.set()  # its wake-up is queued before the kill the leave sends
    listener.leave()
    assert (flight.life, flight.state) == (life.CANCELLED, life.CANCELLED)
    assert flight.event_count == 3 and not flight.complete  # it ran on, and is not kept
