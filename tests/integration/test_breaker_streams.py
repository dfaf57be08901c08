"""A breaker hears what happens after the headers: streams the upstream cuts open it, streams
their callers leave do not, and a half-open probe is judged at its end or freed by its caller.

Three upstreams behind one gateway (nginx, one gunicorn gevent worker: breakers are per
worker, so the one the test drives is the only one):

- ``flaky``, a simulator serving ``sim-model``, told per request how to break a stream
  (``x-sim-fault``: a reset after two tokens, a stall after two);
- ``scripted``, a loopback server serving ``scripted-model``, for what the simulator does
  not do: a stream closed cleanly before ``[DONE]``, an event over LLMGATE_MAX_EVENT_BYTES;
- ``steady``, a simulator behind both (priority 1) whose configured header switches every
  fault off: where calls go while a breaker is open.

The simulators' own counters say what each upstream saw; the gateway's /metrics say what its
breaker made of it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
import urllib3

from tests.support.bodies import chat
from tests.support.calls import raw_chat_request
from tests.support.scripted_server import (
    Exchange,
    LoopbackServer,
    Request,
    chunk,
    completion,
    stream_tokens,
)
from tests.support.sim import sim_stats, start_simulator
from tests.support.sse_reader import data_events, read_events
from tests.support.stack import UPSTREAM, config_stack
from tests.support.waiting import wait_for

http = urllib3.PoolManager(retries=False)

FAILURES = 3  # LLMGATE_BREAKER_FAILURES
COOLDOWN_S = 3.0  # long enough to see an open breaker turn calls away, even on a busy machine
RESET = {"x-sim-fault": "reset", "x-sim-reset-after": "2"}
STALL = {"x-sim-fault": "stall-after", "x-sim-stall-after": "2"}  # past the 1 s idle timeout
# Slow enough to leave part-way, quick enough for the idle timeout (0.2 s between events).
SLOW = {"x-sim-tps": "5", "x-sim-ttft-ms": "0"}


def _scripted(request: Request, exchange: Exchange) -> None:
    """A whole answer for a plain call; a stream as ``x-test-cut`` says."""
    if not request.json().get("stream"):
        exchange.respond(200, completion("scripted"))
        return
    cut = request.headers.get("x-test-cut", "")
    if cut == "fin":  # delimited by the connection's end, which comes before [DONE]
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        exchange.sock.sendall(head + chunk("a") + chunk("b"))
        exchange.close()
    elif cut == "huge":  # one event larger than the gateway accepts
        exchange.start_stream()
        exchange.send(chunk("a"))
        exchange.send(chunk("x" * 8192))
        exchange.wait_gone(30)
        exchange.close()
    else:
        stream_tokens(exchange, ["a", "b"])


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("breaker-sims")
    flaky, flaky_url = start_simulator(logs)
    steady, steady_url = start_simulator(logs)
    with LoopbackServer(_scripted) as scripted:
        yield {"flaky": flaky_url, "steady": steady_url, "scripted": scripted.url}
    flaky.stop()
    steady.stop()


@pytest.fixture(scope="module")
def gw(make_stack, tmp_path_factory, upstreams):
    toml = f"""
[[upstreams]]
name = "flaky"
base_url = "{upstreams["flaky"]}/v1"
models = ["sim-model"]

[[upstreams]]
name = "scripted"
base_url = "{upstreams["scripted"]}/v1"
models = ["scripted-model"]

[[upstreams]]
name = "steady"
base_url = "{upstreams["steady"]}/v1"
priority = 1
headers = {{ "x-sim-fault" = "none" }}
"""
    return config_stack(make_stack, tmp_path_factory, toml, LLMGATE_BREAKER_FAILURES=str(FAILURES),
                  LLMGATE_BREAKER_COOLDOWN_S=str(COOLDOWN_S), LLMGATE_IDLE_TIMEOUT_S="1",
                  LLMGATE_MAX_EVENT_BYTES="4096")  # fmt: skip


MODEL = {"flaky": "sim-model", "scripted": "scripted-model"}


def _gauge(gw, name: str) -> float:
    """llmgate_upstream_state: set at each change of state, so an open breaker reads 2 until
    the next call looks at it, however long the test took to ask."""
    return gw.metric("llmgate_upstream_state", upstream=name)


def _attempts(gw, name: str) -> dict[str, float]:
    results = ("ok", "failed", "rate_limited", "cancelled")
    return {
        r: gw.metric("llmgate_upstream_attempts_total", upstream=name, result=r, default=0)
        for r in results
    }


def _state_now(gw, name: str) -> str:
    """The breaker's state as of now (an ended cooldown shows half-open), from /readyz."""
    ready = json.loads(http.request("GET", gw.url + "/readyz").data)
    return {u["name"]: u["state"] for u in ready["checks"]["upstream"]["upstreams"]}[name]


def _plain(gw, name: str, n: int = 0) -> str:
    """A whole-answer call for ``name``'s model; the upstream that answered it."""
    resp = gw.post("/v1/chat/completions", chat(model=MODEL[name], max_tokens=3, user=f"p{n}"))
    assert resp.status == 200, resp.data
    return resp.headers[UPSTREAM]


def _stream(gw, name: str, headers: dict[str, str], n: int) -> tuple[str, list[str]]:
    """A stream read to its end: the upstream that answered and the data of its events."""
    body = chat(True, model=MODEL[name], max_tokens=10, user=f"s{n}")
    resp = gw.post("/v1/chat/completions", body, headers=headers, preload_content=False)
    assert resp.status == 200
    events = [a.event.data or "" for a in data_events(read_events(resp))]
    resp.release_conn()
    return resp.headers[UPSTREAM], events


def _connect(gw, body: dict, headers: dict[str, str]) -> socket.socket:
    """A raw connection that has sent a streamed call: its caller may leave at any point."""
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(raw_chat_request(host, body, headers))
    return sock


def _read_events(sock: socket.socket, count: int) -> None:
    """Read until ``count`` data events came (the stream is under way)."""
    received = b""
    while received.count(b"data: ") < count:
        data = sock.recv(65536)
        assert data, received
        received += data


def _reset_sims(*urls: str) -> None:
    for url in urls:
        http.request("POST", url + "/sim/reset")


def _wait_half_open(gw, name: str) -> None:
    assert wait_for(lambda: _state_now(gw, name) == "half_open", COOLDOWN_S * 3)


@pytest.fixture
def closed(gw, upstreams):
    """Every breaker closed before the test (a probe that succeeds closes an open one)."""
    for name in ("flaky", "scripted"):
        if _state_now(gw, name) != "closed":
            _wait_half_open(gw, name)
            assert _plain(gw, name) == name
        assert _state_now(gw, name) == "closed" and _gauge(gw, name) == 0
    _reset_sims(upstreams["flaky"], upstreams["steady"])
    return gw


CUTS = {
    "reset": ("flaky", RESET, "upstream_reset"),
    "idle timeout": ("flaky", STALL, "idle_timeout"),
    "closed before [DONE]": ("scripted", {"x-test-cut": "fin"}, "upstream_reset"),
    "event too large": ("scripted", {"x-test-cut": "huge"}, "upstream_event_too_large"),
}


@pytest.mark.slow
@pytest.mark.parametrize("cut", list(CUTS))
def test_streams_cut_after_their_headers_open_the_breaker(closed, upstreams, cut: str) -> None:
    gw = closed
    name, headers, code = CUTS[cut]
    before = _attempts(gw, name)
    for n in range(FAILURES):
        assert _gauge(gw, name) == 0, n  # closed until the last of them
        answered, events = _stream(gw, name, headers, n)
        assert answered == name
        # The caller had a 200 and the first events, then the error event naming the cut.
        assert events[0].startswith("{") and code in events[-1], events
    assert _gauge(gw, name) == 2  # open
    after = _attempts(gw, name)
    assert after["failed"] - before["failed"] == FAILURES
    assert after["ok"] == before["ok"]  # none counted ok at its headers
    # Open: the next call goes to the steady upstream.
    assert _plain(gw, name) == "steady"
    if name == "flaky":
        stats = sim_stats(upstreams["flaky"])
        assert (stats["streams_started"], stats["streams_completed"]) == (FAILURES, 0)


def test_streams_their_callers_leave_are_no_failure(closed, upstreams) -> None:
    gw, flaky = closed, upstreams["flaky"]
    before = _attempts(gw, "flaky")
    left = FAILURES + 2
    for n in range(left):
        with _connect(gw, chat(True, max_tokens=200, user=f"l{n}"), SLOW) as sock:
            _read_events(sock, 3)
    assert wait_for(lambda: sim_stats(flaky)["streams_abandoned"] == left, 10), sim_stats(flaky)
    assert wait_for(lambda: _attempts(gw, "flaky")["cancelled"] - before["cancelled"] == left, 5)
    after = _attempts(gw, "flaky")
    assert (after["failed"], after["ok"]) == (before["failed"], before["ok"])
    assert _gauge(gw, "flaky") == 0
    assert _plain(gw, "flaky") == "flaky"


def test_a_429_is_not_a_breaker_failure(closed) -> None:
    gw = closed
    before = _attempts(gw, "flaky")
    for n in range(FAILURES + 2):
        resp = gw.post("/v1/chat/completions", chat(max_tokens=3, user=f"r{n}"),
                       headers={"x-sim-fault": "429"})  # fmt: skip
        # flaky's 429 moves the call to steady at once (its header switches the fault off).
        assert resp.status == 200 and resp.headers[UPSTREAM] == "steady"
    after = _attempts(gw, "flaky")
    assert after["rate_limited"] - before["rate_limited"] == FAILURES + 2
    assert after["failed"] == before["failed"]
    assert _gauge(gw, "flaky") == 0
    assert _plain(gw, "flaky") == "flaky"


# The tests below leave flaky's breaker open, its cooldown doubled by a failed probe, and the
# next test's `closed` waits that out (6 s): the quick tests that need it closed come first.
def _open_flaky(gw) -> None:
    for n in range(FAILURES):
        _stream(gw, "flaky", RESET, 100 + n)
    assert _gauge(gw, "flaky") == 2
    _wait_half_open(gw, "flaky")


def test_a_half_open_probe_is_judged_at_its_end(closed) -> None:
    gw = closed
    _open_flaky(gw)
    failed = _attempts(gw, "flaky")["failed"]
    # The probe streams from flaky and is cut after two tokens: open again, not closed at
    # its 200 (the next call finds it open: the cooldown doubled).
    answered, events = _stream(gw, "flaky", RESET, 200)
    assert answered == "flaky" and "upstream_reset" in events[-1]
    assert _gauge(gw, "flaky") == 2
    assert _attempts(gw, "flaky")["failed"] == failed + 1
    assert _plain(gw, "flaky") == "steady"


@pytest.mark.slow
@pytest.mark.parametrize("after_events", [0, 3], ids=["before its headers", "mid-stream"])
def test_a_probe_its_caller_leaves_lets_the_next_call_probe(
    closed, upstreams, after_events: int
) -> None:
    gw, flaky = closed, upstreams["flaky"]
    _open_flaky(gw)
    _reset_sims(flaky)
    before = _attempts(gw, "flaky")
    # Before its headers: the simulator holds them back; mid-stream: a slow stream.
    wait = {"x-sim-fault": "slow-headers", "x-sim-header-delay-ms": "30000"}
    headers = wait if after_events == 0 else SLOW
    with _connect(gw, chat(True, max_tokens=200, user="probe"), headers) as sock:
        _read_events(sock, after_events)
        assert wait_for(lambda: sim_stats(flaky)["requests"] == 1, 5)
        # While the probe is out, it is the only call flaky gets.
        assert _plain(gw, "flaky", 1) == "steady"
    assert wait_for(lambda: sim_stats(flaky)["streams_abandoned"] == 1, 5), sim_stats(flaky)
    assert wait_for(lambda: _attempts(gw, "flaky")["cancelled"] == before["cancelled"] + 1, 5)
    assert _attempts(gw, "flaky")["failed"] == before["failed"]
    # The left probe said nothing of flaky, and freed its slot: this call is the probe, and
    # its success closes the breaker.
    assert _plain(gw, "flaky", 2) == "flaky"
    assert _gauge(gw, "flaky") == 0
