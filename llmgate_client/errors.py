"""The client's error tree. Every failure a caller can see is one of these.

Errors are translated once: the transport turns urllib3 and socket exceptions into
``APIConnectionError``/``APITimeoutError``; ``from_response`` turns an HTTP error response into
an ``APIStatusError`` subclass chosen by status; ``from_event`` turns a mid-stream error event
into a ``StreamError``. Nothing else constructs errors from foreign exceptions.

    LLMGateError                     .message .status .type .code .param .request_id .attempts
    ├── APIConnectionError           no usable response: refused, reset, DNS, TLS
    │   └── APITimeoutError          connect, idle-read or pool-wait timeout
    │       └── DeadlineExceeded     the call's total deadline cut it off
    ├── APIStatusError               an HTTP error status (>= 400), parsed from the OpenAI body
    │   ├── BadRequestError 400, AuthenticationError 401, PermissionDeniedError 403,
    │   │   NotFoundError 404, RequestTooLargeError 413, UnprocessableEntityError 422,
    │   │   RateLimitError 429
    │   └── InternalServerError 5xx
    │       └── BadGatewayError 502, ServiceUnavailableError 503, GatewayTimeoutError 504
    └── APIResponseError             a 2xx whose body is unusable (not JSON, bad SSE)
        ├── StreamError              the gateway sent an error event mid-stream
        └── IncompleteStreamError    the stream ended (or broke) before ``[DONE]``
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any


class LLMGateError(Exception):
    """Base of every client error. ``attempts`` counts the HTTP attempts the call made."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        request_id: str | None = None,
        body: Any = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.type = type
        self.code = code
        self.param = param
        self.request_id = request_id
        self.body = body
        self.attempts = attempts

    def __str__(self) -> str:
        parts = [self.message]
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.type:
            parts.append(f"type={self.type}")
        if self.request_id:
            parts.append(f"request_id={self.request_id}")
        if self.attempts != 1:
            parts.append(f"attempts={self.attempts}")
        return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the batch CLI writes it as the error line)."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "status": self.status,
            "type": self.type,
            "code": self.code,
            "request_id": self.request_id,
            "attempts": self.attempts,
        }


class APIConnectionError(LLMGateError):
    """No usable response. ``request_sent`` is False when the request cannot have reached the
    server (connection refused, DNS failure, connect timeout, no free pooled connection): only
    then is a retry free of double-billing risk."""

    def __init__(self, message: str, *, request_sent: bool, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.request_sent = request_sent


class APITimeoutError(APIConnectionError):
    """A connect, idle-read or pool-wait timeout."""


class DeadlineExceeded(APITimeoutError):
    """The call's total deadline expired. ``last_error`` is the previous attempt's error."""

    def __init__(self, message: str, *, last_error: LLMGateError | None = None, **kw: Any) -> None:
        kw.setdefault("request_sent", True)
        super().__init__(message, **kw)
        self.last_error = last_error


class APIStatusError(LLMGateError):
    """The gateway answered with an error status (its OpenAI error body parsed)."""

    def __init__(self, message: str, *, headers: Mapping[str, str] | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.headers: Mapping[str, str] = dict(headers or {})


class BadRequestError(APIStatusError):
    status = 400


class AuthenticationError(APIStatusError):
    status = 401


class PermissionDeniedError(APIStatusError):
    status = 403


class NotFoundError(APIStatusError):
    status = 404


class RequestTooLargeError(APIStatusError):
    status = 413


class UnprocessableEntityError(APIStatusError):
    status = 422


class RateLimitError(APIStatusError):
    status = 429


class InternalServerError(APIStatusError):
    status = 500


class BadGatewayError(InternalServerError):
    status = 502


class ServiceUnavailableError(InternalServerError):
    status = 503


class GatewayTimeoutError(InternalServerError):
    status = 504


class APIResponseError(LLMGateError):
    """A successful status whose body the client cannot use."""


class StreamError(APIResponseError):
    """The gateway reported an error after the stream started (one final error event)."""


class IncompleteStreamError(APIResponseError):
    """The stream ended, or the connection broke, before ``[DONE]`` and without an error event."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    cls.status: cls
    for cls in (
        BadRequestError,
        AuthenticationError,
        PermissionDeniedError,
        NotFoundError,
        RequestTooLargeError,
        UnprocessableEntityError,
        RateLimitError,
        InternalServerError,
        BadGatewayError,
        ServiceUnavailableError,
        GatewayTimeoutError,
    )
}


def _error_fields(payload: Any) -> dict[str, Any]:
    """The OpenAI ``{"error": {message, type, param, code}}`` fields, tolerating odd shapes."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, str):
        return {"message": err}
    if not isinstance(err, dict):
        return {}
    fields: dict[str, Any] = {}
    for name in ("message", "type", "param", "code"):
        value = err.get(name)
        if value is not None:
            fields[name] = value if name == "message" else str(value)
    return fields


def from_response(
    status: int, body: bytes, headers: Mapping[str, str], *, attempts: int = 1
) -> APIStatusError:
    """Translate an HTTP error response (any body, OpenAI-shaped or not) into the tree."""
    payload: Any = None
    with contextlib.suppress(ValueError):
        payload = json.loads(body)
    fields = _error_fields(payload)
    message = str(fields.pop("message", "") or "")
    if not message:
        text = body.decode("utf-8", errors="replace").strip()
        message = text[:200] if text and payload is None else f"HTTP {status}"
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = InternalServerError if status >= 500 else APIStatusError
    return cls(
        message,
        status=status,
        request_id=headers.get("x-request-id"),
        body=payload if payload is not None else body,
        headers=headers,
        attempts=attempts,
        **fields,
    )


def from_event(payload: Any, *, request_id: str | None, attempts: int) -> StreamError | None:
    """A StreamError when ``payload`` (one decoded SSE data object) is an error event."""
    if not isinstance(payload, dict) or "error" not in payload:
        return None
    fields = _error_fields(payload)
    message = str(fields.pop("message", "") or "error event in stream")
    return StreamError(message, request_id=request_id, body=payload, attempts=attempts, **fields)
