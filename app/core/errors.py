"""One error tree for everything the gateway answers with itself. No I/O here.

Each class carries its HTTP status and OpenAI error ``type``; ``to_body()`` is the only place
that builds the OpenAI error JSON ``{"error": {"message", "type", "param", "code"}}``, used
both for HTTP error responses and for the final SSE error event of a broken stream. On the
Anthropic Messages door (a route whose ``door`` is ``anthropic``: app/request/routes.py) the
same error leaves in Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}`` (``anthropic_body``), its type named by
the status as Anthropic names its errors.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.doors import ANTHROPIC, OPENAI


class GatewayError(Exception):
    status = 500
    type = "api_error"
    code: str | None = "internal_error"
    # Whether the caller may usefully retry: False becomes `x-should-retry: false`, which
    # stops the OpenAI SDK from multiplying calls the gateway already retried.
    retryable = False
    # True when the request never left for the upstream (no connection): safe to retry.
    before_send = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if retryable is not None:
            self.retryable = retryable
        self.param = param
        self.headers = dict(headers or {})

    def to_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_body()).encode()

    def to_json_for(self, door: str) -> bytes:
        """The error's body in the dialect of the ``door`` the call came in by."""
        if door == ANTHROPIC:
            return json.dumps(anthropic_body(self.status, self.message)).encode()
        return self.to_json()

    def response_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if not self.retryable:
            headers["x-should-retry"] = "false"
        headers.update(self.headers)
        return headers


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "missing_api_key"


class InvalidApiKey(Unauthorized):
    """Gateway keys are on and the caller's key is missing, unknown, revoked or expired."""

    code = "invalid_api_key"


class OperatorTokenRequired(Unauthorized):
    """An operational endpoint (/metrics, /status, /admin/*) without the operator token."""

    code = "operator_token_required"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class ModelNotAllowed(Forbidden):
    """The caller's gateway key may not use this model (or no upstream it may use serves it)."""

    code = "model_not_allowed"


class ModelNotPriced(Forbidden):
    """The caller's gateway key has a budget in money and the price table names no price
    for the model (nor a ``"*"`` one): its cost could not be held against the budget."""

    code = "model_not_priced"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class ModelNotServed(GatewayError):
    """No configured upstream serves the requested model."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class URITooLong(GatewayError):
    status = 414
    type = "invalid_request_error"
    code = "uri_too_long"


class UpstreamError(GatewayError):
    """The upstream could not be reached or broke the exchange."""

    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamUnreachable(UpstreamError):
    code = "upstream_unreachable"
    retryable = True
    before_send = True


class UpstreamTLSError(UpstreamError):
    """The TLS handshake failed (an untrusted or mismatched certificate): not retried."""

    code = "upstream_tls_error"


class UpstreamReset(UpstreamError):
    code = "upstream_reset"


class UpstreamProtocolError(UpstreamError):
    """The upstream's answer could not be relayed (input we cannot handle, or a bug)."""

    code = "upstream_protocol_error"


class UpstreamRedirect(UpstreamProtocolError):
    """The upstream answered a generation call (chat, completions, embeddings, responses)
    with a redirect. The gateway follows none, and passes none on for these calls (the
    caller's SDK would follow it past the gateway): the upstream's configured URL is wrong."""

    code = "upstream_redirect"


class UpstreamEventTooLarge(UpstreamError):
    """One SSE event of the upstream's stream is larger than LLMGATE_MAX_EVENT_BYTES."""

    code = "upstream_event_too_large"


class UpstreamTimeout(GatewayError):
    """One of the four timeouts fired; ``phase`` names which."""

    status = 504
    type = "timeout_error"

    PHASES = ("connect", "first_byte", "idle", "deadline")

    def __init__(self, phase: str, seconds: float, **kw: Any) -> None:
        if phase not in self.PHASES:
            raise ValueError(phase)
        what = {
            "connect": "connecting to the upstream",
            "first_byte": "waiting for the upstream's response headers",
            "idle": "waiting for the next bytes of the upstream's response",
            "deadline": "the request's total deadline",
        }[phase]
        super().__init__(
            f"Upstream timed out: {what} took longer than {seconds:g}s ({phase} timeout).",
            code=f"{phase}_timeout",
            **kw,
        )
        self.phase = phase


class ClientTooSlow(GatewayError):
    """The caller stopped reading a stream for longer than LLMGATE_SEND_TIMEOUT_S."""

    status = 408
    type = "invalid_request_error"
    code = "client_too_slow"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "api_error"
    code = "service_unavailable"
    retryable = True


class Overloaded(GatewayError):
    """This worker is at its limit of concurrent requests or streams (app/core/admission.py):
    refused at once, never queued; the caller may come back (x-should-retry: true)."""

    status = 429
    type = "rate_limit_error"
    code = "gateway_overloaded"
    retryable = True

    def __init__(self, kind: str, limit: int, *, retry_after_s: int) -> None:
        super().__init__(
            f"The gateway is busy: this worker is at its limit of {limit} concurrent "
            f"{kind}. Retry after {retry_after_s} s.",
            headers={
                "retry-after": str(retry_after_s),
                "retry-after-ms": str(retry_after_s * 1000),
                "x-should-retry": "true",
            },
        )
        self.kind = kind


class RateLimited(GatewayError):
    """A gateway key is over one of its limits (app/tenancy/limits.py). ``kind`` is OpenAI's error
    type for it: ``requests`` or ``tokens``; a budget (per day or month) is a quota."""

    status = 429
    code = "rate_limit_exceeded"
    retryable = True

    def __init__(self, message: str, *, kind: str, retry_after_s: int, quota: bool = False):
        retry_after_s = max(1, retry_after_s)
        super().__init__(
            message,
            headers={
                "retry-after": str(retry_after_s),
                "retry-after-ms": str(retry_after_s * 1000),
            },
        )
        self.type = kind
        if quota:
            # Hours away: the SDK must not sit in a retry loop (it caps retry-after at 60 s
            # and would retry on its own backoff instead).
            self.code, self.retryable = "insufficient_quota", False


class LimitsUnavailable(ServiceUnavailable):
    """The shared limit counters cannot be reached and limits fail closed (LLMGATE_LIMITS_FAIL)."""

    code = "limits_unavailable"


class GatewayShutdown(ServiceUnavailable):
    """This instance is stopping (a deploy): the call may be retried on another one."""

    code = "gateway_shutdown"


# Anthropic's error types by HTTP status (its API's documented errors; 503 is ours, an
# overload as its 529 is).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status: a 4xx not listed is invalid_request_error,
    anything else not listed api_error."""
    if status in ANTHROPIC_TYPES:
        return ANTHROPIC_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def anthropic_body(status: int, message: str, type: str | None = None) -> dict[str, Any]:
    """Anthropic's error envelope; ``type`` from the status when not given."""
    return {"type": "error", "error": {"type": type or anthropic_type(status), "message": message}}


def wrap_upstream_body(status: int, body: bytes, door: str = OPENAI) -> bytes:
    """An upstream error body as OpenAI JSON: kept as is when it already is, else wrapped.

    Proxies in front of providers answer with HTML or plain text; callers get the same JSON
    shape whatever the upstream said, with the upstream's text kept as the message.
    """
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return body
    text = body.decode("utf-8", errors="replace").strip()[:500] or f"HTTP {status}"
    error = GatewayError(f"Upstream answered {status}: {text}", status=status, code=None)
    error.type = "upstream_error"
    return error.to_json_for(door)


# The bounded values of the metrics' `cause` label.
ERROR_CAUSES = (
    "connect",
    "timeout_connect",
    "timeout_first_byte",
    "timeout_idle",
    "timeout_deadline",
    "rate_limited",
    "auth",
    "server",
    "reset",
    "protocol",
    "client_closed",
)


def error_cause(exc: GatewayError) -> str:
    """The metrics cause of a failed upstream call (bounded label values)."""
    if isinstance(exc, UpstreamTimeout):
        return f"timeout_{exc.phase}"
    if isinstance(exc, (UpstreamUnreachable, UpstreamTLSError)):
        return "connect"
    if isinstance(exc, UpstreamReset):
        return "reset"
    if isinstance(exc, (UpstreamProtocolError, UpstreamEventTooLarge)):
        return "protocol"
    if isinstance(exc, ClientTooSlow):
        return "client_closed"
    return "server"


def status_cause(status: int) -> str | None:
    """The metrics cause of an upstream error answer, None for a success."""
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status >= 500:
        return "server"
    return None
