"""Heartbeats keep slow streams alive through nginx; a caller leaving frees the upstream."""

from __future__ import annotations

import itertools
import json
import socket
import time

import openai
import pytest

from tests.support.bodies import chat
from tests.support.sse_reader import data_events, read_events
from tests.support.waiting import wait_for

HEARTBEAT = {"LLMGATE_HEARTBEAT_S": "0.5"}
# nginx's error log line when proxy_read_timeout fires before the app sent its headers.
NGINX_READ_TIMEOUT = "upstream timed out (110: Connection timed out) while reading response header"


@pytest.mark.slow
def test_pings_arrive_while_waiting_for_the_first_token_and_between_tokens(make_stack) -> None:
    gw = make_stack(env=HEARTBEAT)
    gw.sim_reset()
    resp = gw.post(
        "/v1/chat/completions",
        chat(True, max_tokens=3),
        preload_content=False,
        headers={"x-sim-ttft-ms": "2000", "x-sim-tps": "0.6"},
    )
    events = [a.event for a in read_events(resp)]
    kinds = ["ping" if e.is_comment else "data" for e in events]
    # Pings fill the 2 s before the first event, and the 1.7 s gaps between tokens.
    assert kinds[:2] == ["ping", "ping"], kinds
    assert events[-1].is_done
    content_idx = [
        i
        for i, e in enumerate(events)
        if e.data and '"content":"' in e.data and '"content":""' not in e.data
    ]
    between = kinds[content_idx[0] : content_idx[1]]
    assert "ping" in between, kinds
    # Pings only ever stand between whole events: each is exactly the comment bytes.
    assert all(e.raw == b": ping\n\n" for e in events if e.is_comment)


@pytest.mark.parametrize("fault", ["", "gzip"])
def test_pings_stand_between_the_tokens_of_a_stream_read_in_its_callers_greenlet(
    make_stack, fault: str
) -> None:
    """A stream of its own is read in its caller's greenlet once its head is in
    (app/streams/alone.py): each wait for the upstream's next bytes ends at the next
    heartbeat. A compressed stream, whose reads cannot wait that way, is read in a greenlet
    per read and pings the same."""
    gw = make_stack(env=HEARTBEAT)
    slow = {"x-sim-ttft-ms": "0", "x-sim-tps": "0.6", "x-sim-fault": fault}
    resp = gw.post("/v1/chat/completions", chat(True, max_tokens=4), preload_content=False,
                   headers=slow)  # fmt: skip
    events = [a.event for a in read_events(resp)]
    kinds = ["ping" if e.is_comment else "data" for e in events]
    assert events[-1].is_done, kinds
    tokens = [i for i, e in enumerate(events) if e.data and '"content":"' in e.data
              and '"content":""' not in e.data]  # fmt: skip
    assert len(tokens) >= 3, kinds
    for a, b in itertools.pairwise(tokens):  # 1.7 s between tokens, a ping every 0.5 s
        assert kinds[a:b].count("ping") >= 2, kinds


@pytest.mark.slow
def test_a_waiting_stream_is_never_silent_for_more_than_one_interval(make_stack) -> None:
    """Watched from the caller's side through nginx: with a 2 s heartbeat and an upstream
    that thinks 7 s, the headers and a first ping arrive together at about 2 s (they came at
    4 s when the ping waited one more interval after the commit), then a ping every 2 s."""
    gw = make_stack(env={"LLMGATE_HEARTBEAT_S": "2"})
    sent = time.monotonic()
    resp = gw.post("/v1/chat/completions", chat(True, max_tokens=2), preload_content=False,
                   headers={"x-sim-ttft-ms": "7000"})  # fmt: skip
    headers_at = time.monotonic() - sent
    arrivals = read_events(resp)
    assert resp.status == 200 and arrivals[-1].event.is_done
    assert arrivals[0].event.is_comment  # the ping committed with the headers
    first = arrivals[0].at - sent
    assert 1.5 <= headers_at <= 3.0 and first <= 3.0, (headers_at, first)
    times = [0.0] + [a.at - sent for a in arrivals]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) <= 3.0, gaps  # one interval plus a second, nowhere longer
    assert sum(a.event.is_comment for a in arrivals) >= 3  # at ~2, 4 and 6 s


def test_pings_while_the_upstream_has_not_even_sent_headers(make_stack) -> None:
    gw = make_stack(env=HEARTBEAT)
    resp = gw.post(
        "/v1/chat/completions",
        chat(True, max_tokens=2),
        preload_content=False,
        headers={"x-sim-fault": "slow-headers", "x-sim-header-delay-ms": "1800"},
    )
    assert resp.status == 200  # committed after one heartbeat interval
    events = [a.event for a in read_events(resp)]
    assert events[0].is_comment and events[-1].is_done


def test_sdk_ignores_heartbeats(make_stack) -> None:
    gw = make_stack(env=HEARTBEAT)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(
        **chat(True, max_tokens=3), extra_headers={"x-sim-ttft-ms": "1500"}
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(text.split()) == 3


@pytest.mark.slow
def test_heartbeats_outlive_a_short_nginx_read_timeout(make_stack) -> None:
    # nginx cuts a proxied response after 1.5 s without bytes; the upstream thinks for 4 s.
    with_pings = make_stack(env=HEARTBEAT, nginx_read_timeout_s=1.5)
    resp = with_pings.post(
        "/v1/chat/completions",
        chat(True, max_tokens=2),
        preload_content=False,
        headers={"x-sim-ttft-ms": "4000"},
    )
    assert resp.status == 200
    events = [a.event for a in read_events(resp)]
    assert events[0].is_comment and events[-1].is_done
    assert NGINX_READ_TIMEOUT not in with_pings.log("nginx")

    # Negative control: the same silence without heartbeats is cut by nginx, and the test
    # insists on exactly that cut. With no heartbeat the gateway holds its headers until the
    # first event, so nginx's read timeout fires while it waits for the response header:
    # the caller gets nginx's own 504 page after ~1.5 s, not the gateway's 504 (whose codes
    # name a phase) and not the answer after 4 s. Any other outcome fails.
    without = make_stack(env={"LLMGATE_HEARTBEAT_S": "0"}, nginx_read_timeout_s=1.5)
    started = time.monotonic()
    resp = without.post(
        "/v1/chat/completions", chat(True, max_tokens=2), headers={"x-sim-ttft-ms": "4000"}
    )
    elapsed = time.monotonic() - started
    assert resp.status == 504, (resp.status, resp.data[:300])
    assert resp.json()["error"]["code"] == "gateway_timeout", resp.data[:300]
    assert 1.4 <= elapsed < 3.5, elapsed
    assert NGINX_READ_TIMEOUT in without.log("nginx")


def _open_call(gw, body: dict, sim: dict[str, str]) -> socket.socket:
    """A chat call asked on a plain socket (so the test can hang up at any byte), with the
    simulator's controls ``sim``."""
    raw = json.dumps(body).encode()
    controls = "".join(f"{name}: {value}\r\n" for name, value in sim.items())
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{controls}Content-Length: {len(raw)}\r\n\r\n"
    )
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head.encode() + raw)
    return sock


def _open_stream(gw, *, tps: str, max_tokens: int) -> socket.socket:
    return _open_call(
        gw, chat(True, max_tokens=max_tokens), {"x-sim-tps": tps, "x-sim-ttft-ms": "0"}
    )


def test_client_leaving_mid_stream_abandons_the_upstream_stream(gw) -> None:
    sock = _open_stream(gw, tps="5", max_tokens=200)
    received = b""
    while received.count(b"data: ") < 3:
        received += sock.recv(65536)
    sock.close()
    # 200 tokens at 5/s would take 40 s; the simulator must see the stream dropped now.
    assert wait_for(lambda: gw.sim_stats()["streams_abandoned"] == 1, 5.0), gw.sim_stats()
    stats = gw.sim_stats()
    assert stats["streams_completed"] == 0
    # The upstream connection was closed, not returned half-read: the next calls get
    # whole, correct answers on clean connections.
    for _ in range(4):
        resp = gw.post("/v1/chat/completions", chat(max_tokens=3))
        assert resp.status == 200
        assert resp.json()["choices"][0]["message"]["content"]


def test_client_leaving_a_silent_stream_abandons_the_upstream_at_once(gw) -> None:
    """Between two tokens 10 s apart, the caller's greenlet waits for the upstream itself
    (app/streams/alone.py): its leaving must end that wait, not the next token's write."""
    sock = _open_stream(gw, tps="0.1", max_tokens=20)
    received = b""
    while b'"content":"' not in received.replace(b'"content":""', b""):
        received += sock.recv(65536)
    left = time.monotonic()
    sock.close()
    assert wait_for(lambda: gw.sim_stats()["streams_abandoned"] == 1, 8.0), gw.sim_stats()
    assert time.monotonic() - left < 5.0  # before the next token (10 s), not at it


@pytest.mark.parametrize("stream", [False, True])
def test_client_leaving_before_the_upstream_answers_cancels_the_call(gw, stream: bool) -> None:
    """Whole or streamed, a call of its own waits for its upstream's head in a greenlet
    (app/streams/alone.py): the caller's leaving must end it there."""
    sock = _open_call(gw, chat(stream, max_tokens=5), {"x-sim-fault": "stall-before"})
    assert wait_for(lambda: gw.sim_stats()["requests"] == 1, 5.0)
    sock.close()
    # The simulator counts a stream it was cut from apart from a whole answer.
    counter = "streams_abandoned" if stream else "requests_abandoned"
    assert wait_for(lambda: gw.sim_stats()[counter] == 1, 5.0), gw.sim_stats()


def test_many_streams_with_pings_leave_no_connection_half_used(make_stack) -> None:
    gw = make_stack(env=HEARTBEAT)
    gw.sim_reset()
    for _ in range(3):
        resp = gw.post(
            "/v1/chat/completions",
            chat(True, max_tokens=2),
            preload_content=False,
            headers={"x-sim-ttft-ms": "700"},
        )
        assert data_events(read_events(resp))[-1].event.is_done
    assert gw.sim_stats()["streams_completed"] == 3
