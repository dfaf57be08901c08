"""Pooled keep-alive upstream connections and what crosses to the upstream."""

from __future__ import annotations

import pytest

from tests.integration.sse_reader import chat


def test_1000_sequential_requests_reuse_one_connection_per_worker(gw) -> None:
    workers = gw.stack.options.workers
    for i in range(1000):
        stream = i % 4 == 0
        resp = gw.post(
            "/v1/chat/completions", chat(stream, max_tokens=2), headers={"x-sim-ttft-ms": "0"}
        )
        assert resp.status == 200
    stats = gw.sim_stats()
    assert stats["requests"] == 1000
    # Reset zeroed the counter with the pooled connections already open: any new
    # connection would show here. A pool per worker, one keep-alive connection each.
    assert stats["connections_accepted"] <= workers, stats


def test_caller_headers_reach_the_upstream_and_ours_do_not(gw) -> None:
    resp = gw.post(
        "/v1/chat/completions",
        chat(True),
        headers={
            "Authorization": "Bearer sk-caller",
            "OpenAI-Organization": "org-9",
            "OpenAI-Project": "proj-9",
            "X-Forwarded-For": "203.0.113.9",
            "Cookie": "s=1",
            "x-stainless-retry-count": "0",
        },
    )
    assert resp.status == 200
    seen = gw.sim_requests()[-1]["headers"]
    assert seen["authorization"] == "Bearer sk-caller"
    assert seen["openai-organization"] == "org-9"
    assert seen["openai-project"] == "proj-9"
    assert seen["x-stainless-retry-count"] == "0"
    assert seen["accept-encoding"] == "identity"  # a stream never asks for gzip
    for private in ("x-forwarded-for", "cookie", "x-real-ip"):
        assert private not in seen
    # nginx's request id travels on, so upstream logs (vLLM uses it) can be correlated.
    assert seen["x-request-id"]


def test_passthrough_keeps_method_path_query_and_body(gw) -> None:
    resp = gw.http.request("GET", gw.url + "/v1/models/sim-model?limit=3&after=x")
    assert resp.status == 200
    seen = gw.sim_requests()[-1]
    assert (seen["method"], seen["path"], seen["query"]) == (
        "GET",
        "/v1/models/sim-model",
        "limit=3&after=x",
    )


@pytest.mark.parametrize("caller_key", [None, "Bearer sk-caller"])
def test_server_key_fills_in_only_for_callers_without_one(make_stack, caller_key) -> None:
    gw = make_stack(env={"LLMGATE_UPSTREAM_API_KEY": "sk-server"}, memcached=False)
    headers = {"Authorization": caller_key} if caller_key else {}
    assert gw.post("/v1/chat/completions", chat(), headers=headers).status == 200
    seen = gw.sim_requests()[-1]["headers"]
    assert seen["authorization"] == (caller_key or "Bearer sk-server")


def test_provider_headers_come_back(gw) -> None:
    resp = gw.post("/v1/chat/completions", chat())
    direct = gw.post("/v1/chat/completions", chat(), base=gw.sim_url)
    for name in direct.headers:
        if name.lower().startswith(("x-request-id", "openai-", "x-ratelimit-")):
            assert name in resp.headers, name


def test_without_nginx_gunicorn_serves_the_public_port(make_stack) -> None:
    # What `make run` does on a machine without nginx.
    gw = make_stack(nginx=False, memcached=False)
    assert gw.url == gw.app_url
    resp = gw.post("/v1/chat/completions", chat(True, max_tokens=2))
    assert resp.status == 200 and resp.data.endswith(b"data: [DONE]\n\n")


def test_retried_429s_keep_their_connection(gw) -> None:
    for _ in range(3):  # warm both workers' pools
        gw.post("/v1/chat/completions", chat())
    gw.sim_reset()
    for i in range(10):
        resp = gw.post(
            "/v1/chat/completions",
            chat(),
            headers={
                "x-sim-fault": "429",
                "x-sim-retry-after": "0.01",
                "x-sim-fail-times": "2",
                "x-sim-fail-key": f"keep-{i}",
            },
        )
        assert resp.status == 200
    stats = gw.sim_stats()
    assert stats["requests"] == 30  # two 429s and a success each
    assert stats["connections_accepted"] == 0  # every retry reused its connection
