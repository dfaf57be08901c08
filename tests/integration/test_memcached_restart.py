"""A Memcached node restarted, or gone and back, under a running gateway (real nginx,
gunicorn, simulator and memcached): what the callers, the node, the metrics and the log see.

A restarted node leaves every pooled connection to its old process closed (CLOSE-WAIT on
the gateway's side). The first command on one of them finds it dropped: the worker closes
the node's idle connections, a read runs again at once on a new one, and the log says so
once. Before, each stale connection cost a failure and skipped the node for
LLMGATE_MEMCACHED_RETRY_S, one after another, for minutes; the lines said nothing at a level
the gateway prints. What is stored is read from the new node's own mouth, not through the
gateway's client.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.cache.keys import PREFIX
from runner.stack import Stack, StackOptions
from tests.conftest import require_binary
from tests.support.memcached import (
    memcached_keys,
    memcached_stats,
    start_stack_memcached,
    stop_stack_memcached,
)
from tests.support.stack import StackHandle
from tests.support.waiting import wait_for

CONCURRENT = 16  # calls at once: as many pooled connections to the node (at most)
RETRY_S = 1  # LLMGATE_MEMCACHED_RETRY_S: how long a failed node is skipped


@pytest.fixture
def gw(runs_dir: Path, request: pytest.FixtureRequest) -> Iterator[StackHandle]:
    require_binary("nginx")
    require_binary("memcached")
    env = {"LLMGATE_CACHE_MODE": "all", "LLMGATE_MEMCACHED_RETRY_S": str(RETRY_S)}
    run_dir = runs_dir / f"memcached-restart-{request.node.name}"
    stack = Stack(StackOptions(run_dir=run_dir, workers=1, env=env)).start()
    yield StackHandle(stack)
    stack.stop(graceful=False)


def _call(gw: StackHandle, text: str) -> str:
    body = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    resp = gw.post("/v1/chat/completions", body)
    assert resp.status == 200, resp.data
    return str(resp.headers.get("X-LLMGate-Cache"))


def _stored(port: int) -> int:
    """Answers the node holds (leases aside), as it says."""
    return len([k for k in memcached_keys(port, PREFIX) if not k.endswith(":lease")])


def _events(gw: StackHandle, event: str) -> float:
    return gw.metric("llmgate_memcached_node_events_total", default=0, client="l2", event=event)


def _lines(gw: StackHandle, text: str) -> list[str]:
    return [line for line in gw.log("gunicorn").splitlines() if text in line]


def test_a_restarted_node_costs_no_failed_call_and_is_said_once(gw: StackHandle) -> None:
    port = int(gw.stack.memcached_addr.rsplit(":", 1)[1])
    alone = memcached_stats(port)["curr_connections"]
    with ThreadPoolExecutor(CONCURRENT) as pool:
        list(pool.map(lambda n: _call(gw, f"before {n}"), range(4 * CONCURRENT)))
    # Several connections in the worker's pool, each left stale by the restart.
    assert memcached_stats(port)["curr_connections"] - alone >= 4
    stop_stack_memcached(gw.stack)
    start_stack_memcached(gw.stack, port)
    node = f"127.0.0.1:{port}"

    with ThreadPoolExecutor(CONCURRENT) as pool:
        burst = list(pool.map(lambda n: _call(gw, f"after {n}"), range(CONCURRENT)))
    for n in range(CONCURRENT):
        burst.append(_call(gw, f"one by one {n}"))
    assert burst == ["MISS"] * 2 * CONCURRENT
    # Every answer reached the new node: no call found the node skipped or a write failed.
    assert wait_for(lambda: _stored(port) == 2 * CONCURRENT), _stored(port)
    assert gw.metric("llmgate_cache_errors_total") == 0
    assert _events(gw, "dropped") == 1 and _events(gw, "failed") == 0
    (said,) = _lines(gw, f"memcached node {node} closed our connections")
    assert "restarted?" in said, said
    assert _lines(gw, "skipping it") == []
    assert memcached_stats(port)["cmd_get"] >= 2 * CONCURRENT  # the reads reached it too


def test_a_node_gone_then_back_is_said_and_counted_once_each_way(gw: StackHandle) -> None:
    for n in range(4):
        _call(gw, f"before {n}")
    port = stop_stack_memcached(gw.stack)
    node = f"127.0.0.1:{port}"
    for n in range(6):
        assert _call(gw, f"while down {n}") == "MISS"
    (failed,) = _lines(gw, f"memcached node {node} failed (")
    assert failed.endswith("; skipping it"), failed
    assert _events(gw, "failed") == 1
    assert gw.metric("llmgate_cache_errors_total") >= 1  # the calls that found it gone

    start_stack_memcached(gw.stack, port)
    calls = iter(range(1000))
    # Skipped for RETRY_S, then one call probes it and finds it back.
    assert wait_for(lambda: _call(gw, f"back {next(calls)}") and _stored(port) >= 1, RETRY_S + 10)
    assert _lines(gw, f"memcached node {node} is back") != []
    for n in range(4):
        _call(gw, f"after {n}")
    assert len(_lines(gw, f"memcached node {node} is back")) == 1
    assert len(_lines(gw, f"memcached node {node} failed (")) == 1
    assert _events(gw, "back") == 1 and _events(gw, "failed") == 1
