"""One error tree for everything the gateway answers with itself. No I/O here.

Each class carries its HTTP status and OpenAI error ``type``; ``to_body()`` is the only place
that builds the OpenAI error JSON ``{"error": {"message", "type", "param", "code"}}``, used
both for HTTP error responses and for the final SSE error event of a broken stream. On the
Anthropic Messages door (a route whose ``door`` is ``anthropic``: app/request/routes.py) the
same error leaves in Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}`` (``anthropic_body``), its type named by
the status as Anthropic names its errors.

An error is fixed once made: what it answers with (status, type, code, message, param,
headers, whether to retry, whether it left before sending) is given when it is made, and a
change after raises. A stage that would answer otherwise with another's error raises a copy
(``with_retryable``) from it, so whoever raised or holds the first sees it as it was.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Self

from app.core.doors import ANTHROPIC, OPENAI


class _Class(enum.Enum):
    """A field given no value when the error is made: its class's stands."""

    DEFAULT = 0


# What an error answers with: fixed once the error is made. A stage that would answer
# differently with another's error makes a copy (``with_retryable``): whoever raised it, or
# holds it still (a hedge's other runner, a span), sees it as it was.
_FIXED = frozenset(
    {"message", "status", "type", "code", "param", "retryable", "headers", "before_send"}
)


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
        code: str | _Class | None = _Class.DEFAULT,
        param: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
        headers: dict[str, str] | None = None,
        type: str | None = None,
        before_send: bool | None = None,
    ) -> None:
        """Each field not given keeps its class's value (``code``: None says "no code")."""
        super().__init__(message)
        self.message = message
        if code is not _Class.DEFAULT:
            self.code = code
        if status is not None:
            self.status = status
        if retryable is not None:
            self.retryable = retryable
        if type is not None:
            self.type = type
        if before_send is not None:
            self.before_send = before_send
        self.param = param
        self.headers = dict(headers or {})
        self._made = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED and "_made" in self.__dict__:
            raise AttributeError(
                f"{name} of a {self.__class__.__name__} is fixed once it is made: "
                "make the error with it, or a copy (with_retryable)"
            )
        super().__setattr__(name, value)

    def with_retryable(self, retryable: bool) -> Self:
        """This error saying ``retryable`` (``x-should-retry``): itself when it says so
        already, else a copy with the same message, status, code and headers. Raise the copy
        ``from`` this one, so the chain keeps where it came from."""
        if retryable == self.retryable:
            return self
        copy = self.__class__.__new__(self.__class__)
        copy.args = self.args
        # The copy's fields are this one's, set beneath the guard: it is made already.
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(retryable=retryable, headers=dict(self.headers))
        return copy

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
    type for it: ``requests`` or ``tokens``; a budget (per day or month) is a quota.
    ``retry_after_s`` None: no wait makes the call fit, so the caller is told not to retry."""

    status = 429
    code = "rate_limit_exceeded"
    retryable = True

    def __init__(
        self, message: str, *, kind: str, retry_after_s: int | None, quota: bool = False
    ) -> None:
        headers: dict[str, str] = {}
        if retry_after_s is not None:
            retry_after_s = max(1, retry_after_s)
            headers = {
                "retry-after": str(retry_after_s),
                "retry-after-ms": str(retry_after_s * 1000),
            }
        # A quota is hours away: the SDK must not sit in a retry loop (it caps retry-after at
        # 60 s and would retry on its own backoff instead).
        super().__init__(
            message,
            headers=headers,
            type=kind,
            code="insufficient_quota" if quota else _Class.DEFAULT,
            retryable=False if quota or retry_after_s is None else None,
        )


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
    error = GatewayError(
        f"Upstream answered {status}: {text}", status=status, code=None, type="upstream_error"
    )
    return error.to_json_for(door)
