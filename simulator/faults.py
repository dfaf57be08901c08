"""The API errors that the error faults answer. No I/O here: a fault in, an ``ApiError`` out.

Each is raised with OpenAI's fields and written in the request's dialect (dialects.py), so
one fault means the same thing on every route: ``429`` a rate limit and ``503``/``529`` an
overload, both with ``retry-after`` (whole seconds, RFC 9110 10.2.3) and ``retry-after-ms``;
``401`` a refused key; ``redirect`` a 307 to another host; ``500`` (and ``error-after`` on
an answer that is not streamed, which cannot fail part-way) a server error.
"""

from __future__ import annotations

import math

from .behaviour import Behaviour
from .responses import ApiError
from .scripts import OVERLOADED


def fault_error(fault: str, b: Behaviour) -> ApiError:
    retry = (
        ("retry-after", str(math.ceil(b.retry_after))),
        ("retry-after-ms", str(round(b.retry_after * 1000))),
    )
    if fault == "429":
        return ApiError(
            429,
            "Rate limit reached (simulated). Please try again later.",
            "requests",
            code="rate_limit_exceeded",
            headers=retry,
        )
    if fault == "503":
        message = "The server is overloaded (simulated). Please try again later."
        return ApiError(503, message, "server_error", headers=retry)
    if fault == "529":
        return ApiError(529, OVERLOADED, "overloaded_error", headers=retry)
    if fault == "401":
        return ApiError(401, "Incorrect API key provided (simulated).", code="invalid_api_key")
    if fault == "redirect":
        moved = (("location", "http://elsewhere.invalid/v1/chat/completions"),)
        return ApiError(307, "Moved (simulated).", code="moved", headers=moved)
    return ApiError(
        500, "The server had an error processing your request (simulated).", "server_error"
    )
