"""OpenTelemetry traces over OTLP/HTTP: the only module that imports OpenTelemetry.

The app factory builds an ``OtelTracer`` inside each worker, after gevent patched it, and
only when LLMGATE_OTEL_ENDPOINT is set (without it nothing imports this module). It keeps a
TracerProvider of its own, not the process-wide one: nothing else in the worker traces
through it by accident, and the tests can build several.

Ended spans leave through an ``Outbox`` (app/outbox.py): ending one only puts it on a bounded
queue; a real OS thread encodes batches and sends them with the OTLP/HTTP exporter (protobuf
over ``requests``), so neither the encoding nor a slow, black-holed or absent collector runs
on the worker's gevent loop. Not the SDK's ``BatchSpanProcessor``: under gevent its thread is
a greenlet on that loop. A full queue drops the span and counts it (``on_drop``): tracing
never holds a request back. A queued span is a compact copy (``_compact``): few objects
for the garbage collector to walk; a span the full queue refuses is not copied. After a failed
export the next try is one span alone, a whole interval later (the outbox's rule): a
collector that never answers costs one span's encoding per export timeout, not a batch's. The standard ``OTEL_BSP_SCHEDULE_DELAY`` / ``_MAX_QUEUE_SIZE`` /
``_MAX_EXPORT_BATCH_SIZE`` (batching), ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` / ``_TIMEOUT`` /
``_CERTIFICATE`` (the collector) and ``OTEL_TRACES_SAMPLER`` (default: parent-based, always
on) variables apply. At the worker's exit what is queued is sent, waiting at most
``FLUSH_S``.

W3C Trace Context (https://www.w3.org/TR/trace-context/): a request's span is a child of
the caller's ``traceparent`` when it is valid, and each upstream attempt sends its own
span as the parent, with the caller's ``tracestate``. A caller that did not sample its trace
(flags 00) gets no spans recorded, and its trace id still travels upstream.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.config import Settings
from app.outbox import Outbox
from app.tracing import CLIENT, INTERNAL, SERVER, Attributes, Span

_PROPAGATOR = TraceContextTextMapPropagator()
_FIELDS = frozenset({"traceparent", "tracestate"})
_KINDS = {SERVER: SpanKind.SERVER, CLIENT: SpanKind.CLIENT, INTERNAL: SpanKind.INTERNAL}
FLUSH_S = 5.0  # a worker's exit waits at most this long for its last spans to leave


def build_tracer(
    settings: Settings,
    exporter: SpanExporter | None = None,
    on_drop: Callable[[int], object] = lambda count: None,
) -> OtelTracer:
    """The worker's tracer, exporting to LLMGATE_OTEL_ENDPOINT (or to ``exporter``);
    ``on_drop(count)`` hears of spans dropped because the queue was full."""
    return OtelTracer(
        exporter or OTLPSpanExporter(endpoint=settings.otel_endpoint),
        service_name=settings.otel_service_name,
        on_drop=on_drop,
    )


class OtelTracer:
    def __init__(
        self,
        exporter: SpanExporter,
        *,
        service_name: str,
        on_drop: Callable[[int], object] = lambda count: None,
    ) -> None:
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(ThreadExport(exporter, on_drop))
        self._tracer = self._provider.get_tracer("llmgate")

    def request(
        self, name: str, headers: Iterable[tuple[str, str]], *, start: float, attributes: Attributes
    ) -> Span:
        carrier = {k.lower(): v for k, v in headers if k.lower() in _FIELDS}
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=_clean(attributes),
            start_time=_ns(start),
        )
        return OtelSpan(self._tracer, span)

    def shutdown(self) -> None:
        """Export what is queued (waiting at most ``FLUSH_S``) and stop the export thread."""
        self._provider.shutdown()


class ThreadExport(SpanProcessor):
    """Ended spans into an ``Outbox`` whose thread, not the worker's loop, encodes and sends
    them. The exporter is used only in that thread, from its first export to its shutdown."""

    def __init__(self, exporter: SpanExporter, on_drop: Callable[[int], object]) -> None:
        capacity = _variable("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self._on_drop = on_drop
        self._exporter = exporter
        self._outbox: Outbox[ReadableSpan] = Outbox(
            self._export,
            capacity=capacity,
            batch=min(capacity, _variable("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
            interval_s=_variable("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
            on_close=exporter.shutdown,
        )

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        # A full queue (a collector that does not answer) refuses the span: no copy is made
        # for it, which would only add to the garbage collector's work.
        if not (self._outbox.has_room() and self._outbox.put(_compact(span))):
            self._on_drop(1)

    def _export(self, spans: list[ReadableSpan]) -> bool:
        """In the outbox's thread: True when the collector took the batch."""
        return self._exporter.export(spans) is SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._outbox.close(FLUSH_S)


def _compact(span: ReadableSpan) -> ReadableSpan:
    """The ended span as it waits for its export: 4 objects the garbage collector tracks
    instead of the live span's 15 to 20 (its locks, bounded containers, their lists).

    A queued span waits seconds, so it reaches the oldest generation, which each full
    collection walks while the worker stands still; a full queue holds 2,048 of them (a
    collector that does not answer). The attributes become a plain dict of plain values,
    which the collector does not track. Nothing is lost: the gateway's spans stay far below
    the SDK's limits, so their dropped counts (0 here) were 0 too."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=dict(span.attributes or {}),
        events=tuple(span.events),
        links=tuple(span.links),
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _variable(name: str, default: int) -> int:
    """A positive whole number from the environment (the SDK's OTEL_BSP_* batching
    settings), else ``default``."""
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


class OtelSpan:
    __slots__ = ("_span", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self._span = span

    @property
    def trace_id(self) -> str:
        return trace.format_trace_id(self._span.get_span_context().trace_id)

    def set(self, attributes: Attributes) -> None:
        self._span.set_attributes(_clean(attributes))

    def rename(self, name: str) -> None:
        self._span.update_name(name)

    def child(
        self,
        name: str,
        *,
        kind: str = INTERNAL,
        attributes: Attributes | None = None,
        start: float | None = None,
    ) -> Span:
        span = self._tracer.start_span(
            name,
            context=trace.set_span_in_context(self._span),
            kind=_KINDS[kind],
            attributes=_clean(attributes or {}),
            start_time=None if start is None else _ns(start),
        )
        return OtelSpan(self._tracer, span)

    def event(self, name: str, attributes: Attributes | None = None, *, at: float) -> None:
        self._span.add_event(name, _clean(attributes or {}), timestamp=_ns(at))

    def link(self, other: Span, attributes: Attributes | None = None) -> None:
        assert isinstance(other, OtelSpan)
        self._span.add_link(other._span.get_span_context(), _clean(attributes or {}))

    def inject(self, headers: dict[str, str]) -> dict[str, str]:
        out = {k: v for k, v in headers.items() if k.lower() not in _FIELDS}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(self._span))
        return out

    def end(self, *, error: str | None = None, at: float | None = None) -> None:
        if error is not None:
            self._span.set_attribute("error.type", error)
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end(end_time=None if at is None else _ns(at))


def _clean(attributes: Attributes) -> dict[str, str | bool | int | float]:
    return {k: v for k, v in attributes.items() if v is not None}


def _ns(monotonic: float) -> int:
    """A ``time.monotonic()`` instant as the Unix time in nanoseconds spans are dated in."""
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)
