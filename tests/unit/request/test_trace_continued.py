"""A continuation's facts (app/request/call.py ``Trace.continued``): each try in the log
line's ``continuations``, and an event on the request's span, as the OTLP exporter gets it."""

from __future__ import annotations

import time

from app.core.config import Settings
from app.observe.tracing import Value
from app.request.call import Trace
from tests.support.otlp import SpansKept

FACT: dict[str, Value] = {
    "upstream": "first",
    "cut": "upstream_reset",
    "after_events": 5,
    "after_chars": 25,
    "outcome": "continued",
    "to": "second",
}


def test_each_try_is_kept_for_the_log_line_without_its_empty_facts() -> None:
    trace = Trace()
    trace.continued(FACT)
    trace.continued({**FACT, "outcome": "no_budget", "to": None})
    assert trace.continuations == [FACT, {k: v for k, v in FACT.items() if k != "to"} | {
        "outcome": "no_budget"}]  # fmt: skip


def test_each_try_is_an_event_on_the_request_span(monkeypatch) -> None:
    from app.observe.otel import build_tracer

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves before shutdown
    exporter = SpansKept()
    tracer = build_tracer(Settings(otel_endpoint="http://127.0.0.1:9/v1/traces"), exporter)
    span = tracer.request("chat m", [], start=time.monotonic(), attributes={})
    Trace(span=span).continued(FACT)
    span.end()
    tracer.shutdown()
    (event,) = exporter.spans[0].events
    assert event.name == "continuation"
    assert dict(event.attributes) == {f"llmgate.continuation.{k}": v for k, v in FACT.items()}
