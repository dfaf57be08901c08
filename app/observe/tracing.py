"""Traces: the interface spans are recorded through, and what goes in them. No I/O here.

Tracing is opt-in (LLMGATE_OTEL_ENDPOINT). When it is on, the app factory builds a ``Tracer``
from app/observe/otel.py, the only module that imports OpenTelemetry; when it is off there is no
tracer and every place that would record a span holds None instead, so the request path
pays one attribute check and imports nothing.

The spans of one call (docs/observability.md):

    {operation} {model}   SERVER, the request, child of the caller's traceparent; the
                          OpenTelemetry GenAI attributes, the cache outcome, coalescing
      cache lookup        INTERNAL, L1 then L2, and what it found
      {operation} {model} CLIENT, one per upstream attempt (retries, failovers and hedges
                          each get their own); its traceparent is the one sent upstream
      stream              INTERNAL, from the first byte of a streamed body to its last,
                          with the first token as an event

A coalesced follower makes no upstream call of its own: its request span links to the
leader's (a span link, and ``llmgate.leader.trace_id``), whose trace holds the attempts.

Nothing a caller wrote goes into a span: no prompt, no completion, no credential, no query
string (an Azure-style ``?api-key=`` travels there). Models, token counts and numbers only.

Times here are ``time.monotonic()`` values, the clock the rest of the gateway keeps; the
tracer converts them. Spans are often recorded after the fact (a lookup once it is done, the
stream at its end) with their real start and end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from app.core.errors import GatewayError

Value = str | bool | int | float
Attributes = Mapping[str, Value | None]  # None: not recorded

SERVER, CLIENT, INTERNAL = "server", "client", "internal"


class Named(Protocol):
    """What a span needs of a call's route (app/request/routes.py's ``Route``): its name, its
    ``gen_ai.operation.name`` (the GenAI registry's well-known values; None: not a GenAI
    call) and, where two routes share an operation, its ``openai.api.type`` (a Responses
    call is a chat too)."""

    @property
    def name(self) -> str: ...

    @property
    def operation(self) -> str | None: ...

    @property
    def api_type(self) -> str | None: ...


# Request settings worth seeing beside the model: numbers only, never content.
_REQUEST_NUMBERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
}
MAX_NAME = 100  # a model name in a span name or attribute (as in the log line)


class Span(Protocol):
    """One span being recorded. Attributes whose value is None are left out."""

    @property
    def trace_id(self) -> str: ...  # 32 hex digits

    def set(self, attributes: Attributes) -> None: ...

    def rename(self, name: str) -> None: ...

    def child(
        self,
        name: str,
        *,
        kind: str = INTERNAL,
        attributes: Attributes | None = None,
        start: float | None = None,
    ) -> Span: ...

    def event(self, name: str, attributes: Attributes | None = None, *, at: float) -> None: ...

    def link(self, other: Span, attributes: Attributes | None = None) -> None: ...

    def link_to(self, traceparent: str, attributes: Attributes | None = None) -> None:
        """A link to a span known only by its W3C ``traceparent`` (one in another process);
        nothing for a malformed one."""
        ...

    def inject(self, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` carrying this span as the parent (traceparent, and the caller's
        tracestate), in place of any the caller sent."""
        ...

    def end(self, *, error: str | None = None, at: float | None = None) -> None: ...


class Tracer(Protocol):
    def request(
        self, name: str, headers: Iterable[tuple[str, str]], *, start: float, attributes: Attributes
    ) -> Span:
        """A request's SERVER span, a child of the caller's ``traceparent`` when it sent a
        valid one (else a new trace)."""
        ...

    def shutdown(self) -> None: ...


def request_name(route: Named, method: str, path: str, model: str | None = None) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}`` for the API routes, else the HTTP
    server convention's ``{method} {route}`` (a forwarded path may hold ids: not a name)."""
    operation = route.operation
    if operation is None:
        return f"{method} {path if path == '/v1/models' else '/v1/*'}"
    return f"{operation} {model[:MAX_NAME]}" if model else operation


def request_attributes(route: Named, method: str, path: str, request_id: str) -> dict[str, Value]:
    """What is known of a request when it arrives (the path without its query)."""
    attributes: dict[str, Value] = {
        "http.request.method": method,
        "url.path": path,
        "llmgate.route": route.name,
        "llmgate.request_id": request_id,
    }
    if route.operation is not None:
        attributes["gen_ai.operation.name"] = route.operation
        attributes["gen_ai.provider.name"] = "openai"  # the API the caller speaks
    if route.api_type is not None:
        attributes["openai.api.type"] = route.api_type
    return attributes


def body_attributes(body: Mapping[str, Any], stream: bool) -> dict[str, Value | None]:
    """The GenAI request attributes of a validated body: its model and numeric settings."""
    model = body.get("model")
    attributes: dict[str, Value | None] = {
        "gen_ai.request.model": model[:MAX_NAME] if isinstance(model, str) else None,
        "gen_ai.request.stream": stream,
    }
    for field, name in _REQUEST_NUMBERS.items():
        value = body.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[name] = value
    return attributes


def attempt_name(route: Named, method: str, model: str | None) -> str:
    operation = route.operation
    if operation is None:
        return method
    return f"{operation} {model[:MAX_NAME]}" if model else operation


def cache_lookup(span: Span, started: float, level: str | None) -> None:
    """The cache lookup that just ended, as a child span: what it found (``hit_l1``,
    ``hit_l2``: the level that had the entry; ``miss``)."""
    found = "miss" if level is None else f"hit_{level}"
    span.child("cache lookup", attributes={"llmgate.cache.lookup": found}, start=started).end()


def follow(span: Span, leader: Span) -> None:
    """A coalesced follower's request span: no upstream call of its own; it links to the
    leader's request span, whose trace holds the attempts and the upstream's traceparent."""
    span.link(leader, {"llmgate.link": "coalesced_leader"})
    span.set({"llmgate.leader.trace_id": leader.trace_id})


def resumed(span: Span, original: str) -> None:
    """A resume's request span (docs/streams.md): no upstream call of its own; it links to
    the request span of the stream it resumes (``original``: that span's traceparent, kept
    with the stream's log), whose trace holds the upstream call."""
    span.link_to(original, {"llmgate.link": "resumed_stream"})
    span.set({"llmgate.resumed": True})


def error_type(exc: BaseException) -> str:
    """error.type: the gateway's error code (``upstream_timeout``…), else the class name."""
    if isinstance(exc, GatewayError) and exc.code:
        return str(exc.code)
    return type(exc).__name__


def answer_attributes(
    *,
    status: int,
    outcome: str,
    usage: tuple[Any, Any, Any],
    response_model: str | None,
    service_tier: str | None,
    ttft_s: float | None,
    attempts: int,
    client_closed: bool,
) -> dict[str, Value | None]:
    """What the request span learns at its end: the answer's status, where it came from
    (the X-LLMGate-Cache outcome), what the provider billed, and how fast it started."""
    tokens_in, tokens_out, tokens_cached = usage
    return {
        "http.response.status_code": status,
        "llmgate.cache": outcome,
        "llmgate.coalesced": outcome == "coalesced",
        "gen_ai.response.model": response_model[:MAX_NAME] if response_model else None,
        "gen_ai.usage.input_tokens": _count(tokens_in),
        "gen_ai.usage.output_tokens": _count(tokens_out),
        "gen_ai.usage.cache_read.input_tokens": _count(tokens_cached),
        "openai.response.service_tier": service_tier,
        "gen_ai.response.time_to_first_chunk": None if ttft_s is None else round(ttft_s, 6),
        "llmgate.attempts": attempts or None,
        "llmgate.client_closed": client_closed or None,
    }


def status_error(status: int) -> str | None:
    """error.type of an answer by its status: a server span fails on 5xx only (the HTTP
    conventions: a 4xx is the caller's error, not the server's)."""
    return str(status) if status >= 500 else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
