"""Tracing: off, OpenTelemetry is never imported; on, every upstream attempt is its own span
sent under its own traceparent (a recording span, no sockets); what goes into a span."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from typing import Any

from app.core.config import Settings
from app.core.errors import UpstreamUnreachable
from app.observe import tracing
from app.observe.metrics import Metrics
from app.request import routes
from app.upstream.catalog import UpstreamSpec
from app.upstream.exchange import Upstream, UpstreamRequest
from app.upstream.retry import Deadline
from app.upstream.transport import Transport
from tests.conftest import ROOT
from tests.support.otlp import SpansKept

# -- off: nothing imported -----------------------------------------------------------------

_USE_THE_GATEWAY = """
import sys
from app.factory import create_app
app = create_app()
client = app.test_client()
for stream in (False, True):
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    resp = client.post("/v1/chat/completions", json=body)
    resp.get_data()
    assert resp.status_code in (200, 502), resp.status_code
client.get("/v1/models").get_data()
print(sorted({m.split(".")[0] for m in sys.modules} & {"opentelemetry", "google"}))
"""


def _run(**env: str) -> str:
    return _python(_USE_THE_GATEWAY, **env)


def _python(script: str, **env: str) -> str:
    """The last line ``script`` printed, run by a fresh interpreter with ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGATE_", "OTEL_"))}
    environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    environ.update(
        PYTHONPATH=str(ROOT),
        LLMGATE_UPSTREAM_URL="http://127.0.0.1:9/v1",  # refused at once: a 502
        LLMGATE_RETRIES="0",
        **env,
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_without_an_endpoint_the_gateway_never_imports_opentelemetry() -> None:
    assert _run() == "[]"
    # The same calls with tracing on do import it: the check above can see an import.
    assert (
        _run(
            LLMGATE_OTEL_ENDPOINT="http://127.0.0.1:9/v1/traces",
            OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="0.5",
            OTEL_BSP_EXPORT_TIMEOUT="500",
        )
        == "['google', 'opentelemetry']"
    )


# -- on: the export runs off the worker's loop ---------------------------------------------

_EXPORT_UNDER_GEVENT = """
from gevent import monkey
monkey.patch_all()
import time
import gevent
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from app.core.config import Settings
from app.observe.otel import build_tracer
from app.request import routes

class Busy(SpanExporter):
    # Holds the CPU for a second per export, as encoding a huge batch would.
    def __init__(self):
        self.runs = []
    def export(self, spans):
        began = time.perf_counter()
        while time.perf_counter() - began < 1.0:
            pass
        self.runs.append((began, time.perf_counter()))
        return SpanExportResult.SUCCESS

exporter = Busy()
tracer = build_tracer(Settings(otel_endpoint="http://127.0.0.1:9/v1/traces"), exporter)
ticks = []
def tick():
    while True:
        ticks.append(time.perf_counter())
        gevent.sleep(0.01)
gevent.spawn(tick)
gevent.sleep(0.05)
tracer.request("chat m", [], start=time.monotonic(), attributes={}).end()
while not exporter.runs:
    gevent.sleep(0.05)
began, ended = exporter.runs[0]
print(sum(began < t < ended for t in ticks))
"""


def test_the_export_runs_off_the_gevent_loop() -> None:
    """A greenlet ticking every 10 ms keeps ticking while an export burns a second of CPU:
    the export runs in a thread of its own, which takes the GIL in turns with the loop. On
    the loop (the SDK's BatchSpanProcessor, whose thread is a greenlet under gevent, or its
    SimpleSpanProcessor, which exports inside ``span.end()``) the ticker would stop."""
    ticks = int(_python(_EXPORT_UNDER_GEVENT, OTEL_BSP_SCHEDULE_DELAY="20"))
    assert ticks >= 20, ticks  # ~50-100 when the loop runs; 0 when the export holds it


def test_a_queued_span_is_a_few_objects_for_the_garbage_collector(monkeypatch) -> None:
    """A queued span waits seconds (with a silent collector, 2,048 of them wait), long enough
    to reach the generation every full collection walks while the worker stands still: it
    waits as a plain ``ReadableSpan`` of a few objects, not as the SDK's live span (15 to 20
    tracked objects each)."""

    from app.observe.otel import build_tracer

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves before shutdown
    exporter = SpansKept()
    tracer = build_tracer(Settings(otel_endpoint="http://127.0.0.1:9/v1/traces"), exporter)
    headers = [("traceparent", f"00-{'a' * 32}-{'b' * 16}-01")]
    attributes: dict[str, tracing.Value] = {"llmgate.route": "chat", "url.path": "/v1/chat", "n": 1}
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(100):
        span = tracer.request("chat m", headers, start=time.monotonic(), attributes=attributes)
        span.child("chat m", kind=tracing.CLIENT, attributes={"server.port": 443}).end()
        span.set({"http.response.status_code": 200})
        span.end()
    gc.collect()
    per_span = (len(gc.get_objects()) - before) / 200
    tracer.shutdown()
    assert per_span <= 6, per_span  # 4 measured; the live spans were 15
    # Nothing lost on the way: the exported copies carry what the spans were given.
    assert len(exporter.spans) == 200
    request = next(s for s in exporter.spans if s.parent.span_id == int("b" * 16, 16))
    assert request.attributes == {**attributes, "http.response.status_code": 200}


def test_a_calls_spans_are_recorded_without_checking_each_attribute(monkeypatch) -> None:
    """The SDK's live span checks each attribute as it is set, behind its locks: two thirds of
    the CPU tracing added to a call under gevent's patch, and the black hole's p99.9 excess
    over off followed that CPU. A span is recorded in plain fields and handed over as one
    ``ReadableSpan`` at its end: no attribute goes through the SDK's checks on the way."""
    from opentelemetry import attributes as sdk_attributes

    from app.observe.otel import build_tracer

    checked: list[Any] = []
    check = sdk_attributes._clean_attribute_value

    def counted(value: Any, *args: Any) -> Any:
        checked.append(value)
        return check(value, *args)

    exporter = SpansKept()
    tracer = build_tracer(Settings(otel_endpoint="http://127.0.0.1:9/v1/traces"), exporter)
    monkeypatch.setattr(sdk_attributes, "_clean_attribute_value", counted)  # once it is built
    now = time.monotonic()
    span = tracer.request("chat m", [], start=now, attributes={"llmgate.route": "chat"})
    span.set({"gen_ai.request.model": "m", "gen_ai.request.max_tokens": 16})
    attempt = span.child("chat m", kind=tracing.CLIENT, attributes={"server.port": 443})
    attempt.event("first_event", {"n": 1}, at=now)
    attempt.end(error="500")
    span.end()
    tracer.shutdown()
    assert checked == []
    request = next(s for s in exporter.spans if s.parent is None)
    assert dict(request.attributes) == {
        "llmgate.route": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.request.max_tokens": 16,
    }


def test_a_full_queue_makes_none_of_the_spans_it_refuses(monkeypatch) -> None:
    """With a collector that never answers the queue stays full and every span is dropped:
    the span handed to the export (a ``ReadableSpan``) is made only for one that is queued."""
    import threading

    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from app.observe import otel

    class Stuck(SpanExporter):
        def __init__(self) -> None:
            self.gate = threading.Event()

        def export(self, spans: Any) -> SpanExportResult:
            self.gate.wait(30)
            return SpanExportResult.SUCCESS

    made: list[int] = []

    class Counted(ReadableSpan):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(otel, "ReadableSpan", Counted)
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
    exporter, dropped = Stuck(), list[int]()
    tracer = otel.build_tracer(
        Settings(otel_endpoint="http://127.0.0.1:9/v1/traces"), exporter, on_drop=dropped.append
    )
    for _ in range(50):
        tracer.request("chat m", [], start=time.monotonic(), attributes={}).end()
    exporter.gate.set()
    tracer.shutdown()
    assert len(made) + len(dropped) == 50
    assert len(made) <= 4 + 2, len(made)  # the queue, and a batch the stuck export took


def test_a_failed_export_is_followed_by_one_span_alone(monkeypatch) -> None:
    """The exporter's answer reaches the outbox: after a FAILURE the next try is one span,
    then whole batches again (app/observe/outbox.py)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from app.observe.otel import build_tracer

    class FailsFirst(SpanExporter):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def export(self, spans: Any) -> SpanExportResult:
            self.sizes.append(len(spans))
            ok = len(self.sizes) > 1
            return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # only full batches and the exit
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    exporter = FailsFirst()
    tracer = build_tracer(Settings(otel_endpoint="http://127.0.0.1:9/v1/traces"), exporter)
    for _ in range(8):
        tracer.request("chat m", [], start=time.monotonic(), attributes={}).end()
    tracer.shutdown()  # the failed batch's retry waits for the exit: one span, then three
    assert exporter.sizes == [4, 1, 3]


# -- on: each attempt its own span ---------------------------------------------------------


class Recorded:
    """A span that keeps what it was told (the Span protocol of app/observe/tracing.py)."""

    trace_id = "0" * 32

    def __init__(self, name: str, kind: str = tracing.SERVER, attributes: Any = None) -> None:
        self.name, self.kind = name, kind
        self.attributes = {k: v for k, v in (attributes or {}).items() if v is not None}
        self.children: list[Recorded] = []
        self.ended = False
        self.error: str | None = None

    def set(self, attributes: Any) -> None:
        self.attributes.update({k: v for k, v in attributes.items() if v is not None})

    def rename(self, name: str) -> None:
        self.name = name

    def child(self, name: str, *, kind: str = tracing.INTERNAL, attributes: Any = None,
              start: float | None = None) -> Recorded:  # fmt: skip
        span = Recorded(name, kind, attributes)
        self.children.append(span)
        return span

    def event(self, name: str, attributes: Any = None, *, at: float) -> None:
        pass

    def link(self, other: Any, attributes: Any = None) -> None:
        pass

    def link_to(self, traceparent: str, attributes: Any = None) -> None:
        pass

    def inject(self, headers: dict[str, str]) -> dict[str, str]:
        return {**headers, "traceparent": f"00-{self.trace_id}-{id(self):016x}-01"}

    def end(self, *, error: str | None = None, at: float | None = None) -> None:
        assert not self.ended, f"{self.name} ended twice"
        self.ended, self.error = True, error


class Raw:
    def __init__(self, status: int) -> None:
        self.status = status
        self.headers = {"retry-after-ms": "1"}
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


class Scripted(Transport):
    """Attempts answer from ``answers`` in turn: a status, or an error to raise."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__(Settings())
        self.answers = answers
        self.sent_under: list[Any] = []

    def send(self, spec, req, deadline):
        self.sent_under.append(req.span)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return Raw(answer)


def _scripted(specs: list[UpstreamSpec], answers: list[Any]) -> tuple[Upstream, Scripted]:
    transport = Scripted(answers)
    upstream = Upstream(Settings(), specs=specs, metrics=Metrics(multiproc_dir=""),
                        sleep=lambda s: None, rand=lambda: 0.0, transport=transport)  # fmt: skip
    return upstream, transport


def test_every_retry_and_failover_is_an_attempt_span_of_its_own() -> None:
    specs = [UpstreamSpec("a", "http://a.test:8001/v1"), UpstreamSpec("b", "https://b.test/v1")]
    upstream, transport = _scripted(specs, [UpstreamUnreachable("no"), 503, 200])
    request = Recorded("chat m")
    req = UpstreamRequest("POST", "/chat/completions", "", {}, b"{}", stream=True, model="m",
                          route=routes.CHAT, span=request)  # fmt: skip
    resp = upstream.attempts.open(req, Deadline.start(60))
    attempts = request.children
    assert [s.name for s in attempts] == ["chat m"] * 3
    assert {s.kind for s in attempts} == {tracing.CLIENT}
    # Each attempt was sent under its own span: its traceparent is the attempt's.
    assert transport.sent_under == attempts
    assert [(s.attributes["llmgate.upstream"], s.attributes["llmgate.attempt"]) for s in attempts
            ] == [("a", 1), ("b", 2), ("b", 3)]  # fmt: skip
    assert [s.attributes["server.address"] for s in attempts] == ["a.test", "b.test", "b.test"]
    assert [s.attributes["server.port"] for s in attempts] == [8001, 443, 443]
    # The failed ones ended with their error; the answering one lasts as long as its body.
    assert [(s.ended, s.error) for s in attempts[:2]] == [
        (True, "upstream_unreachable"),
        (True, "503"),
    ]
    assert attempts[2].ended is False
    assert attempts[2].attributes["http.response.status_code"] == 200
    upstream.ledger.close(resp)
    assert (attempts[2].ended, attempts[2].error) == (True, None)
    upstream.ledger.close(resp)  # counted once, ended once


def test_tracing_off_sends_the_request_as_it_is() -> None:
    upstream, transport = _scripted([UpstreamSpec("a", "http://a.test/v1")], [200])
    req = UpstreamRequest("POST", "/chat/completions", "", {}, b"{}", stream=False)
    resp = upstream.attempts.open(req, Deadline.start(60))
    assert transport.sent_under == [None] and resp.span is None


# -- what goes into a span -----------------------------------------------------------------


def test_names_follow_the_genai_and_http_conventions() -> None:
    assert (
        tracing.request_name(routes.CHAT, "POST", "/v1/chat/completions", "gpt-4o") == "chat gpt-4o"
    )
    assert tracing.request_name(routes.COMPLETIONS, "POST", "/v1/completions", "m") == (
        "text_completion m"
    )
    assert tracing.request_name(routes.EMBEDDINGS, "POST", "/v1/embeddings") == "embeddings"
    assert tracing.request_name(routes.PASSTHROUGH, "GET", "/v1/models") == "GET /v1/models"
    # A forwarded path can hold ids: never a span name.
    assert tracing.request_name(routes.PASSTHROUGH, "GET", "/v1/files/file-abc") == "GET /v1/*"
    assert (
        tracing.request_attributes(routes.RESPONSES, "POST", "/v1/responses", "r1")[
            "openai.api.type"
        ]
        == "responses"
    )


def test_a_body_gives_its_model_and_numbers_never_its_content() -> None:
    body = {
        "model": "m",
        "max_completion_tokens": 7,
        "temperature": 0,
        "seed": True,  # not a number
        "messages": [{"role": "user", "content": "secret prompt"}],
        "user": "someone@example.com",
    }
    attributes = tracing.body_attributes(body, stream=False)
    assert attributes == {
        "gen_ai.request.model": "m",
        "gen_ai.request.stream": False,
        "gen_ai.request.max_tokens": 7,
        "gen_ai.request.temperature": 0,
    }
