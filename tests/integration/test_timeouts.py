"""The four timeouts: each fires with its own error, before and after the first byte.

Before anything reached the caller a timeout is a 504 JSON error naming its phase; after,
it is one final SSE `data: {"error": ...}` event and the stream closes without [DONE].
"""

from __future__ import annotations

import pytest

from tests.support.bodies import chat
from tests.support.faults import BlackHole
from tests.support.sse_reader import data_events, read_events

FAST = {
    "LLMGATE_CONNECT_TIMEOUT_S": "0.5",
    "LLMGATE_FIRST_BYTE_TIMEOUT_S": "1",
    "LLMGATE_IDLE_TIMEOUT_S": "1",
    "LLMGATE_DEADLINE_S": "8",
    "LLMGATE_HEARTBEAT_S": "10",
}


@pytest.fixture(scope="module")
def blackhole():
    hole = BlackHole()
    yield hole
    hole.close()


def _assert_504(resp, phase: str) -> None:
    assert resp.status == 504, resp.data
    assert resp.headers["Content-Type"] == "application/json"
    error = resp.json()["error"]
    assert error["code"] == f"{phase}_timeout"
    assert error["type"] == "timeout_error"
    assert phase.replace("_", " ") in error["message"].replace("_", " ")


def _live_stream(gw, headers: dict[str, str], **fields):
    """A streamed chat call, its body left unread for the test to read as it comes."""
    return gw.post(
        "/v1/chat/completions", chat(True, **fields), preload_content=False, headers=headers
    )


def _final_error(resp) -> dict:
    assert resp.status == 200
    events = [a.event for a in data_events(read_events(resp))]
    assert events, "no events"
    assert not any(e.is_done for e in events)
    return events[-1].json()["error"]


def test_connect_timeout(make_stack, blackhole) -> None:
    gw = make_stack(
        env={**FAST, "LLMGATE_RETRIES": "1", "LLMGATE_RETRY_BACKOFF_S": "0.01"},
        upstream_url=blackhole.url,
        memcached=False,
    )
    resp = gw.post("/v1/chat/completions", chat())
    _assert_504(resp, "connect")
    assert resp.headers["x-should-retry"] == "false"  # we retried already
    resp = gw.post("/v1/chat/completions", chat(True))
    _assert_504(resp, "connect")


@pytest.mark.parametrize("stream", [False, True])
def test_first_byte_timeout_before_the_first_byte(make_stack, stream: bool) -> None:
    gw = make_stack(env=FAST, memcached=False)
    resp = gw.post(
        "/v1/chat/completions",
        chat(stream),
        headers={"x-sim-fault": "slow-headers", "x-sim-header-delay-ms": "3000"},
    )
    _assert_504(resp, "first_byte")


def test_first_byte_timeout_after_heartbeats_started(make_stack) -> None:
    gw = make_stack(env={**FAST, "LLMGATE_HEARTBEAT_S": "0.3"}, memcached=False)
    resp = _live_stream(gw, {"x-sim-fault": "slow-headers", "x-sim-header-delay-ms": "3000"})
    assert _final_error(resp)["code"] == "first_byte_timeout"


def test_idle_timeout_before_the_first_byte(make_stack) -> None:
    # Headers arrive, then nothing: no event ever reached the caller, so it is an HTTP 504.
    gw = make_stack(env=FAST, memcached=False)
    resp = gw.post("/v1/chat/completions", chat(True), headers={"x-sim-fault": "stall-before"})
    _assert_504(resp, "idle")


def test_idle_timeout_after_the_first_byte(make_stack) -> None:
    gw = make_stack(env=FAST, memcached=False)
    resp = _live_stream(gw, {"x-sim-fault": "stall-after", "x-sim-ttft-ms": "0"}, max_tokens=6)
    assert _final_error(resp)["code"] == "idle_timeout"


def test_the_idle_timeout_runs_on_across_heartbeats(make_stack) -> None:
    # Heartbeats every 0.3 s, each a wait of its own for the upstream's next byte: the 1 s
    # idle timeout counts from the last byte, across them, not from each wait (else only
    # the 8 s deadline would end the stall).
    gw = make_stack(env={**FAST, "LLMGATE_HEARTBEAT_S": "0.3"}, memcached=False)
    resp = _live_stream(gw, {"x-sim-fault": "stall-after", "x-sim-ttft-ms": "0"}, max_tokens=6)
    arrivals = read_events(resp)
    assert any(a.event.is_comment for a in arrivals)  # the stall had its heartbeats
    assert data_events(arrivals)[-1].event.json()["error"]["code"] == "idle_timeout"


def test_a_stream_whose_tokens_keep_coming_outlives_the_idle_timeout(make_stack) -> None:
    # 10 tokens 250 ms apart: 2.5 s in all, more than twice the 1 s idle timeout, which
    # counts from the last byte, not from the first read.
    gw = make_stack(env=FAST, memcached=False)
    resp = _live_stream(gw, {"x-sim-tps": "4", "x-sim-ttft-ms": "0"}, max_tokens=10)
    assert resp.status == 200
    events = [a.event for a in data_events(read_events(resp))]
    assert events and events[-1].is_done, events[-1:]
    assert not any("error" in (e.data or "")[:12] for e in events)


DEADLINE = {
    **FAST,
    "LLMGATE_FIRST_BYTE_TIMEOUT_S": "30",
    "LLMGATE_IDLE_TIMEOUT_S": "30",
    "LLMGATE_DEADLINE_S": "1.5",
}


def test_deadline_before_the_first_byte(make_stack) -> None:
    gw = make_stack(env=DEADLINE, memcached=False)
    resp = gw.post("/v1/chat/completions", chat(), headers={"x-sim-ttft-ms": "5000"})
    _assert_504(resp, "deadline")


def test_deadline_after_the_first_byte(make_stack) -> None:
    gw = make_stack(env=DEADLINE, memcached=False)
    resp = _live_stream(gw, {"x-sim-tps": "4", "x-sim-ttft-ms": "0"}, max_tokens=30)
    assert _final_error(resp)["code"] == "deadline_timeout"
