"""An OTLP/HTTP trace receiver on loopback, for the tracing test and bench (no tests in here).

It takes ``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (parsed with
opentelemetry-proto's own classes, not the gateway's code), answers an empty
``ExportTraceServiceResponse`` and keeps every span as a plain ``Span`` value. With
``keep=False`` it only counts them (a benchmark's sink), and parses a body only when its
count is asked for: a collector runs elsewhere, not on the cores of the gateway it measures.

``BlackHole`` is the collector that never answers: it accepts connections and reads what
they send, and that is all. ``SpansKept`` is an exporter that keeps what the SDK hands it, in
memory, for a test of the spans without a socket.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from contextlib import suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]  # (name, time, attributes)
    links: list[tuple[str, str, dict[str, Any]]]  # (trace id, span id, attributes)
    status: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which) if which else None


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items if isinstance(kv, KeyValue)}


def parse(body: bytes) -> list[Span]:
    """The spans of one export request's protobuf body."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    Span(
                        name=s.name,
                        kind=KINDS.get(s.kind, str(s.kind)),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        events=[
                            (e.name, e.time_unix_nano, _attributes(e.attributes)) for e in s.events
                        ],
                        links=[
                            (link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
                            for link in s.links
                        ],
                        status=s.status.code,
                        resource=resource,
                    )
                )
    return spans


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` a receiver at ``r.url``; ``r.spans`` what arrived."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.spans: list[Span] = []
        self.exports = 0
        self._count = 0
        self._unparsed: list[bytes] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                status = 200 if self.path == "/v1/traces" else 404
                if status == 200:
                    receiver._take(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _take(self, body: bytes) -> None:
        spans = parse(body) if self.keep else []
        with self._lock:
            self.exports += 1
            self._count += len(spans)
            self.spans.extend(spans)
            if not self.keep:
                self._unparsed.append(body)

    @property
    def span_count(self) -> int:
        """Spans received so far."""
        with self._lock:
            bodies, self._unparsed = self._unparsed, []
            self._count += sum(len(parse(body)) for body in bodies)
            return self._count

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, count: int, timeout: float = 15.0) -> list[Span]:
        """The spans of ``trace_id`` once at least ``count`` are in (or what came by then)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.trace(trace_id)
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class BlackHole:
    """``with BlackHole() as hole:`` a listener at ``hole.url`` that accepts, reads and
    never answers; ``hole.connections`` and ``hole.received`` (bytes) count what came."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1/traces"
        self.connections = 0
        self.received = 0
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed by __exit__
                return
            with self._lock:
                self.connections += 1
                self._held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                with self._lock:
                    self.received += len(data)
        except OSError:
            pass

    def __enter__(self) -> BlackHole:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        # shutdown() first: close() alone would not wake a thread blocked in accept or recv.
        with self._lock:
            for sock in [self._listener, *self._held]:
                with suppress(OSError):  # already shut by its peer
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


class SpansKept(SpanExporter):
    """An exporter of the SDK's that keeps every span it is handed (``spans``)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans += spans
        return SpanExportResult.SUCCESS
