"""Metrics aggregated over gunicorn workers, request ids, Server-Timing and safe logs."""

from __future__ import annotations

import json
import socket
import time
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.bodies import chat_about
from tests.support.sse_reader import data_events, read_events

SECRET_KEY = "sk-SECRET-TEST-KEY-0123456789"


def scrape(gw) -> dict[tuple[str, tuple], float]:
    text = gw.http.request("GET", gw.url + "/metrics").data.decode()
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def total(samples: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def chat(prompt: str, *, stream: bool = False, temperature: float = 0, **extra) -> dict:
    return chat_about(
        prompt, **{"temperature": temperature, "stream": stream, "max_tokens": 4, **extra}
    )


def _wait_total(gw, expected: float, timeout: float = 10.0) -> dict:
    """A scrape that has every request's figures. prometheus_client reads the workers' files
    one after another, in no set order: a scrape may read the histograms' file before a
    request's end and the counters' after it, so the request is counted but not yet timed.
    Both must be in."""
    end = time.monotonic() + timeout
    while True:
        samples = scrape(gw)
        counts = [total(samples, name) for name in
                  ("llmgate_requests_total", "llmgate_request_duration_seconds_count")]  # fmt: skip
        if min(counts) >= expected or time.monotonic() > end:
            return samples
        time.sleep(0.1)


def test_counters_equal_a_known_mix_whatever_worker_served_it(make_stack) -> None:
    gw = make_stack(env={"LLMGATE_HEARTBEAT_S": "14"})  # a stack of its own: fresh counters
    auth = {"Authorization": "Bearer sk-mix"}
    prompts = [f"mix {i} {uuid.uuid4().hex}" for i in range(3)]
    for prompt in prompts:  # 3 misses
        assert gw.post("/v1/chat/completions", chat(prompt), headers=auth).status == 200
    for prompt in prompts[:2]:  # 2 hits (L1 or L2, whichever worker)
        resp = gw.post("/v1/chat/completions", chat(prompt), headers=auth)
        assert resp.headers["X-LLMGate-Cache"].startswith("HIT")
    for _ in range(2):  # 2 streams, not cacheable
        resp = gw.post("/v1/chat/completions", chat("s", stream=True, temperature=0.7))
        assert resp.data.endswith(b"data: [DONE]\n\n")
    upstream_500 = gw.post(
        "/v1/chat/completions", chat("e", temperature=0.7), headers={"x-sim-fault": "500"}
    )
    assert upstream_500.status == 500
    assert gw.post("/v1/chat/completions", b"{broken").status == 400
    assert gw.post("/v1/embeddings", {"model": "m", "input": "x"}).status == 200  # 1 miss
    # A caller that leaves mid-stream.
    payload = json.dumps(chat("leave", stream=True, temperature=0.7, max_tokens=100)).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nx-sim-tps: 5\r\nx-sim-ttft-ms: 0\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )
        seen = b""
        while b"data: " not in seen:
            seen += sock.recv(65536)

    samples = _wait_total(gw, 11)
    req = "llmgate_requests_total"
    assert total(samples, req) == 11
    assert total(samples, req, route="chat", status="200", cache="miss") == 3
    assert (
        total(samples, req, route="chat", status="200", cache="hit_l1")
        + total(samples, req, route="chat", status="200", cache="hit_l2")
    ) == 2
    assert total(samples, req, route="chat", status="200", cache="bypass") == 3
    assert total(samples, req, route="chat", status="500", cache="bypass") == 1
    assert total(samples, req, route="chat", status="400", cache="bypass") == 1
    assert total(samples, req, route="embeddings", status="200", cache="miss") == 1
    errors = "llmgate_upstream_errors_total"
    assert total(samples, errors, cause="server") == 1
    assert total(samples, errors, cause="client_closed") == 1
    assert total(samples, errors) == 2
    cache = "llmgate_cache_requests_total"
    assert total(samples, cache, outcome="miss") == 4
    assert total(samples, cache, outcome="bypass") == 5
    assert total(samples, "llmgate_request_duration_seconds_count") == 11
    assert total(samples, "llmgate_ttft_seconds_count") == 3  # streams that got data
    assert total(samples, "llmgate_active_streams") == 0
    assert total(samples, "llmgate_cache_stored_bytes_total") > 0
    status = gw.http.request("GET", gw.url + "/status.json").json()
    assert status["requests"]["total"] == 11
    assert status["errors"]["client_closed"] == 1
    assert status["cache"]["miss"] == 4


def test_ttft_histogram_puts_a_known_ttft_in_its_bucket(make_stack) -> None:
    gw = make_stack(env={"LLMGATE_HEARTBEAT_S": "13"})
    before = scrape(gw)
    resp = gw.post(
        "/v1/chat/completions",
        chat("t", stream=True, temperature=0.5),
        headers={"x-sim-ttft-ms": "700"},
    )
    assert resp.status == 200
    after = _wait_total(gw, total(before, "llmgate_requests_total") + 1)

    def delta(name: str, le: str) -> float:
        return total(after, name, route="chat", le=le) - total(before, name, route="chat", le=le)

    for name in ("llmgate_ttft_seconds_bucket", "llmgate_upstream_ttft_seconds_bucket"):
        assert delta(name, "0.5") == 0, name  # 700 ms is not under 0.5 s
        assert delta(name, "1.0") == 1, name  # but is under 1 s
        assert delta(name, "+Inf") == 1, name


@pytest.mark.slow
def test_connections_opened_stay_flat_under_steady_load(make_stack) -> None:
    gw = make_stack(env={"LLMGATE_HEARTBEAT_S": "12"})
    for i in range(20):  # warm both workers' pools
        gw.post("/v1/chat/completions", chat(f"warm {i}", temperature=0.5))
    opened = total(scrape(gw), "llmgate_upstream_connections_opened_total")
    assert 1 <= opened <= 2 * 2
    for i in range(300):
        assert gw.post("/v1/chat/completions", chat(f"steady {i}", temperature=0.5)).status == 200
    samples = scrape(gw)
    assert total(samples, "llmgate_upstream_connections_opened_total") == opened
    assert total(samples, "llmgate_upstream_pool_connections", state="in_use") == 0
    assert total(samples, "llmgate_upstream_pool_connections", state="idle") >= 1


def test_request_ids_and_server_timing(gw) -> None:
    mine = gw.post(
        "/v1/chat/completions",
        chat("ids", temperature=0.5),
        headers={"X-Request-ID": "caller-id-42"},
    )
    assert mine.headers["X-LLMGate-Request-ID"] == "caller-id-42"
    assert mine.headers["x-request-id"].startswith("req_")  # the upstream's own, kept
    # The stages the call had (docs/observability.md): an uncached call has no cache stage.
    timing = mine.headers["Server-Timing"]
    assert "upstream;dur=" in timing and "gateway;dur=" in timing and "work;dur=" in timing
    assert "cache;dur=" not in timing
    generated = gw.post("/v1/chat/completions", b"{bad")
    assert len(generated.headers["X-LLMGate-Request-ID"]) >= 16
    assert generated.headers["X-Request-ID"] == generated.headers["X-LLMGate-Request-ID"]
    access = (gw.stack.options.run_dir / "nginx" / "logs" / "access.log").read_text()
    line = json.loads([ln for ln in access.splitlines() if "caller-id-42" in ln][-1])
    assert line["request_id"] == "caller-id-42" and line["upstream_response_time"]


@pytest.mark.parametrize("log_prompts", [False, True])
def test_logs_never_hold_the_credential_and_prompts_only_when_enabled(make_stack, log_prompts):
    env = {"LLMGATE_LOG_PROMPTS": "1" if log_prompts else "0", "LLMGATE_ACCESS_LOG": "-"}
    gw = make_stack(env=env)
    prompt = f"PROMPT-SENTINEL-{uuid.uuid4().hex}"
    auth = {"Authorization": f"Bearer {SECRET_KEY}", "X-Request-ID": f"log-{prompt[-8:]}"}
    gw.post("/v1/chat/completions", chat(prompt), headers=auth)
    gw.post("/v1/chat/completions", chat(prompt, stream=True), headers=auth)
    gw.post(
        "/v1/chat/completions",
        chat(prompt, temperature=0.5),
        headers={**auth, "x-sim-fault": "500"},
    )
    gw.post("/v1/chat/completions", b'{"model": "' + prompt.encode(), headers=auth)
    time.sleep(0.3)
    logs = gw.log("gunicorn") + gw.log("nginx")
    logs += (gw.stack.options.run_dir / "nginx" / "logs" / "access.log").read_text()
    assert SECRET_KEY not in logs
    assert SECRET_KEY[3:] not in logs
    assert (prompt in logs) is log_prompts
    mine = [ln for ln in gw.log_records() if ln.get("request_id") == f"log-{prompt[-8:]}"]
    assert len(mine) == 4
    first = mine[0]
    for field in (
        "route",
        "model",
        "status",
        "cache",
        "ttft_ms",
        "duration_ms",
        "tokens_in",
        "tokens_out",
        "attempts",
        "bytes_out",
        "client_closed",
    ):
        assert field in first
    assert first["tokens_out"] == 4 and first["status"] == 200


def test_metrics_endpoint_is_prometheus_text(gw) -> None:
    events = data_events(
        read_events(gw.post("/v1/chat/completions", chat("x", stream=True), preload_content=False))
    )
    assert events[-1].event.is_done
    resp = gw.http.request("GET", gw.url + "/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(resp.data.decode())}
    assert {"llmgate_requests", "llmgate_ttft_seconds", "llmgate_active_streams"} <= names


def test_with_request_lines_off_no_line_is_written_and_the_metrics_still_count(make_stack):
    # LLMGATE_LOG_REQUESTS=false (the benchmark's features-off row): not one JSON line per
    # request, while the metrics and nginx's access log still see every call.
    gw = make_stack(env={"LLMGATE_LOG_REQUESTS": "false"}, memcached=False)
    ids = [f"quiet-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    gw.post("/v1/chat/completions", chat("a"), headers={"X-Request-ID": ids[0]})
    gw.post("/v1/chat/completions", chat("b", stream=True), headers={"X-Request-ID": ids[1]})
    gw.post("/v1/chat/completions", b"{", headers={"X-Request-ID": ids[2]})
    time.sleep(0.3)
    assert [ln for ln in gw.log_records() if ln.get("request_id") in ids] == []
    counted = gw.http.request("GET", gw.url + "/metrics").data.decode()
    assert 'route="chat",status="200"} 2.0' in counted and 'status="400"} 1.0' in counted
    access = (gw.stack.options.run_dir / "nginx" / "logs" / "access.log").read_text()
    assert all(i in access for i in ids)
