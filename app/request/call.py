"""The values that cross between the web layer and the orchestration. No I/O here.

A call's ``Trace`` is where the stages record what happened (who called, what was asked,
where the cache looked, which upstream answered, how a stream ended): each fact through one
method, which also puts it on the request's span when tracing is on, so no stage handles the
span itself. The end of the call (app/edge/finish.py) reads the facts for the metrics, the
log line and the span's end.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.core.admission import Ticket
from app.core.doors import OPENAI
from app.core.errors import GatewayError
from app.core.frozen import quick_init
from app.observe import tracing
from app.observe.tracing import Span, Tracer, Value
from app.request.affinity import Routing
from app.request.routes import Route
from app.request.stages import Stages, queued
from app.request.usage import AnswerFacts, Usage

SSE_HEADERS = (
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)
Headers = list[tuple[str, str]]
CLIENT_CLOSED = 499  # nginx's code for "client closed request"; never reaches anyone


class Settlement(Protocol):
    """A gateway key's grant for one call (app/tenancy/access.py): the rate-limit headers
    of its answer, and the settlement the end of the call makes once."""

    @property
    def headers(self) -> list[tuple[str, str]]: ...

    def settle(self, usage: Usage | None, billed: bool, served: bool) -> None: ...

    def reserve_again(self) -> bool:
        """One more upstream call's reservation (a stream continued on another upstream):
        False when the key's budgets have no room for it."""
        ...


@dataclass
class Trace:
    """What happened to one call, recorded by the stages through its methods; read by the
    end of the call (app/edge/finish.py) for the metrics, the log line and the span."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    model: str | None = None
    stream: bool = False
    # The gateway's own time by stage (app/request/stages.py): Server-Timing, the log line,
    # llmgate_added_seconds and the span's attributes are made from it (app/edge/finish.py).
    stages: Stages = field(default_factory=Stages)
    # When the call began to follow another's flight (``followed``): its wait for the
    # upstream starts there, not at the flight's start.
    joined: float | None = None
    attempts: int = 0
    upstream: str | None = None  # the configured name of the upstream that answered
    routing: Routing | None = None  # how its upstreams were ordered: the first, and why
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
    grant: Settlement | None = None
    # The answer is the gateway's own error (routes.py): nothing of the upstream reached the
    # caller, so the call is given back to its key's limits whole.
    own_error: bool = False
    # A stream's usage is the upstream's bill only when the stream reached its route's end
    # (relay.py), and any answer's only when the upstream reported it (a translation that
    # had to estimate it says so). Otherwise the reservation stands (app/edge/finish.py).
    completed: bool = False
    usage_estimated: bool = False
    # The request's span when tracing is on (app/observe/tracing.py), ended by app/edge/finish.py.
    span: Span | None = None
    # A stream that broke after it started: what came of each try to continue it on another
    # upstream call (app/upstream/continuation.py), for the log line.
    continuations: list[dict[str, Value]] = field(default_factory=list)

    # -- facts, as the stages learn them -----------------------------------------------
    def arrived(
        self, tracer: Tracer, route: Route, method: str, path: str, headers: Headers
    ) -> None:
        """Tracing is on: the request's span, from when the call arrived."""
        self.span = tracer.request(
            tracing.request_name(route, method, path),
            headers,
            start=self.started,
            attributes=tracing.request_attributes(route, method, path, self.request_id),
        )

    def queued(self, nginx_start: float | None) -> None:
        """nginx's start time of the call (its ``X-Request-Start``, wall-clock seconds; None:
        none came): the wait from nginx to the worker, read against the worker's clock now."""
        self.stages.queue_s = queued(nginx_start, time.time())

    def identified(self, key: str) -> None:
        """The caller's gateway key, by name."""
        self.key = key

    def authorized(self, began: float) -> None:
        """A step of the key's check or of its limits' grant, begun at ``began``
        (monotonic), just ended: the ``auth`` stage."""
        self.stages.auth_s = (self.stages.auth_s or 0.0) + time.monotonic() - began

    def asked(
        self, route: Route, method: str, path: str, body: Mapping[str, Any], stream: bool
    ) -> None:
        """What the validated body asks for: the model, and whether it streams."""
        model = body.get("model")
        self.model = str(model)[:100] if "model" in body else None
        self.stream = stream
        if self.span is not None:
            name = model if isinstance(model, str) else None
            self.span.rename(tracing.request_name(route, method, path, name))
            self.span.set(tracing.body_attributes(body, self.stream))

    def granted(self, grant: Settlement, *, hide_usage: bool) -> None:
        """The key's grant; ``hide_usage``: the stream's usage chunk, asked for by the
        gateway, is taken out of what the caller reads."""
        self.grant, self.hide_usage = grant, hide_usage

    def settled_otherwise(self, settle: Callable[[Settlement], Settlement]) -> None:
        """The key's grant is settled another way (a resumable stream's, at its answer's
        end: app/resume/service.py): ``settle`` wraps the grant (nothing without keys)."""
        if self.grant is not None:
            self.grant = settle(self.grant)

    def resuming(self, span_link: str | None) -> None:
        """The call resumes a stream (its events come from a log: a stream, billed
        nothing); ``span_link``: the resumed stream's trace context, linked to the span."""
        self.stream = True
        if span_link and self.span is not None:
            tracing.resumed(self.span, span_link)

    def headed(self, headers: Headers) -> None:
        """The answer's headers are known: the upstream's own request id among them, kept
        as it named it (``x-request-id``), for the log line and the receipt."""
        self.upstream_request_id = next(
            (value for name, value in headers if name.lower() == "x-request-id"), None
        )

    def looked_up(self, started: float, level: str | None) -> None:
        """A cache lookup that began at ``started`` just ended: found at ``level``, or not."""
        self.stages.cache_s = (self.stages.cache_s or 0.0) + time.monotonic() - started
        if self.span is not None:
            tracing.cache_lookup(self.span, started, level)

    def followed(self, leader: Span | None) -> None:
        """The call follows another's flight (from now: its wait for the upstream begins
        here); its span links to the leader's."""
        self.joined = time.monotonic()
        if self.span is not None and leader is not None:
            tracing.follow(self.span, leader)

    def answered(
        self,
        attempts: int,
        upstream: str,
        where: Mapping[str, Value],
        routing: Routing | None = None,
    ) -> None:
        """The answer's head is in: after ``attempts`` at the upstream named ``upstream``
        (``where``: its attributes for the span, app/upstream/spans.py), which ``routing``
        ordered first or not (app/upstream/attempts.py; None: not known here)."""
        self.attempts, self.upstream = attempts, upstream or None
        self.routing = routing
        if self.span is not None and where:
            self.span.set(dict(where))
        if self.span is not None and routing is not None:
            self.span.set({f"llmgate.routing.{k}": v for k, v in routing.fields().items() if v})

    def upstream_began(self, began: float, head_at: float, connect_s: float = 0.0) -> None:
        """The upstream's answer began at ``head_at`` (its head and first event; a whole
        body) for a call that went upstream at ``began`` (monotonic), ``connect_s`` of it
        spent on a new connection's handshake: the ``connect`` and ``upstream`` stages. A
        follower waited only from when it joined (a flight that had its head by then: 0)."""
        start = began if self.joined is None else max(began, self.joined)
        waited = max(0.0, head_at - start)
        connect = min(connect_s, waited)
        self.stages.connect_s, self.stages.upstream_s = connect, waited - connect

    def upstream_waiting(self, began: float) -> None:
        """A stream answered before its upstream began (its heartbeat came first): the
        ``upstream`` stage is the wait so far."""
        self.upstream_began(began, time.monotonic())

    def stream_broke(self, error: str) -> None:
        """A 200 stream ended in an error event: its type (app/streams/relay.py)."""
        self.stream_error = error

    def answer_whole(self, usage_estimated: bool) -> None:
        """The answer is whole: a body came, or the stream reached its route's end without
        an error (app/streams/relay.py). ``usage_estimated``: the usage it shows is a
        translation's estimate, the upstream having reported none."""
        self.completed, self.usage_estimated = True, usage_estimated

    def usage_taken(self, usage: Usage) -> None:
        """The usage chunk taken out of the caller's stream (``hide_usage``)."""
        self.usage = usage

    def caller_left(self) -> None:
        """The caller closed its connection (called from the hub's loop: no blocking)."""
        self.client_closed = True

    def gateway_failed(self) -> None:
        """The answer is the gateway's own error: nothing of the upstream reached the caller,
        so the call is given back to its key's limits whole."""
        self.own_error = True

    def reserve_again(self) -> bool:
        """The key reserves for one more upstream call before a continuation is sent
        (nothing without keys); False: its budgets have no room."""
        return self.grant is None or self.grant.reserve_again()

    def continued(self, fact: Mapping[str, Value | None]) -> None:
        """A stream broke and a continuation was tried (or not, and why): ``fact`` names the
        upstream that broke, the cut, the splice point (events and characters the caller
        had), the outcome, the upstream that took over."""
        kept = {name: value for name, value in fact.items() if value is not None}
        self.continuations.append(kept)
        if self.span is not None:
            self.span.event(
                "continuation",
                {f"llmgate.continuation.{name}": value for name, value in kept.items()},
                at=time.monotonic(),
            )

    def settle(self, usage: Usage | None, billed: bool) -> None:
        """The end of the call settles the key's grant, once (nothing without keys)."""
        if self.grant is not None:
            self.grant.settle(usage, billed, not self.own_error)

    @property
    def limit_headers(self) -> list[tuple[str, str]] | None:
        return None if self.grant is None else self.grant.headers


@quick_init
@dataclass(frozen=True)
class Call:
    route: Route  # app/request/routes.py: asked, never compared by name
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

    def edited(self, *, path: str | None = None, body: bytes | None = None) -> Call:
        """This call with another ``path`` or ``body`` (what the edge fills in once the call
        exists): ``dataclasses.replace``'s result, built directly, 1 us against its 4 (twice
        a call). tests/unit/request/test_call_edited.py holds the two equal, field by field."""
        return Call(
            self.route,
            self.method,
            self.path if path is None else path,
            self.query,
            self.headers,
            self.body if body is None else body,
            self.client_socket,
            self.trace,
            self.admission,
        )


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    # A whole body, or a stream's: batches of whole events, each batch sent in one write
    # (app/streams/relay.py batches what arrived together; app/edge/finish.py joins each batch).
    body: bytes | Iterator[list[bytes]]
    # A whole body's usage and service tier when its maker knows them already (a stored
    # answer's, read once: app/cache/replay.py); None: app/edge/finish.py reads the body.
    facts: AnswerFacts | None = None
    # Set by the stage that knows them, read by the end of the call (app/edge/finish.py),
    # which also tells the caller in headers made from them: where the answer came from (the
    # X-LLMGate-Cache value: HIT with its level, MISS, BYPASS, REFRESH, COALESCED, RESUMED;
    # None: no cache stage ran), and a resumable stream's id (its events carry id lines).
    cache: str | None = None
    stream_id: str | None = None


def error_reply(exc: GatewayError, door: str = OPENAI) -> Reply:
    """The gateway's own error as the caller gets it: JSON in the shape of the ``door`` the
    call came in by (OpenAI's, or Anthropic's on /v1/messages), its status."""
    return Reply(exc.status, list(exc.response_headers().items()), exc.to_json_for(door))
