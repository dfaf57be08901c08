"""Hedged first token through the whole stack, counted by the two simulators.

The primary simulator takes 2 s to its first token, the backup 200 ms; the primary is
configured with ``hedge_after = 300`` (ms). A stream should therefore start near
300 + 200 ms from the backup, and the primary's stream must be abandoned: the simulators'
own counters say which stream was completed and which was cut, not the gateway's.
One gunicorn worker, so the hedge metric read from /metrics is the one that acted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import urllib3

from tests.support.bodies import chat
from tests.support.sim import sim_stats, start_simulator
from tests.support.stack import UPSTREAM, config_stack
from tests.support.waiting import wait_for

http = urllib3.PoolManager(retries=False)

HEDGE_AFTER_S = 0.3
SLOW_TTFT_S = 2.0


@pytest.fixture(scope="module")
def two_speeds(tmp_path_factory) -> Iterator[tuple[str, str]]:
    logs = tmp_path_factory.mktemp("hedge-sims")
    slow, slow_url = start_simulator(logs, "--ttft-ms", str(int(SLOW_TTFT_S * 1000)))
    fast, fast_url = start_simulator(logs, "--ttft-ms", "200")
    yield slow_url, fast_url
    slow.stop()
    fast.stop()


def _hedged(make_stack, tmp_path_factory, two_speeds, **env: str):
    toml = f"""
[[upstreams]]
name = "slow"
base_url = "{two_speeds[0]}/v1"
priority = 0
hedge_after = {int(HEDGE_AFTER_S * 1000)}

[[upstreams]]
name = "fast"
base_url = "{two_speeds[1]}/v1"
priority = 1
"""
    return config_stack(make_stack, tmp_path_factory, toml, **env)


@pytest.fixture(scope="module")
def hedged_gw(make_stack, tmp_path_factory, two_speeds):
    return _hedged(make_stack, tmp_path_factory, two_speeds)


def _reset(*urls: str) -> None:
    for url in urls:
        http.request("POST", url + "/sim/reset")


def _stream(gw, **headers: str) -> tuple[urllib3.BaseHTTPResponse, float, bytes]:
    """The response, the seconds to its first data event, and every byte of the body."""
    started = time.monotonic()
    resp = gw.post("/v1/chat/completions", chat(True, max_tokens=5), headers=headers,
                   preload_content=False)  # fmt: skip
    body, first = b"", None
    while chunk := resp.read1(65536):
        body += chunk
        if first is None and b"data: " in body:
            first = time.monotonic() - started
    resp.release_conn()
    assert first is not None, body
    return resp, first, body


def test_a_late_first_token_is_hedged_and_the_slow_stream_is_closed(hedged_gw, two_speeds) -> None:
    slow, fast = two_speeds
    _reset(slow, fast)
    resp, first, body = _stream(hedged_gw)

    assert resp.status == 200 and resp.headers[UPSTREAM] == "fast"
    assert body.endswith(b"data: [DONE]\n\n")
    # Near 300 + 200 ms: never before the hedge delay plus the backup's TTFT, and well before
    # the 2 s the primary takes (generous: the machine may be busy).
    assert HEDGE_AFTER_S + 0.2 <= first < SLOW_TTFT_S - 0.5, first
    assert sim_stats(fast)["streams_completed"] == 1
    # The primary got its one request and saw it cut, never finished.
    assert wait_for(lambda: sim_stats(slow)["streams_abandoned"] == 1, timeout=5)
    stats = sim_stats(slow)
    assert (stats["requests"], stats["streams_completed"]) == (1, 0)
    assert hedged_gw.metric("llmgate_hedges_total", upstream="slow", winner="backup") == 1
    assert hedged_gw.metric("llmgate_upstream_pool_connections", state="in_use") == 0


def test_a_first_token_in_time_sends_no_backup(hedged_gw, two_speeds) -> None:
    slow, fast = two_speeds
    _reset(slow, fast)
    before = hedged_gw.metric("llmgate_hedges_total", default=0)
    resp, _, body = _stream(hedged_gw, **{"x-sim-ttft-ms": "20"})
    assert resp.headers[UPSTREAM] == "slow" and body.endswith(b"data: [DONE]\n\n")
    assert sim_stats(fast)["requests"] == 0
    assert hedged_gw.metric("llmgate_hedges_total", default=0) == before


def test_calls_that_are_not_streams_are_never_hedged(hedged_gw, two_speeds) -> None:
    slow, fast = two_speeds
    _reset(slow, fast)
    resp = hedged_gw.post("/v1/chat/completions", chat(False, max_tokens=3))
    assert resp.status == 200 and resp.headers[UPSTREAM] == "slow"
    assert sim_stats(fast)["requests"] == 0  # a whole answer is billed in full: no backup


def test_no_backup_is_sent_without_room_in_the_retry_budget(
    make_stack, tmp_path_factory, two_speeds
) -> None:
    """A backup is one more call during trouble, as a retry is: a spent budget sends none."""
    slow, fast = two_speeds
    gw = _hedged(make_stack, tmp_path_factory, two_speeds, LLMGATE_RETRY_BUDGET_PERCENT="0",
                 LLMGATE_RETRY_BUDGET_MIN="0")  # fmt: skip
    _reset(slow, fast)
    exhausted = gw.metric("llmgate_retry_budget_exhausted_total")
    resp, first, body = _stream(gw)
    # The slow stream, waited for in full: the backup the delay called for was never sent.
    assert resp.headers[UPSTREAM] == "slow" and body.endswith(b"data: [DONE]\n\n")
    assert first >= SLOW_TTFT_S - 0.1, first
    assert sim_stats(fast)["requests"] == 0
    assert sim_stats(slow)["streams_completed"] == 1
    assert gw.metric("llmgate_retry_budget_exhausted_total") == exhausted + 1
    assert gw.metric("llmgate_hedges_total", default=0) == 0
