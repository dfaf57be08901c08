"""A Chat Completions answer as an Anthropic Messages answer (the ``/v1/messages`` door over
an OpenAI upstream): the whole message, its stop reason and usage, and Anthropic's errors.
No I/O here: bytes in, bytes out; the message's id is passed in.

- Stop reasons: ``stop`` is ``end_turn`` (a stop sequence cannot be told apart from it, and
  ``stop_sequence`` stays null), ``length`` is ``max_tokens``, ``tool_calls`` is
  ``tool_use``, ``content_filter`` is ``refusal``. An answer with tool calls stops on
  ``tool_use`` whatever its finish reason says: some servers finish such an answer with
  ``stop``, and an Anthropic caller runs its tools only on ``tool_use``.
- Usage: Anthropic counts the prompt's uncached tokens apart from those read from and
  written to the cache, so ``input_tokens`` = ``prompt_tokens`` - ``cached_tokens`` -
  ``cache_write_tokens`` (the names chat.usage writes, and the OpenAI SDK's usage type
  reads; ``cache_creation_tokens``, the name this gateway wrote before, is read too, from an
  upstream that is an older gateway), and ``cache_write_1h_tokens`` (the 1-hour part of the
  writes, which an Anthropic upstream's answer carried) is ``cache_creation``'s split again.
- Content: thinking blocks first (``thinking_blocks`` whole, or ``reasoning_content`` as one
  block), then the text (OpenAI's ``refusal`` text too: the finish reason says whether it
  was one), then a ``tool_use`` block per tool call. Arguments that are not a JSON object
  become ``{"_unparsed_arguments": <the text>}``, never ``{}``: an empty input would run the
  tool as if the model had asked for its defaults, while a member the tool does not know
  fails where the caller sees it, and sending the message back gives the model its text.
- Errors: ``{"type": "error", "error": {"type", "message"}}``, the type from the status as
  Anthropic's API documents them (400 invalid_request_error, 401 authentication_error, 402
  billing_error, 403 permission_error, 404 not_found_error, 409 conflict_error, 413
  request_too_large, 429 rate_limit_error, 504 timeout_error, 529 overloaded_error, 500
  api_error; another 4xx is invalid_request_error, another 5xx api_error). A 503 is
  overloaded_error: the gateway answers it when it has no room now, and it is what an
  Anthropic upstream's 529 becomes on the way in.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from app.core.errors import ANTHROPIC_TYPES, UpstreamProtocolError, anthropic_body
from app.dialects import chat

UNPARSED = "_unparsed_arguments"

_STOP_REASONS = {
    chat.STOP: "end_turn",
    chat.LENGTH: "max_tokens",
    chat.TOOL_CALLS: "tool_use",
    "function_call": "tool_use",  # the tool call's finish reason before tool_calls
    chat.CONTENT_FILTER: "refusal",
}
ERROR_TYPES = frozenset(ANTHROPIC_TYPES.values()) | {"api_error"}
# OpenAI's and other servers' error types and codes that name one of Anthropic's.
_OPENAI_ERROR_TYPES = {
    "server_error": "api_error",
    "upstream_error": "api_error",
    "rate_limit_exceeded": "rate_limit_error",
    "requests": "rate_limit_error",
    "tokens": "rate_limit_error",
    "insufficient_quota": "billing_error",
    # Gemini's error statuses, as its stream translator names them (lower-cased): a Gemini
    # upstream's error part-way reads as the same error from any upstream.
    "invalid_argument": "invalid_request_error",
    "failed_precondition": "invalid_request_error",
    "unauthenticated": "authentication_error",
    "permission_denied": "permission_error",
    "not_found": "not_found_error",
    "resource_exhausted": "rate_limit_error",
    "internal": "api_error",
    "unavailable": "overloaded_error",
    "deadline_exceeded": "timeout_error",
}


def stop_reason(finish_reason: Any, tool_calls: bool) -> str:
    """Anthropic's stop reason for a Chat Completions finish reason (``tool_calls``: the
    answer made tool calls); an unknown or missing one is end_turn."""
    if tool_calls:
        return "tool_use"
    if not isinstance(finish_reason, str):
        return "end_turn"
    return _STOP_REASONS.get(finish_reason, "end_turn")


def usage(chat_usage: Any) -> dict[str, Any]:
    """Anthropic's usage for a Chat Completions usage object (zeros where it has none)."""
    got = chat_usage if isinstance(chat_usage, dict) else {}
    details = got.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    cached = _count(details.get("cached_tokens"))
    written = details.get("cache_write_tokens", details.get("cache_creation_tokens"))
    creation = _count(written)
    out: dict[str, Any] = {
        "input_tokens": max(0, _count(got.get("prompt_tokens")) - cached - creation),
        "output_tokens": _count(got.get("completion_tokens")),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": creation,
    }
    hour = min(_count(details.get("cache_write_1h_tokens")), creation)
    if hour:
        split = {"ephemeral_5m_input_tokens": creation - hour, "ephemeral_1h_input_tokens": hour}
        out["cache_creation"] = split
    return out


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as a tool_use block's input (see the module's docstring)."""
    text = arguments if isinstance(arguments, str) else ""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {UNPARSED: text}


def chat_answer_to_message(body: bytes, *, message_id: str) -> bytes:
    """The Anthropic message for a ``chat.completion`` body (its first choice)."""
    try:
        answer = json.loads(body)
        choice = answer["choices"][0]
        message = choice["message"]
    except (ValueError, LookupError, TypeError) as e:
        raise UpstreamProtocolError("the upstream's answer is not a chat completion") from e
    if not isinstance(message, dict):
        raise UpstreamProtocolError("the upstream's answer is not a chat completion")
    calls = [c for c in _list(message.get("tool_calls")) if isinstance(c, dict)]
    content = _thinking(message)
    for text in (message.get("content"), message.get("refusal")):
        if isinstance(text, str) and text:
            content.append({"type": "text", "text": text})
    for call in calls:
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": tool_input(function.get("arguments")),
            }
        )
    return chat.dumps(
        {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": answer.get("model"),
            "content": content,
            "stop_reason": stop_reason(choice.get("finish_reason"), bool(calls)),
            "stop_sequence": None,
            "usage": usage(answer.get("usage")),
        }
    )


def _thinking(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The thinking blocks of an answer: its ``thinking_blocks`` as they are; its
    ``reasoning_content`` put in the first thinking block when none carries the text
    (some servers send the text there and the signatures alone)."""
    blocks: list[dict[str, Any]] = []
    for block in _list(message.get("thinking_blocks")):
        if isinstance(block, dict) and block.get("type") == "redacted_thinking":
            blocks.append({"type": "redacted_thinking", "data": block.get("data", "")})
        elif isinstance(block, dict) and block.get("type") == "thinking":
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": block.get("thinking") or "",
                    "signature": block.get("signature") or "",
                }
            )
    reasoning = message.get("reasoning_content")
    thinking = [b for b in blocks if b["type"] == "thinking"]
    if isinstance(reasoning, str) and reasoning and not any(b["thinking"] for b in thinking):
        if thinking:
            thinking[0]["thinking"] = reasoning
        else:
            blocks.insert(0, {"type": "thinking", "thinking": reasoning, "signature": ""})
    return blocks


def error_body(status: int, message: str, type: str | None = None) -> bytes:
    """Anthropic's error body: ``type`` or the one the status says (app/core/errors.py)."""
    return chat.dumps(anthropic_body(status, message, type))


def error_event(status: int, message: str, type: str | None = None) -> bytes:
    """Anthropic's ``error`` event, how a stream that began ends on an error."""
    return b"event: error\ndata: " + error_body(status, message, type) + b"\n\n"


def error_from_chat(status: int, body: bytes) -> bytes:
    """Anthropic's error body for an OpenAI-shaped error answer (or any text): its message
    kept, the type from the status."""
    return error_body(status, error_message(body) or _phrase(status))


def error_message(body: bytes) -> str:
    """The message of an OpenAI error body; the text itself when it is not one."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    error = value.get("error", value) if isinstance(value, dict) else value
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return error if isinstance(error, str) else text


def stream_error_type(error: Any) -> str:
    """Anthropic's error type for the ``error`` of an OpenAI stream's error event (it has no
    status): its type or code when either is Anthropic's, or names one (OpenAI's names and
    Gemini's statuses: ``unavailable``, an overload, is ``overloaded_error``, as an OpenAI
    upstream's overload is); else api_error."""
    got = error if isinstance(error, dict) else {}
    for name in (got.get("type"), got.get("code")):
        if not isinstance(name, str):
            continue
        if name in ERROR_TYPES:
            return str(name)
        if name in _OPENAI_ERROR_TYPES:
            return _OPENAI_ERROR_TYPES[name]
    return "api_error"


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"
