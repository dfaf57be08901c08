"""OpenTelemetry traces over OTLP/HTTP: the only module that imports OpenTelemetry.

The app factory builds an ``OtelTracer`` inside each worker, after gevent patched it, and
only when LLMGATE_OTEL_ENDPOINT is set (without it nothing imports this module). It keeps a
TracerProvider of its own, not the process-wide one: nothing else in the worker traces
through it by accident, and the tests can build several.

A span is recorded in plain fields (``OtelSpan``) and, when it ends, handed over as one
``ReadableSpan``, what the SDK's exporters take: the SDK's sampler, ids and trace flags
decide as they would in its tracer, but its live span (locks, bounded containers checking
each attribute as it is set) is not made. Ended spans leave through an ``Outbox``
(app/observe/outbox.py): ending one only puts it on a bounded queue; a real OS thread encodes
batches and sends them with the OTLP/HTTP exporter (protobuf over ``requests``), so neither the
encoding nor a slow, black-holed or absent collector runs on the worker's gevent loop. Not
the SDK's ``BatchSpanProcessor``: under gevent its thread is a greenlet on that loop. A full
queue drops the span and counts it (``on_drop``), without making it: tracing never holds a
request back. After a failed export the next try is one span alone, a whole interval later
(the outbox's rule): a collector that never answers costs one span's encoding per export
timeout, not a batch's. The standard ``OTEL_BSP_SCHEDULE_DELAY`` / ``_MAX_QUEUE_SIZE`` /
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
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.core.config import Settings
from app.observe.outbox import Outbox
from app.observe.tracing import CLIENT, INTERNAL, SERVER, Attributes, Span, Value

_PROPAGATOR = TraceContextTextMapPropagator()
_FIELDS = frozenset({"traceparent", "tracestate"})
_KINDS = {SERVER: SpanKind.SERVER, CLIENT: SpanKind.CLIENT, INTERNAL: SpanKind.INTERNAL}
FLUSH_S = 5.0  # a worker's exit waits at most this long for its last spans to leave
_SCOPE = InstrumentationScope("llmgate")
_ERROR, _UNSET = Status(StatusCode.ERROR), Status(StatusCode.UNSET)


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
        # The provider brings the sampler (OTEL_TRACES_SAMPLER), the ids and the resource,
        # and shuts the export down at the worker's exit; its spans are not used (below).
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.export = ThreadExport(exporter, on_drop)
        self._provider.add_span_processor(self.export)
        self.sampler = self._provider.sampler
        self.ids = self._provider.id_generator
        self.resource = self._provider.resource

    def request(
        self, name: str, headers: Iterable[tuple[str, str]], *, start: float, attributes: Attributes
    ) -> Span:
        carrier = {k.lower(): v for k, v in headers if k.lower() in _FIELDS}
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        return self.start(name, parent, SpanKind.SERVER, _clean(attributes), _ns(start))

    def start(
        self,
        name: str,
        parent: Context | None,
        kind: SpanKind,
        attributes: dict[str, Value],
        start_ns: int,
    ) -> OtelSpan:
        """A span as the SDK's tracer would start it (its sampler, ids and trace flags)."""
        found = trace.get_current_span(parent).get_span_context()
        above = found if found.is_valid else None
        if above is not None:
            trace_id, random_id = above.trace_id, above.trace_flags.random_trace_id
        else:
            trace_id, random_id = self.ids.generate_trace_id(), self.ids.is_trace_id_random()
        decision = self.sampler.should_sample(parent, trace_id, name, kind, attributes)
        flags = TraceFlags.SAMPLED if decision.decision.is_sampled() else TraceFlags.DEFAULT
        context = SpanContext(
            trace_id,
            self.ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags | (TraceFlags.RANDOM_TRACE_ID if random_id else 0)),
            trace_state=decision.trace_state,
        )
        recording = decision.decision.is_recording()
        fields = dict(decision.attributes or {}) if recording else None
        return OtelSpan(self, name, context, above, kind, fields, start_ns)

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

    def queue(self, span: Callable[[], ReadableSpan]) -> None:
        """Queue the span ``span()`` makes, or count it dropped when the queue is full: a
        span refused is never made (a collector that does not answer keeps it full)."""
        if not (self._outbox.has_room() and self._outbox.put(span())):
            self._on_drop(1)

    def _export(self, spans: list[ReadableSpan]) -> bool:
        """In the outbox's thread: True when the collector took the batch."""
        return self._exporter.export(spans) is SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._outbox.close(FLUSH_S)


def _variable(name: str, default: int) -> int:
    """A positive whole number from the environment (the SDK's OTEL_BSP_* batching
    settings), else ``default``."""
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


class OtelSpan:
    """A span recorded in plain fields, handed to the export as one ``ReadableSpan`` when it
    ends: what an ended span of the SDK's becomes, without the SDK's live span on the way
    (its locks, its bounded containers, which check each attribute as it is set: two thirds
    of the CPU tracing added to a call, measured under gevent's patch). Its checks are not
    needed here: ``app/observe/tracing.py`` gives a few plain values per span, far below the SDK's
    limits. A span whose trace is not sampled records nothing; its context still travels.
    What is set after the end is ignored, as by the SDK."""

    __slots__ = (
        "_attributes",
        "_context",
        "_end",
        "_events",
        "_kind",
        "_links",
        "_name",
        "_parent",
        "_start",
        "_tracer",
    )

    def __init__(
        self,
        tracer: OtelTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Value] | None,
        start_ns: int,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._attributes = attributes  # None: not recording
        self._events: list[Event] = []
        self._links: list[Link] = []
        self._start = start_ns
        self._end: int | None = None

    @property
    def trace_id(self) -> str:
        return trace.format_trace_id(self._context.trace_id)

    def _recording(self) -> dict[str, Value] | None:
        return self._attributes if self._end is None else None

    def set(self, attributes: Attributes) -> None:
        if (recorded := self._recording()) is not None:
            recorded.update(_clean(attributes))

    def rename(self, name: str) -> None:
        if self._recording() is not None:
            self._name = name

    def child(
        self,
        name: str,
        *,
        kind: str = INTERNAL,
        attributes: Attributes | None = None,
        start: float | None = None,
    ) -> Span:
        start_ns = time.time_ns() if start is None else _ns(start)
        return self._tracer.start(
            name, self._as_parent(), _KINDS[kind], _clean(attributes or {}), start_ns
        )

    def event(self, name: str, attributes: Attributes | None = None, *, at: float) -> None:
        if self._recording() is not None:
            self._events.append(Event(name, _clean(attributes or {}), timestamp=_ns(at)))

    def link(self, other: Span, attributes: Attributes | None = None) -> None:
        assert isinstance(other, OtelSpan)
        if self._recording() is not None:
            self._links.append(Link(other._context, _clean(attributes or {})))

    def link_to(self, traceparent: str, attributes: Attributes | None = None) -> None:
        if self._recording() is None:
            return
        context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent}))
        linked = context.get_span_context()
        if linked.is_valid:
            self._links.append(Link(linked, _clean(attributes or {})))

    def inject(self, headers: dict[str, str]) -> dict[str, str]:
        out = {k: v for k, v in headers.items() if k.lower() not in _FIELDS}
        _PROPAGATOR.inject(out, context=self._as_parent())
        return out

    def end(self, *, error: str | None = None, at: float | None = None) -> None:
        if (recorded := self._recording()) is None:
            return
        if error is not None:
            recorded["error.type"] = error
        self._end = time.time_ns() if at is None else _ns(at)
        if self._context.trace_flags.sampled:
            self._tracer.export.queue(lambda: self._ended(error is not None))

    def _ended(self, failed: bool) -> ReadableSpan:
        return ReadableSpan(
            name=self._name,
            context=self._context,
            parent=self._parent,
            resource=self._tracer.resource,
            attributes=self._attributes,
            events=tuple(self._events),
            links=tuple(self._links),
            kind=self._kind,
            status=_ERROR if failed else _UNSET,
            start_time=self._start,
            end_time=self._end,
            instrumentation_scope=_SCOPE,
        )

    def _as_parent(self) -> Context:
        return trace.set_span_in_context(NonRecordingSpan(self._context))


def _clean(attributes: Attributes) -> dict[str, Value]:
    return {k: v for k, v in attributes.items() if v is not None}


def _ns(monotonic: float) -> int:
    """A ``time.monotonic()`` instant as the Unix time in nanoseconds spans are dated in."""
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)
