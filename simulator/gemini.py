"""A script (scripts.py) in Gemini's generateContent dialect, and Gemini's errors. No I/O here.

Non-stream, the answer is a ``GenerateContentResponse``: ``candidates`` (one, ``index`` 0,
``content`` with role ``model`` and its ``parts``, ``finishReason``), ``usageMetadata``,
``modelVersion`` and ``responseId``. Parts: a thought (``{"text", "thought": true}``), its
signature as a part of its own with empty text (``{"text": "", "thoughtSignature"}``, as the
API sends it), text, and a ``functionCall`` (``id``, ``name``, ``args``), whole: Gemini never
splits a call's arguments. Non-stream, a block's pieces are one part.

A stream (``streamGenerateContent?alt=sse``) is one ``data:`` line per chunk, each a whole
``GenerateContentResponse`` holding the parts since the previous chunk, with CRLF line ends as
the API writes them and no ``[DONE]``: one chunk per piece (a tool call is one piece here, so
a Gemini stream has fewer slots than the same script elsewhere); the last piece's chunk
carries ``finishReason`` and ``usageMetadata``. A failure part-way is a chunk
``{"error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}}`` that ends it.

Finish reasons: ``STOP`` (also for an answer that calls tools), ``MAX_TOKENS``, ``SAFETY``.
Errors are ``{"error": {"code", "message", "status"}}``, the status named by the HTTP code
(``STATUSES``); Anthropic's 529 is answered as 503.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .responses import dumps
from .scripts import CONTENT_FILTER, ERROR, LENGTH, OVERLOADED, TOOL_CALLS, Block, Script

FINISH_REASONS = {
    "stop": "STOP",
    LENGTH: "MAX_TOKENS",
    TOOL_CALLS: "STOP",
    CONTENT_FILTER: "SAFETY",
}
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def status_of(status: int) -> int:
    """The HTTP status Gemini answers for one the simulator was asked for."""
    return 503 if status == 529 else status


def error_body(status: int, message: str) -> dict[str, Any]:
    code = status_of(status)
    return {"error": {"code": code, "message": message, "status": STATUSES.get(code, "UNKNOWN")}}


def event(value: Any) -> bytes:
    return b"data: " + dumps(value) + b"\r\n\r\n"


def overloaded_event() -> bytes:
    return event(error_body(503, OVERLOADED))


def usage_metadata(script: Script) -> dict[str, int]:
    u = script.usage
    meta = {
        "promptTokenCount": u.prompt,
        "candidatesTokenCount": u.output - u.thinking,
        "totalTokenCount": u.prompt + u.output,
    }
    if u.cache_read:
        meta["cachedContentTokenCount"] = u.cache_read
    if u.thinking:
        meta["thoughtsTokenCount"] = u.thinking
    return meta


def _call(block: Block) -> dict[str, Any]:
    return {"functionCall": {"id": block.id, "name": block.name, "args": block.arguments()}}


def _stream_parts(script: Script) -> tuple[dict[str, Any], ...]:
    """One part per piece of a stream."""
    parts: list[dict[str, Any]] = []
    for block in script.blocks:
        if block.kind == "tool":
            parts.append(_call(block))
        elif block.kind == "thinking":
            parts.extend({"text": p, "thought": True} for p in block.pieces)
            parts.append({"text": "", "thoughtSignature": block.signature})
        else:
            parts.extend({"text": p} for p in block.pieces)
    return tuple(parts)


def _whole_parts(script: Script) -> list[dict[str, Any]]:
    """A non-stream answer's parts: each block's pieces joined into one part."""
    parts: list[dict[str, Any]] = []
    for block in script.blocks:
        if block.kind == "tool":
            parts.append(_call(block))
        elif block.kind == "thinking":
            parts.append({"text": block.text, "thought": True})
            parts.append({"text": "", "thoughtSignature": block.signature})
        else:
            parts.append({"text": block.text})
    return parts


def _response(
    parts: list[dict[str, Any]], model: str, id: str, script: Script | None
) -> dict[str, Any]:
    """A GenerateContentResponse; with ``script``, the finished one (reason and usage)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: dict[str, Any] = {"candidates": [candidate]}
    if script is not None:
        candidate["finishReason"] = FINISH_REASONS[script.finish]
        out["usageMetadata"] = usage_metadata(script)
    out["modelVersion"] = model
    out["responseId"] = id
    return out


def response(script: Script, id: str, model: str) -> dict[str, Any]:
    """The non-stream answer (a script that fails has none: the caller answers a 503)."""
    return _response(_whole_parts(script), model, id, script)


@dataclass(frozen=True)
class GenerateFramer:
    """The chunks of one streamed answer (see the module docstring)."""

    script: Script
    id: str
    model: str
    pieces: tuple[dict[str, Any], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", _stream_parts(self.script))

    @property
    def opening_first(self) -> bool:
        return False

    def opening(self) -> None:
        return None  # Gemini's first chunk is its first content

    def piece(self, slot: int) -> bytes:
        last = slot == len(self.pieces) - 1 and self.script.finish != ERROR
        finished = self.script if last else None
        return event(_response([self.pieces[slot]], self.model, self.id, finished))

    def closing(self) -> list[bytes]:
        if self.script.finish == ERROR:
            return [overloaded_event()]
        if self.pieces:
            return []  # the last piece's chunk said how it finished
        return [event(_response([{"text": ""}], self.model, self.id, self.script))]

    def failure(self, slot: int) -> list[bytes]:
        del slot
        return [overloaded_event()]
