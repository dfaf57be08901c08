"""Pooled keep-alive upstream connections and what crosses to the upstream."""

from __future__ import annotations

import pytest
import urllib3

from tests.support.bodies import chat
from tests.support.calls import round_of_streams


@pytest.mark.slow
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


@pytest.fixture(scope="module")
def one_worker(make_stack):
    """One gunicorn worker: every stream lands on the same pool, whose size is the question."""
    return make_stack(workers=1, env={"LLMGATE_CACHE_MODE": "off"})


@pytest.mark.slow
def test_steady_load_of_200_streams_opens_no_new_connections(one_worker) -> None:
    gw, callers = one_worker, 200
    http = urllib3.PoolManager(maxsize=callers, retries=False)
    # The pool fills up in the first round; on a busy machine the 200 may not all overlap
    # at first, so up to two more warm-up rounds, until one opens no connection.
    for _ in range(3):
        gw.sim_reset()  # zeroes the simulator's accept count; pooled connections stay open
        assert set(round_of_streams(gw, http, callers)) == {200}
        if gw.sim_stats()["connections_accepted"] == 0:
            break
    gw.sim_reset()
    for _ in range(5):
        assert set(round_of_streams(gw, http, callers)) == {200}
    stats = gw.sim_stats()
    assert stats["requests"] == 5 * callers
    # 1,000 streams, 200 at a time (a 1 s TTFT keeps all 200 of a round overlapping, on a
    # busy machine too, so the first round fills the pool to 200), each on a
    # connection the worker kept from the first round: not one new one, by the simulator's
    # own count. A pool smaller than the worker's concurrency opens and throws away the rest.
    assert stats["connections_accepted"] == 0, stats


def test_a_worker_opens_spare_connections_ahead_of_a_busier_moment(make_stack) -> None:
    gw = make_stack(workers=1, env={"LLMGATE_CACHE_MODE": "off", "LLMGATE_POOL_SPARE_RATIO": "0.5"})
    http = urllib3.PoolManager(maxsize=40, retries=False)
    gw.sim_reset()
    assert set(round_of_streams(gw, http, 10)) == {200}
    # 10 streams at once, each needing a connection: spares were opened behind them. A
    # spare opened while the burst was still arriving is taken by a later caller of it (that
    # is what it is for), so the round may end with none left over: the metric below counts
    # them either way.
    stats = gw.sim_stats()
    opened = stats["connections_accepted"]
    assert 10 <= opened <= 15, stats  # at most half the connections in use, on top
    assert stats["connections_open"] == opened  # all kept
    # The worker's own counts agree: every connection the simulator saw, of which the spares
    # are those no call opened on its way (one each at most).
    spares = gw.metric("llmgate_upstream_connections_spare_total")
    assert gw.metric("llmgate_upstream_connections_opened_total") == opened
    assert spares > 0 and opened - spares <= 10
    # A busier moment, as many streams as there are connections: all found one ready.
    gw.sim_reset()
    assert set(round_of_streams(gw, http, opened)) == {200}
    assert gw.sim_stats()["connections_accepted"] == 0


def test_spare_connections_stay_within_the_pool_size(make_stack) -> None:
    gw = make_stack(
        workers=1,
        env={
            "LLMGATE_CACHE_MODE": "off",
            "LLMGATE_POOL_SPARE_RATIO": "1",
            "LLMGATE_POOL_SIZE": "12",
        },
    )
    http = urllib3.PoolManager(maxsize=40, retries=False)
    gw.sim_reset()
    assert set(round_of_streams(gw, http, 10)) == {200}
    stats = gw.sim_stats()
    # Ten spares wanted, two free places in a pool of 12.
    assert stats["connections_accepted"] == stats["connections_open"] == 12, stats
