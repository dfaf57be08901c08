"""A reset after the request reached the upstream is never retried: it may be generating (and
billing) already. Counted by the simulator itself, through nginx and the gateway."""

from __future__ import annotations

import pytest

from tests.support.bodies import chat


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_reset_after_the_request_was_sent_is_one_upstream_call_and_a_502(gw, stream) -> None:
    resp = gw.post("/v1/chat/completions", chat(stream, max_tokens=5),
                   headers={"x-sim-fault": "reset-before"})  # fmt: skip
    assert resp.status == 502
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.json()["error"]["code"] == "upstream_reset"
    stats = gw.sim_stats()
    assert stats["requests"] == 1, stats  # the gateway's 2 retries were not used


def test_a_connect_failure_is_retried_where_a_reset_is_not(make_stack) -> None:
    """The control: the same retry budget is spent on what cannot have billed."""
    gw = make_stack(env={"LLMGATE_UPSTREAM_URL": "http://127.0.0.1:9/v1", "LLMGATE_RETRIES": "2",
                         "LLMGATE_RETRY_BACKOFF_S": "0.01"}, memcached=False)  # fmt: skip
    resp = gw.post("/v1/chat/completions", chat(False, max_tokens=5))
    assert resp.status == 502
    assert resp.json()["error"]["code"] == "upstream_unreachable"
    assert resp.headers["x-should-retry"] == "false"  # we retried: the SDK must not again
