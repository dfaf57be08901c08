"""Admission control: the counters as a value, the gate, the ticket, the held body, the
settings they come from, nginx's outer guard, and the web layer giving slots back."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from app.core import admission
from app.core.admission import REQUESTS, STREAMS, Gate, Held, Limits, Load, Ticket
from app.core.config import WORKER_CONNECTIONS, Settings, SettingsError, admission_defaults
from app.core.errors import Overloaded
from app.factory import create_app
from app.request.call import SSE_HEADERS, Reply
from runner.nginx import NginxParams, nginx_conn_limit, render_nginx
from tests.conftest import ROOT

# -- Load: the counters as a value ----------------------------------------------------------


def test_acquire_counts_up_to_the_limit_and_refuses_beyond() -> None:
    limits = Limits(requests=2, streams=1)
    load = Load()
    one = load.acquire(REQUESTS, limits)
    assert one == Load(requests=1)
    two = one.acquire(REQUESTS, limits)
    assert two == Load(requests=2)
    assert two.acquire(REQUESTS, limits) is None
    assert load == Load()  # a value: acquiring made new ones
    assert Load(streams=1).acquire(STREAMS, limits) is None
    assert Load(requests=2).acquire(STREAMS, limits) == Load(requests=2, streams=1)


def test_zero_is_no_limit() -> None:
    big = Load(requests=10**6, streams=10**6)
    assert big.acquire(REQUESTS, Limits()) == Load(requests=10**6 + 1, streams=10**6)
    assert big.acquire(STREAMS, Limits()) == Load(requests=10**6, streams=10**6 + 1)


def test_release_counts_down_and_never_below_zero() -> None:
    assert Load(requests=2, streams=1).release(STREAMS) == Load(requests=2)
    assert Load(requests=2).release(REQUESTS) == Load(requests=1)
    with pytest.raises(ValueError):
        Load().release(REQUESTS)


# -- Gate: one worker's load ----------------------------------------------------------------


def _gate(requests: int, streams: int) -> tuple[Gate, list[tuple[str, str, Load]]]:
    events: list[tuple[str, str, Load]] = []
    gate = Gate(Limits(requests, streams), lambda *e: events.append(e))
    return gate, events


def test_a_stream_takes_both_slots_and_a_call_only_a_request_slot() -> None:
    gate, events = _gate(5, 5)
    assert gate.enter(stream=True) == (REQUESTS, STREAMS)
    assert gate.enter(stream=False) == (REQUESTS,)
    assert gate.load == Load(requests=2, streams=1)
    assert events == [
        (REQUESTS, "admitted", Load(requests=1, streams=1)),
        (STREAMS, "admitted", Load(requests=1, streams=1)),
        (REQUESTS, "admitted", Load(requests=2, streams=1)),
    ]
    gate.leave((REQUESTS, STREAMS))
    assert gate.load == Load(requests=1)
    assert events[-1] == (STREAMS, "released", Load(requests=1))


def test_a_refused_stream_takes_nothing_and_names_the_full_limit() -> None:
    gate, events = _gate(5, 1)
    gate.enter(stream=True)
    with pytest.raises(Overloaded) as refused:
        gate.enter(stream=True)
    assert refused.value.kind == STREAMS
    assert gate.load == Load(requests=1, streams=1)  # the request slot was not kept
    assert events[-1] == (STREAMS, "rejected", Load(requests=1, streams=1))
    assert gate.enter(stream=False) == (REQUESTS,)  # other calls still get in


def test_a_full_request_limit_refuses_streams_as_requests() -> None:
    gate, events = _gate(1, 5)
    gate.enter(stream=False)
    with pytest.raises(Overloaded) as refused:
        gate.enter(stream=True)
    assert refused.value.kind == REQUESTS
    assert gate.load == Load(requests=1)
    assert events[-1][:2] == (REQUESTS, "rejected")


def test_the_refusal_is_an_openai_429_the_caller_may_retry() -> None:
    gate, _ = _gate(5, 2)
    gate.enter(stream=True)
    gate.enter(stream=True)
    with pytest.raises(Overloaded) as refused:
        gate.enter(stream=True)
    exc = refused.value
    assert exc.status == 429
    error = json.loads(exc.to_json())["error"]
    assert error == {
        "message": "The gateway is busy: this worker is at its limit of 2 concurrent streams. "
        "Retry after 1 s.",
        "type": "rate_limit_error",
        "param": None,
        "code": "gateway_overloaded",
    }
    assert exc.response_headers() == {
        "Content-Type": "application/json",
        "retry-after": "1",
        "retry-after-ms": "1000",
        "x-should-retry": "true",
    }


# -- Ticket: one call's claim ---------------------------------------------------------------


def test_a_ticket_releases_what_it_took_exactly_once() -> None:
    gate, _ = _gate(5, 5)
    ticket = gate.ticket()
    ticket.release()  # nothing taken yet: nothing given back
    assert gate.load == Load()
    ticket.admit(stream=True)
    ticket.admit(stream=True)  # a second admission takes nothing more
    assert ticket.held == (REQUESTS, STREAMS)
    assert gate.load == Load(requests=1, streams=1)
    ticket.release()
    ticket.release()
    assert gate.load == Load()
    assert ticket.held == ()


def test_a_refused_ticket_holds_nothing() -> None:
    gate, _ = _gate(1, 1)
    gate.ticket().admit(stream=False)
    ticket = gate.ticket()
    with pytest.raises(Overloaded):
        ticket.admit(stream=False)
    ticket.release()
    assert gate.load == Load(requests=1)


def test_a_ticket_without_a_gate_admits_everything() -> None:
    ticket = Ticket()
    for _ in range(3):
        ticket.admit(stream=True)
    ticket.release()
    assert ticket.held == ()


# -- Held: the body that gives the slots back -----------------------------------------------


class Releases:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_a_body_sent_to_its_end_releases_once_closed() -> None:
    released = Releases()
    body = Held([b"a", b"b"], released)
    assert list(body) == [b"a", b"b"]
    assert released.count == 0  # the server writes the body's end, then closes it
    body.close()
    assert released.count == 1
    body.close()
    assert released.count == 1


def test_a_body_closed_midway_releases_and_closes_the_inner_body() -> None:
    closed = []

    def stream() -> Iterator[bytes]:
        try:
            yield b"one"
            yield b"two"
        finally:
            closed.append(True)

    released = Releases()
    body = Held(stream(), released)
    items = iter(body)  # as the server holds it while it writes
    assert next(items) == b"one"
    assert released.count == 0 and closed == []  # still being sent
    body.close()  # the server closes it: the caller left
    assert closed == [True]
    assert released.count == 1


def test_a_body_never_started_releases_when_closed() -> None:
    released = Releases()
    Held(iter([b"x"]), released).close()
    assert released.count == 1


def test_a_failing_inner_close_still_releases() -> None:
    class Broken:
        def __iter__(self) -> Iterator[bytes]:
            return iter([b"x"])

        def close(self) -> None:
            raise RuntimeError("close failed")

    released = Releases()
    with pytest.raises(RuntimeError):
        Held(Broken(), released).close()
    assert released.count == 1


# -- the settings ---------------------------------------------------------------------------


def test_the_defaults_are_shares_of_gunicorns_worker_connections() -> None:
    conf = (ROOT / "gunicorn.conf.py").read_text()
    match = re.search(r'"LLMGATE_WORKER_CONNECTIONS", "(\d+)"', conf)
    assert match and int(match.group(1)) == WORKER_CONNECTIONS
    assert admission_defaults({}) == {
        "max_requests_per_worker": Settings().max_requests_per_worker,
        "max_streams_per_worker": Settings().max_streams_per_worker,
    }
    assert Settings().max_requests_per_worker == WORKER_CONNECTIONS * 4 // 5
    assert Settings().max_streams_per_worker == WORKER_CONNECTIONS * 2 // 5
    assert Settings.from_env({}) == Settings()


def test_the_defaults_follow_worker_connections_and_explicit_values_win() -> None:
    sized = Settings.from_env({"LLMGATE_WORKER_CONNECTIONS": "1000"})
    assert (sized.max_requests_per_worker, sized.max_streams_per_worker) == (800, 400)
    given = Settings.from_env(
        {"LLMGATE_WORKER_CONNECTIONS": "1000", "LLMGATE_MAX_STREAMS_PER_WORKER": "0"}
    )
    assert (given.max_requests_per_worker, given.max_streams_per_worker) == (800, 0)
    with pytest.raises(SettingsError, match="LLMGATE_MAX_REQUESTS_PER_WORKER"):
        Settings.from_env({"LLMGATE_MAX_REQUESTS_PER_WORKER": "-1"})
    with pytest.raises(SettingsError, match="LLMGATE_WORKER_CONNECTIONS"):
        Settings.from_env({"LLMGATE_WORKER_CONNECTIONS": "many"})


# -- nginx's outer guard --------------------------------------------------------------------


def _nginx(settings: Settings, workers: int) -> str:
    params = NginxParams.for_settings(
        settings, listen="127.0.0.1:18080", app_servers=["127.0.0.1:18000"], app_workers=workers
    )
    return render_nginx(params)


def test_nginx_limit_conn_is_the_app_limit_times_workers_plus_headroom() -> None:
    assert nginx_conn_limit(4000, 2) == 8800
    assert nginx_conn_limit(5, 1) == 13  # at least 8 of headroom
    assert nginx_conn_limit(0, 4) == 0
    text = _nginx(Settings(max_requests_per_worker=4000), 2)
    assert "limit_conn llmgate_admission 8800;" in text
    assert "limit_conn llmgate_admission 13;" in _nginx(Settings(max_requests_per_worker=5), 1)
    unlimited = _nginx(Settings(max_requests_per_worker=0), 2)
    assert not re.search(r"^\s*limit_conn ", unlimited, re.M)
    # Counted on a fixed key for API paths only; refused as JSON 429 gateway_overloaded.
    assert re.search(r"~\^/v1/ api;\s+default \"\";", text)
    assert "limit_conn_status 429;" in text
    # The page's path ends with the door's ("anthropic/" on /v1/messages, else "").
    assert "error_page 429 /_llmgate_error/${llmgate_error_door}429;" in text
    for door in ("", "anthropic/"):
        page = re.search(
            rf"location = /_llmgate_error/{door}429 \{{(.*?)\n            \}}", text, re.S
        )
        assert page is not None
        body = re.search(r"return 429 '(.*)\\n';", page.group(1))
        assert body is not None
        error = json.loads(body.group(1))["error"]
        if door:
            assert error["type"] == "rate_limit_error" and "busy" in error["message"]
        else:
            assert (error["type"], error["code"]) == ("rate_limit_error", "gateway_overloaded")
        for header in ("retry-after 1", "retry-after-ms 1000", "x-should-retry true"):
            assert f"add_header {header} always;" in page.group(1)


# -- the web layer: slots come back when the body is closed ---------------------------------


@pytest.fixture
def app(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    app = create_app(
        Settings(
            upstream_url="http://127.0.0.1:9/v1",
            max_requests_per_worker=2,
            max_streams_per_worker=1,
            retries=0,
        )
    )
    gateway = app.extensions["llmgate"]
    real_handle = gateway.handle

    def handle(call, caller=None):
        """The real admission line of Gateway.handle, then a stream that waits to be read."""
        stream = json.loads(call.body).get("stream", False)
        if not stream:
            return real_handle(call, caller)
        call.admission.admit(stream)

        def events() -> Iterator[list[bytes]]:
            for n in range(100):
                yield [f"data: {n}\n\n".encode()]

        return Reply(200, list(SSE_HEADERS), events())

    monkeypatch.setattr(gateway, "handle", handle)
    return app


def _metric(app, name: str, kind: str) -> float:
    text = app.extensions["llmgate"].metrics.exposition()[0].decode()
    match = re.search(rf'^{name}{{kind="{kind}"}} (\S+)$', text, re.M)
    assert match, text
    return float(match.group(1))


STREAM = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def test_a_caller_leaving_mid_stream_gives_the_slot_back(app) -> None:
    client = app.test_client()
    gate = app.extensions["llmgate.admission"]
    first = client.post("/v1/chat/completions", json=STREAM, buffered=False)
    assert first.status_code == 200
    assert next(first.response) == b"data: 0\n\n"
    assert gate.load == Load(requests=1, streams=1)
    assert _metric(app, "llmgate_admission_in_flight", "streams") == 1

    refused = client.post("/v1/chat/completions", json=STREAM)
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "gateway_overloaded"
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["x-should-retry"] == "true"
    assert _metric(app, "llmgate_admission_rejected_total", "streams") == 1
    # Never refused, whatever the load.
    for path in ("/healthz", "/metrics", "/status.json"):
        assert client.get(path).status_code == 200, path

    first.close()  # what the server does when the caller leaves mid-stream
    assert gate.load == Load()
    assert _metric(app, "llmgate_admission_in_flight", "streams") == 0
    again = client.post("/v1/chat/completions", json=STREAM)
    assert again.status_code == 200
    assert gate.load == Load(requests=1, streams=1)
    assert again.get_data().count(b"data: ") == 100
    assert gate.load == Load(requests=1, streams=1)  # sent to its end, not yet closed
    again.close()  # what the server does after the body's last byte
    assert gate.load == Load()


def test_complete_answers_and_errors_give_their_slot_back(app) -> None:
    client = app.test_client()
    gate = app.extensions["llmgate.admission"]
    # Admitted, then a gateway error (port 9 refuses): the slot comes back with the answer.
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):
        resp = client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 502
        assert gate.load == Load(requests=1)  # until its body is sent and closed
        assert resp.get_json()["error"]["code"] == "upstream_unreachable"
        resp.close()  # what the server does after the body's last byte
        assert gate.load == Load()
    # A body refused before admission takes nothing.
    assert client.post("/v1/chat/completions", json={"model": "m"}).status_code == 400
    assert gate.load == Load()
    assert admission.RETRY_AFTER_S == 1
