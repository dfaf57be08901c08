"""Admission control through the real stack: beyond a worker's limits the answer is an
immediate 429 gateway_overloaded, the admitted calls are unharmed, and slots come back when
a call ends or its caller leaves. Counting, not timing: bounds are generous."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from pathlib import Path

import urllib3

from app.core.config import Settings
from runner.nginx import NginxParams, start_nginx
from tests.support.bodies import chat
from tests.support.calls import raw_chat_request
from tests.support.sse_reader import content_of, data_events, read_events
from tests.support.waiting import wait_for

N = 3  # streams per worker
LIMITS = {
    "LLMGATE_MAX_STREAMS_PER_WORKER": str(N),
    "LLMGATE_MAX_REQUESTS_PER_WORKER": str(N + 2),
}
SLOW = {"x-sim-tps": "5", "x-sim-tokens": "10", "x-sim-ttft-ms": "0"}  # about 2 s a stream
REFUSAL_BOUND_S = 1.0


def _one_worker(make_stack):
    gw = make_stack(env=LIMITS, workers=1, memcached=False)
    gw.sim_reset()
    _wait_for(lambda: gw.metric("llmgate_admission_in_flight", kind="requests") == 0)
    return gw


def _wait_for(predicate) -> bool:
    return wait_for(predicate, timeout=15.0)


def _stream_body(i: int, **fields) -> dict:
    return chat(True, messages=[{"role": "user", "content": f"story number {i}"}], **fields)


def _assert_refused(status: int, headers, body: bytes, kind: str) -> None:
    assert status == 429, (status, body[:300])
    error = json.loads(body)["error"]
    assert error["code"] == "gateway_overloaded", error
    assert error["type"] == "rate_limit_error", error
    if kind:
        assert f"concurrent {kind}" in error["message"], error
    assert headers["retry-after"] == "1"
    assert headers["retry-after-ms"] == "1000"
    assert headers["x-should-retry"] == "true"


def _concurrent_streams(gw, count: int, headers: dict) -> list[dict]:
    """``count`` streams sent at the same moment; each outcome with its time to headers."""
    barrier = threading.Barrier(count)
    outcomes: list[dict] = [{} for _ in range(count)]

    def one(i: int) -> None:
        barrier.wait()
        started = time.monotonic()
        resp = gw.post(
            "/v1/chat/completions", _stream_body(i), preload_content=False, headers=headers
        )
        outcome = {"status": resp.status, "headers": resp.headers, "to_headers_s": 0.0}
        outcome["to_headers_s"] = time.monotonic() - started
        if resp.status == 200:
            outcome["events"] = read_events(resp)
        else:
            outcome["body"] = resp.read()
        resp.release_conn()
        outcomes[i] = outcome

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_streams_beyond_the_limit_are_refused_at_once_and_the_admitted_are_unharmed(
    make_stack,
) -> None:
    gw = _one_worker(make_stack)
    rejected_before = gw.metric("llmgate_admission_rejected_total", kind="streams")

    outcomes = _concurrent_streams(gw, 2 * N, SLOW)

    admitted = [o for o in outcomes if o["status"] == 200]
    refused = [o for o in outcomes if o["status"] != 200]
    assert len(admitted) == N, [o["status"] for o in outcomes]
    assert len(refused) == N, [o["status"] for o in outcomes]
    for o in admitted:
        events = data_events(o["events"])
        assert events[-1].event.is_done
        assert not any('"error"' in (a.event.data or "") for a in events)
        assert len(content_of(events).split()) == 10  # every token, none lost
    for o in refused:
        _assert_refused(o["status"], o["headers"], o["body"], "streams")
    slowest = max(o["to_headers_s"] for o in refused)
    print(f"\nrefusal latency: {sorted(round(o['to_headers_s'], 4) for o in refused)} s")
    assert slowest < REFUSAL_BOUND_S, slowest
    # The refused never reached the upstream.
    stats = gw.sim_stats()
    assert stats["streams_started"] == N, stats
    assert stats["streams_completed"] == N, stats
    assert gw.metric("llmgate_admission_rejected_total", kind="streams") == rejected_before + N

    # Their slots came back: N new streams are all admitted.
    assert _wait_for(lambda: gw.metric("llmgate_admission_in_flight", kind="streams") == 0)
    again = _concurrent_streams(gw, N, {"x-sim-tokens": "3"})
    assert [o["status"] for o in again] == [200] * N
    assert all(data_events(o["events"])[-1].event.is_done for o in again)
    assert gw.sim_stats()["streams_started"] == 2 * N


def _open_raw_stream(gw, i: int) -> socket.socket:
    """A stream on a raw socket, read until its first content event: admitted and running."""
    body = _stream_body(i, max_tokens=200)
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(raw_chat_request(host, body, {"x-sim-tps": "5", "x-sim-ttft-ms": "0"}))
    received = b""
    while received.count(b"data: ") < 2:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    return sock


def test_a_caller_leaving_mid_stream_frees_its_slot(make_stack) -> None:
    gw = _one_worker(make_stack)
    socks = [_open_raw_stream(gw, i) for i in range(N)]
    try:
        full = gw.post("/v1/chat/completions", _stream_body(99), headers=SLOW)
        _assert_refused(full.status, full.headers, full.data, "streams")

        socks.pop().close()  # 200 tokens at 5/s: 40 s left, the caller leaves now
        assert _wait_for(lambda: gw.metric("llmgate_admission_in_flight", kind="streams") == N - 1)
        resp = gw.post(
            "/v1/chat/completions",
            _stream_body(100),
            preload_content=False,
            headers={"x-sim-tokens": "3"},
        )
        assert resp.status == 200
        assert data_events(read_events(resp))[-1].event.is_done
        assert gw.sim_stats()["streams_abandoned"] == 1
    finally:
        for sock in socks:
            sock.close()
    assert _wait_for(lambda: gw.metric("llmgate_admission_in_flight", kind="requests") == 0)


def test_the_request_limit_refuses_calls_but_never_health_metrics_or_status(make_stack) -> None:
    gw = _one_worker(make_stack)
    rejected_before = gw.metric("llmgate_admission_rejected_total", kind="requests")
    socks = [_open_raw_stream(gw, i) for i in range(N)]
    slow_calls = [
        threading.Thread(
            target=gw.post,
            args=("/v1/chat/completions", chat(max_tokens=2)),
            kwargs={"headers": {"x-sim-ttft-ms": "3000"}},
        )
        for _ in range(2)
    ]
    try:
        for t in slow_calls:
            t.start()
        assert _wait_for(lambda: gw.metric("llmgate_admission_in_flight", kind="requests") == N + 2)
        started = time.monotonic()
        resp = gw.post("/v1/chat/completions", chat(max_tokens=2))
        assert time.monotonic() - started < REFUSAL_BOUND_S
        _assert_refused(resp.status, resp.headers, resp.data, "requests")
        for path in ("/healthz", "/readyz", "/metrics", "/status", "/status.json"):
            assert gw.http.request("GET", gw.url + path).status == 200, path
        assert gw.metric("llmgate_admission_rejected_total", kind="requests") == rejected_before + 1
    finally:
        for sock in socks:
            sock.close()
        for t in slow_calls:
            t.join(30)
    assert _wait_for(lambda: gw.metric("llmgate_admission_in_flight", kind="requests") == 0)
    assert gw.post("/v1/chat/completions", chat(max_tokens=2)).status == 200


def test_nginx_limit_conn_refuses_as_openai_json(make_stack, runs_dir: Path) -> None:
    """nginx's outer guard on its own (a limit of 1, below the app's): the same JSON 429,
    and only API paths are counted."""
    gw = _one_worker(make_stack)
    settings = Settings(max_requests_per_worker=1)
    port = _free_port()
    params = NginxParams.for_settings(
        settings,
        listen=f"127.0.0.1:{port}",
        app_servers=[gw.app_url.removeprefix("http://")],
        app_workers=1,
        worker_processes=1,
        worker_connections=256,
    )
    params = dataclasses.replace(params, conn_limit=1)
    prefix = Path(runs_dir) / f"nginx-limit-{port}"
    nginx = start_nginx(prefix, params, log_path=prefix.parent / f"nginx-limit-{port}.log")
    url = f"http://127.0.0.1:{port}"
    http = urllib3.PoolManager(retries=False)
    try:
        held = http.request(
            "POST",
            url + "/v1/chat/completions",
            body=json.dumps(_stream_body(1)).encode(),
            headers={"Content-Type": "application/json", **SLOW},
            preload_content=False,
        )
        assert held.status == 200
        resp = http.request(
            "POST",
            url + "/v1/chat/completions",
            body=json.dumps(_stream_body(2)).encode(),
            headers={"Content-Type": "application/json", **SLOW},
        )
        assert b"<html" not in resp.data.lower()
        assert resp.headers["content-type"].startswith("application/json")
        _assert_refused(resp.status, resp.headers, resp.data, "")
        assert resp.headers["x-request-id"]
        for path in ("/healthz", "/metrics"):
            assert http.request("GET", url + path).status == 200, path
        assert http.request("GET", url + "/_llmgate_error/429").status == 404  # internal
        assert data_events(read_events(held))[-1].event.is_done
    finally:
        nginx.stop()
    assert gw.sim_stats()["streams_started"] == 1


def _free_port() -> int:
    from runner.procs import free_port

    return free_port()
