"""Which dialect a request speaks, and how that dialect shapes its errors and headers. No I/O.

The path decides: ``/v1/messages`` and below is Anthropic's Messages API, ``/v1beta/models/``
is Gemini's, anything else OpenAI's (the /sim/* control routes and /healthz are none).
Each request is counted under its dialect and its route, a path template such as
``/v1beta/models/{model}:streamGenerateContent``, so a test can compare the simulator's
totals with what a gateway says it sent to each kind of upstream. An error raised anywhere
(``ApiError``, OpenAI's fields) is written at the end in the request's dialect: OpenAI's
``{"error": {message, type, param, code}}``, Anthropic's ``{"type": "error", "error":
{type, message}, "request_id"}`` or Gemini's ``{"error": {code, message, status}}``; a 529
(Anthropic's "overloaded") is a 503 in the two dialects that have no 529.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from . import anthropic, gemini
from .responses import ApiError, api_headers

OPENAI, ANTHROPIC, GEMINI = "openai", "anthropic", "gemini"
MESSAGES, COUNT_TOKENS = "/v1/messages", "/v1/messages/count_tokens"
GEMINI_PREFIX = "/v1beta/models/"
GEMINI_METHODS = ("generateContent", "streamGenerateContent")
OTHER = "other"  # a path no route of the dialect serves (answered 404)
_OPENAI_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/models",
    }
)


@dataclass(frozen=True)
class Route:
    """A request's dialect, its route (a path template), and for Gemini the model that its
    path names (percent-decoded: ``sim%2Fscript%3Dtools`` is ``sim/script=tools``)."""

    dialect: str
    name: str
    model: str | None = None
    method: str | None = None  # Gemini: generateContent or streamGenerateContent


def classify(path: str) -> Route:
    if path in (MESSAGES, COUNT_TOKENS):
        return Route(ANTHROPIC, path)
    if path.startswith(MESSAGES + "/"):
        return Route(ANTHROPIC, OTHER)
    if path.startswith(GEMINI_PREFIX):
        # The model may hold "/" and ":" once decoded; the method follows the last ":".
        model, sep, method = path[len(GEMINI_PREFIX) :].rpartition(":")
        if not sep or not model or method not in GEMINI_METHODS:
            return Route(GEMINI, OTHER)
        return Route(GEMINI, f"{GEMINI_PREFIX}{{model}}:{method}", unquote(model), method)
    if path.startswith("/v1/models/"):
        return Route(OPENAI, "/v1/models/{model}")
    return Route(OPENAI, path if path in _OPENAI_ROUTES else OTHER)


def render_error(dialect: str, err: ApiError, request_id: str) -> tuple[int, dict[str, Any]]:
    """The status and body of ``err`` in ``dialect``."""
    if dialect == ANTHROPIC:
        return err.status, anthropic.error_body(err.status, err.message, request_id)
    if dialect == GEMINI:
        return gemini.status_of(err.status), gemini.error_body(err.status, err.message)
    return (503 if err.status == 529 else err.status), err.to_body()


def headers(dialect: str, request_id: str, requests: int, tokens: int) -> list[tuple[str, str]]:
    """What every answer of ``dialect`` carries besides the simulator's own headers:
    OpenAI's version and rate-limit headers, Anthropic's ``request-id``, nothing for Gemini."""
    if dialect == ANTHROPIC:
        return [("request-id", request_id)]
    if dialect == GEMINI:
        return []
    return api_headers(requests, tokens)
