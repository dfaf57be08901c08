"""Retry budgets against real processes: an upstream answering 503 forever, counted by the
simulator.

One gunicorn worker (the budget is per worker) behind nginx, its own simulator. Each caller
marks its body (``user``), so the simulator's request log says how many attempts the gateway
made for each one.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import openai
import pytest

from tests.support.bodies import chat

N = 40  # concurrent callers
PERCENT, MINIMUM, RETRIES = 20, 3, 2  # the defaults
DOWN = {"x-sim-fault": "503", "x-sim-retry-after": "1"}  # retry-after-ms: 1000, every time


@pytest.fixture
def gw(make_stack):
    handle = make_stack(env={"LLMGATE_CACHE_MODE": "off"}, workers=1, memcached=False)
    handle.sim_reset()
    return handle


def _attempts_by_caller(gw) -> Counter[str]:
    return Counter(
        r["body"]["user"] for r in gw.sim_requests() if r["path"].endswith("/chat/completions")
    )


def test_an_outage_does_not_multiply_the_load(gw) -> None:
    exhausted_before = gw.metric("llmgate_retry_budget_exhausted_total")
    barrier = threading.Barrier(N)
    answers: list[tuple[int, dict]] = [(0, {})] * N

    def one(i: int) -> None:
        barrier.wait()
        resp = gw.post("/v1/chat/completions", chat(max_tokens=3, user=f"c{i}"), headers=DOWN)
        answers[i] = (resp.status, dict(resp.headers))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    total = gw.sim_stats()["requests"]
    attempts = _attempts_by_caller(gw)
    exhausted = gw.metric("llmgate_retry_budget_exhausted_total") - exhausted_before
    spread = sorted(Counter(attempts.values()).items())
    print(f"\n{N} callers: {total} upstream calls, (attempts, callers) {spread}")
    # Without the budget: 3N. The budget allows max(min, 20 % of N) retries in flight; a
    # request asks again for its second retry, so a few get two (generous bound).
    assert total <= N + RETRIES * max(MINIMUM, PERCENT * N // 100), total
    assert total > N  # some were retried: the budget is a share, not a ban
    assert sum(attempts.values()) == total and len(attempts) == N
    for i, (status, headers) in enumerate(answers):
        assert status == 503, (i, status)
        made = attempts[f"c{i}"]
        assert (headers.get("x-should-retry") == "false") == (made > 1), (i, made, headers)
    # Each caller stopped before its third attempt was stopped by the budget, once.
    assert exhausted == sum(1 for a in attempts.values() if a < 1 + RETRIES)


def test_the_sdk_makes_no_call_of_its_own_after_the_gateway_retried(gw) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=2)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(**chat(max_tokens=3, user="sdk"), extra_headers=DOWN)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["x-should-retry"] == "false"
    # One SDK call: the gateway's three attempts, and no SDK retry on top (it would be 9).
    calls = [r for r in gw.sim_requests() if r["body"]["user"] == "sdk"]
    assert len(calls) == 1 + RETRIES
    assert [c["headers"].get("x-stainless-retry-count") for c in calls] == ["0"] * 3


@pytest.mark.parametrize(("count", "upstream_calls"), [("2", 1), ("1", 2), ("x", 3)])
def test_a_caller_already_retrying_gets_fewer_gateway_retries(gw, count, upstream_calls) -> None:
    headers = {**DOWN, "x-sim-retry-after": "0.05", "X-Stainless-Retry-Count": count}
    resp = gw.post("/v1/chat/completions", chat(max_tokens=3, user="own"), headers=headers)
    assert resp.status == 503
    assert json.loads(resp.data)["error"]["type"] == "server_error"
    assert gw.sim_stats()["requests"] == upstream_calls
    # Only a gateway that retried says not to; otherwise the caller's SDK decides.
    assert ("x-should-retry" in resp.headers) == (upstream_calls > 1)
