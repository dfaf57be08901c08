"""The values that cross between the web layer and the orchestration. No I/O here."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from app.core.admission import Ticket
from app.observe.tracing import Span
from app.request.usage import Usage

SSE_HEADERS = (
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)
CLIENT_CLOSED = 499  # nginx's code for "client closed request"; never reaches anyone


@dataclass
class Trace:
    """What happened to one call, filled in as it goes; read by the metrics and the log."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    model: str | None = None
    stream: bool = False
    cache_s: float = 0.0  # time spent on cache lookups
    upstream_ttfb_s: float | None = None  # the upstream's time to its head (+ first event)
    attempts: int = 0
    upstream: str | None = None  # the configured name of the upstream that answered
    client_closed: bool = False
    stream_error: str | None = None  # a 200 stream that ended in an error event: its type
    upstream_request_id: str | None = None
    # Gateway keys (app/tenancy/access.py): the key's name; whether the stream's usage chunk is
    # taken out (the caller did not ask for it) and the usage it held; the rate-limit headers of
    # the answer; the settlement the end of the call runs once with the usage, whether the
    # call was billed and whether it was served (not the gateway's own error).
    key: str | None = None
    hide_usage: bool = False
    usage: Usage | None = None
    limit_headers: list[tuple[str, str]] | None = None
    settle: Callable[[Usage | None, bool, bool], None] | None = None
    # The answer is the gateway's own error (routes.py): nothing of the upstream reached the
    # caller, so the call is given back to its key's limits whole.
    own_error: bool = False
    # The request's span when tracing is on (app/observe/tracing.py), ended by app/edge/finish.py.
    span: Span | None = None


@dataclass(frozen=True)
class Call:
    route: str
    method: str
    path: str  # as received, e.g. "/v1/chat/completions"
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    client_socket: socket.socket | None = None
    trace: Trace = field(default_factory=Trace)
    # Its slots in the worker's admission limits: taken by Gateway.handle once the body is
    # parsed, given back when the response body is closed (routes.py). Default: no limits.
    admission: Ticket = field(default_factory=Ticket)


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    # A whole body, or a stream's: batches of whole events, each batch sent in one write
    # (app/streams/relay.py batches what arrived together; app/edge/finish.py joins each batch).
    body: bytes | Iterator[list[bytes]]
