"""Span exports off the request path (app/observe/outbox.py): a collector that accepts connections
and never answers holds no call and no worker's exit, and the spans it cannot take are
dropped and counted; the spans a worker still holds when it stops are sent before it exits.

Real nginx, one gunicorn gevent worker (its export queue is the only one), the simulator;
the collectors are tests/support/otlp.py's. Embeddings calls with distinct inputs: each is a
miss with three spans (the request, its cache lookup, its upstream attempt).
"""

from __future__ import annotations

import secrets
import time
import uuid

import pytest
import urllib3

from runner.drain import drain
from tests.support.otlp import BlackHole, OtlpReceiver
from tests.support.waiting import wait_for

SPANS_PER_CALL = 3
QUEUE, BATCH = 8, 4
# Exports every 50 ms into a small queue; an export waits two minutes for its answer.
BLACK_HOLED = {
    "OTEL_BSP_SCHEDULE_DELAY": "50",
    "OTEL_BSP_MAX_QUEUE_SIZE": str(QUEUE),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": str(BATCH),
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "120",
}
EXIT_BOUND_S = 30  # the flush's own 5 s (app/observe/otel.py, FLUSH_S) and the drain's, generously


def _embed(gw, text: str, headers: dict[str, str] | None = None) -> None:
    resp = gw.post(
        "/v1/embeddings",
        {"model": "sim-model", "input": f"{text} {uuid.uuid4().hex}"},
        headers=headers or {},
        timeout=urllib3.Timeout(connect=5, read=10),  # a call held by the export times out
    )
    assert resp.status == 200, resp.data[:300]


@pytest.mark.slow
def test_a_black_holed_collector_holds_no_call_and_no_exit(make_stack) -> None:
    """With exports inside the call (the SDK's SimpleSpanProcessor) the first call waits
    for the collector's answer and times out; unbounded, the exit waits two minutes."""
    calls = 30
    with BlackHole() as hole:
        gw = make_stack(
            workers=1, memcached=False, env={"LLMGATE_OTEL_ENDPOINT": hole.url, **BLACK_HOLED}
        )
        for i in range(calls):
            _embed(gw, f"black hole {i}")
        # The export was made (and hangs) while the calls went on.
        assert wait_for(lambda: hole.connections >= 1 and hole.received > 0, timeout=10)
        # One batch hangs in the export, the queue filled up behind it, the rest was dropped.
        dropped = gw.metric("llmgate_trace_spans_dropped_total")
        ended = calls * SPANS_PER_CALL
        assert ended - QUEUE - BATCH <= dropped <= ended - QUEUE - 1, dropped
        began = time.monotonic()
        drain(gw.stack, grace_s=120, delay_s=0, say=lambda _: None)
        took = time.monotonic() - began
    assert took < EXIT_BOUND_S, took


def test_a_stopping_worker_sends_the_spans_it_holds(make_stack) -> None:
    """Batches leave every 10 minutes here: only the worker's exit sends the call's spans."""
    trace_id = secrets.token_hex(16)
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    with OtlpReceiver() as receiver:
        env = {"LLMGATE_OTEL_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "600000"}
        gw = make_stack(workers=1, memcached=False, env=env)
        _embed(gw, "flushed at exit", {"traceparent": traceparent})
        assert receiver.trace(trace_id) == []  # still queued in the worker
        began = time.monotonic()
        drain(gw.stack, grace_s=120, delay_s=0, say=lambda _: None)
        took = time.monotonic() - began
        spans = receiver.wait_for(trace_id, SPANS_PER_CALL, timeout=5)
    assert sorted(s.kind for s in spans) == ["client", "internal", "server"]
    assert took < EXIT_BOUND_S, took
