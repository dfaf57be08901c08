"""Draining: unready at once, calls still running end with gateway_shutdown, never silently."""

from __future__ import annotations

import gevent
import pytest

from app.core.config import Settings
from app.core.errors import GatewayShutdown
from app.factory import create_app
from app.request import events as streams
from app.streams.drain import Lifecycle
from app.streams.flight import Flight, Head
from app.streams.relay import relay
from llmgate_wire import sse

HEAD = Head(200, [("Content-Type", "text/event-stream")], 1, None)


def _endless(flight: Flight) -> None:
    flight.publish_head(HEAD)
    for event in sse.Decoder().feed(b"data: a\n\ndata: b\n\n"):
        flight.publish(event)
    gevent.sleep(60)  # a long generation


def test_a_stream_still_running_ends_with_a_shutdown_error_event() -> None:
    lifecycle = Lifecycle()
    flight = lifecycle.track(Flight(_endless))
    listener = flight.join()
    out = relay(listener, heartbeat=5, end=streams.DONE)
    assert next(out) == [b"data: a\n\n", b"data: b\n\n"]  # published together: one write
    lifecycle.stop_calls()
    rest = list(out)
    assert len(rest) == 1 and len(rest[0]) == 1
    error = sse.Decoder().feed(rest[0][0])[0].json()["error"]
    assert error["code"] == "gateway_shutdown" and error["type"] == "api_error"
    assert flight.settled and not flight.cancelled


def test_a_call_still_waiting_for_its_upstream_gets_a_503() -> None:
    lifecycle = Lifecycle()
    flight = lifecycle.track(Flight(lambda f: gevent.sleep(60)))
    listener = flight.join()
    gevent.sleep(0)
    lifecycle.stop_calls()
    with pytest.raises(GatewayShutdown) as caught:
        listener.wait_head(5)
    assert caught.value.status == 503 and caught.value.retryable  # retry elsewhere


def test_a_finished_call_is_left_alone() -> None:
    lifecycle = Lifecycle()
    flight = lifecycle.track(Flight(lambda f: f.publish_head(Head(200, [], 1, b"{}"))))
    listener = flight.join()
    head = listener.wait_head(5)
    assert head is not None and head.body == b"{}"
    lifecycle.stop_calls()
    assert flight.failure is None and flight.complete


def test_drain_turns_unready_first_then_stops_calls_before_the_grace_ends() -> None:
    lifecycle = Lifecycle()
    flight = lifecycle.track(Flight(_endless))
    flight.join()
    slept = []

    def sleep(seconds: float) -> None:
        assert lifecycle.draining and flight.failure is None  # unready, calls still running
        slept.append(seconds)

    lifecycle.drain(30, sleep=sleep)
    assert slept == [28.0]  # 2 s before gunicorn's own cut
    assert isinstance(flight.end, GatewayShutdown)
    short = Lifecycle()
    short.drain(5, sleep=slept.append)
    assert slept[-1] == 4.0  # a fifth of a short grace


def test_readyz_is_503_while_draining() -> None:
    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1", cache_mode="off"))
    client = app.test_client()
    app.extensions["llmgate"].lifecycle.draining = True
    resp = client.get("/readyz")
    assert resp.status_code == 503 and resp.get_json()["checks"]["draining"] is True
    assert resp.get_json()["ready"] is False
