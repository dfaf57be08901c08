"""Which dialect a request speaks, and how it carries its key and shapes errors and headers.
No I/O here.

The path decides: ``/v1/messages`` and below is Anthropic's Messages API, ``/v1beta/models/``
is Gemini's, anything else OpenAI's (the /sim/* control routes and /healthz are none).
Each request is counted under its dialect and its route, a path template such as
``/v1beta/models/{model}:streamGenerateContent``, so a test can compare the simulator's
totals with what a gateway says it sent to each kind of upstream. An error raised anywhere
(``ApiError``, OpenAI's fields) is written at the end in the request's dialect: OpenAI's
``{"error": {message, type, param, code}}``, Anthropic's ``{"type": "error", "error":
{type, message}, "request_id"}`` or Gemini's ``{"error": {code, message, status}}``; a 529
(Anthropic's "overloaded") is a 503 in the two dialects that have no 529.

The key (``--require-key``): OpenAI's bearer token; Anthropic's ``x-api-key`` or a bearer
token (recent Anthropic SDKs send the key that way); Gemini's ``x-goog-api-key`` header or
``?key=`` query parameter, a missing one refused with 403 and a wrong one with 400, as
Gemini answers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from . import anthropic, gemini
from .http11 import Request
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


def credential(req: Request) -> str:
    """The key a request presents, in whichever dialect's header (or Gemini's ``?key=``);
    "" for none: whose account, and so whose prompt cache, the request is."""
    given = req.header("x-api-key") or req.header("x-goog-api-key") or _bearer(req)
    return given or next(iter(parse_qs(req.query).get("key", [])), "")


def _bearer(req: Request) -> str | None:
    scheme, _, token = (req.header("authorization") or "").partition(" ")
    return token if scheme == "Bearer" else None


def authorise(req: Request, dialect: str, key: str | None) -> None:
    """Raise the dialect's refusal unless ``req`` carries ``key`` (None: no key needed)."""
    if key is None:
        return
    if dialect == ANTHROPIC:
        if key not in (req.header("x-api-key"), _bearer(req)):
            raise ApiError(401, "invalid x-api-key (simulator --require-key)")
    elif dialect == GEMINI:
        given = req.header("x-goog-api-key") or next(iter(parse_qs(req.query).get("key", [])), None)
        if given is None:
            raise ApiError(403, "Method doesn't allow unregistered callers (no API key).")
        if given != key:
            raise ApiError(400, "API key not valid. Please pass a valid API key.")
    elif _bearer(req) != key:
        raise ApiError(
            401,
            "Incorrect API key provided (simulator --require-key).",
            code="invalid_api_key",
        )
