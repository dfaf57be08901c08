"""app/request/events.py and what builds on it: how a Responses stream ends, which of its events are
output, and how a stored one is replayed (app/cache/replay.py) or refused (app/cache/store.py)."""

from __future__ import annotations

import json

import pytest

from app.cache.entry import Entry
from app.cache.replay import reply_from_entry
from app.cache.store import entry_from_flight
from app.request import events as streams
from app.request import routes
from app.streams.flight import Flight, Head
from app.streams.relay import relay
from llmgate_wire import sse

RESPONSE = {"id": "resp_1", "object": "response", "status": "completed", "output": []}


def typed(kind: str, seq: int, *, named: bool = True, **fields) -> bytes:
    data = json.dumps({"type": kind, "sequence_number": seq, **fields})
    return (f"event: {kind}\n" if named else "").encode() + f"data: {data}\n\n".encode()


STREAM = [
    typed("response.created", 0, response={**RESPONSE, "status": "in_progress"}),
    typed("response.output_item.added", 1, output_index=0, item={"id": "m", "type": "message"}),
    typed("response.output_text.delta", 2, item_id="m", delta="Hi"),
    typed("response.output_text.done", 3, item_id="m", text="Hi"),
    typed("response.completed", 4, response={**RESPONSE, "usage": {"input_tokens": 3}}),
]


def decoded(raw: list[bytes]) -> list[sse.Event]:
    decoder = sse.Decoder()
    return [event for chunk in raw for event in decoder.feed(chunk)]


@pytest.mark.parametrize("named", [True, False])
def test_types_with_or_without_event_lines(named: bool) -> None:
    raw = typed("response.output_text.delta", 7, named=named, delta="x")
    assert streams.event_type(raw) == "response.output_text.delta"
    assert streams.is_output_delta(raw)
    (event,) = decoded([raw])
    assert streams.typed(event) == "response.output_text.delta"
    assert not streams.is_output_delta(typed("response.output_text.done", 8, named=named))
    assert streams.event_type(b'data: {"choices":[]}\n\n') is None
    assert streams.event_type(b"event:response.completed\r\ndata: {}\r\n\r\n") == (
        "response.completed"
    )


def test_what_ends_a_stream() -> None:
    events = decoded(STREAM)
    assert [streams.TERMINAL.ends(e) for e in events] == [False] * 4 + [True]
    for kind in ("response.failed", "response.incomplete", "error"):
        (event,) = decoded([typed(kind, 9)])
        assert streams.TERMINAL.ends(event)
        assert not streams.completed_ok([*events[:-1], event])
    assert streams.completed_ok(events)
    assert not streams.completed_ok(events[:-1])
    assert streams.DONE.ends(decoded([b"data: [DONE]\n\n"])[0])
    assert routes.RESPONSES.end is streams.TERMINAL
    assert routes.EMBEDDINGS.end is None


def _flight_of(events: list[bytes]) -> Flight:
    def produce(flight: Flight) -> None:
        flight.publish_head(Head(200, [("content-type", "text/event-stream")], 1, None))
        for event in decoded(events):
            flight.publish(event)
        flight.finish()

    flight = Flight(produce)
    flight.join().wait_complete()
    return flight


def test_only_a_completed_response_is_stored() -> None:
    entry = entry_from_flight(_flight_of(STREAM), now=1.0)
    assert entry is not None and entry.events == tuple(STREAM)
    failed = [*STREAM[:-1], typed("response.failed", 4, response={**RESPONSE, "status": "failed"})]
    assert entry_from_flight(_flight_of(failed), now=1.0) is None
    assert entry_from_flight(_flight_of(STREAM[:-1]), now=1.0) is None  # cut before the end


def _reply(entry: Entry, stream: bool):
    return reply_from_entry(
        entry, route=routes.RESPONSES, stream=stream, include_usage=False, status="HIT", age=0
    )


def test_a_stored_stream_replays_byte_for_byte_or_as_its_completed_object() -> None:
    entry = Entry(1.0, 0.1, 60, 200, "text/event-stream", events=tuple(STREAM))
    reply = _reply(entry, stream=True)
    assert reply is not None and not isinstance(reply.body, bytes)
    assert list(reply.body) == [STREAM]  # the events as stored, in one write
    whole = _reply(entry, stream=False)
    assert whole is not None
    assert json.loads(whole.body) == {**RESPONSE, "usage": {"input_tokens": 3}}
    cut = Entry(1.0, 0.1, 60, 200, "text/event-stream", events=tuple(STREAM[:-1]))
    assert _reply(cut, stream=False) is None


def test_a_stored_object_is_not_turned_into_events() -> None:
    entry = Entry(1.0, 0.1, 60, 200, "application/json", body=json.dumps(RESPONSE).encode())
    assert _reply(entry, stream=True) is None
    reply = _reply(entry, stream=False)
    assert reply is not None and reply.body == entry.body


@pytest.mark.parametrize(
    ("last", "error_added"),
    [
        (None, True),  # cut cleanly before any terminal event
        (typed("response.failed", 4, response={**RESPONSE, "status": "failed"}), False),
        (typed("response.incomplete", 4, response={**RESPONSE, "status": "incomplete"}), False),
        (STREAM[-1], False),
    ],
)
def test_relay_reports_a_responses_stream_cut_before_its_terminal_event(
    last: bytes | None, error_added: bool
) -> None:
    raw = [*STREAM[:-1], *([last] if last else [])]
    flight = _flight_of(raw)
    out = [
        chunk
        for batch in relay(flight.join(), heartbeat=5, end=streams.TERMINAL)
        for chunk in batch
    ]
    assert out[: len(raw)] == raw
    if error_added:
        (error,) = out[len(raw) :]
        body = sse.Decoder().feed(error)[0].json()
        assert body["error"]["code"] == "upstream_reset"
        assert "terminal response event" in body["error"]["message"]
    else:
        assert out == raw
