"""Gemini's answers as Chat Completions: a stream chunk by chunk, a whole answer, an error.
No I/O here.

Each ``data:`` of Gemini's ``alt=sse`` stream is a whole GenerateContentResponse; its parts are
translated in order into chat.py's canonical chunks as they arrive, never held for a later
chunk. One choice only (the request never asks for more: request_to_gemini refuses ``n`` > 1).

Gemini's stream has no end event: the chunk with ``finishReason`` is its last but for usage,
and the end of the body is the end of the stream. So the finish chunk leaves with that chunk;
the usage chunk and ``[DONE]`` leave with it too when it carries ``usageMetadata`` (Gemini's
last chunk does), or when the caller wants no usage; otherwise they wait for a later chunk
with usage or for ``close()``. A body that ends before any ``finishReason`` was cut short:
``close()`` adds nothing, and the reader above sees the cut.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.dialects import chat
from llmgate_wire import sse

# Gemini's finish reasons that mean the answer was stopped by a filter.
FILTERED = {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"}


def finish_reason(reason: str, called: bool) -> str:
    """Chat's finish reason for Gemini's; ``called``: the answer holds a function call (Gemini
    says STOP after one, where Chat Completions says tool_calls)."""
    if reason == "MAX_TOKENS":
        return chat.LENGTH
    if reason in FILTERED:
        return chat.CONTENT_FILTER
    return chat.TOOL_CALLS if reason == "STOP" and called else chat.STOP


def chat_usage(meta: dict[str, Any]) -> dict[str, Any]:
    """Chat usage of a usageMetadata: the thoughts are completion tokens (billed as output),
    and promptTokenCount already counts the cached ones."""
    thoughts = meta.get("thoughtsTokenCount")
    return chat.usage(
        _count(meta, "promptTokenCount"),
        _count(meta, "candidatesTokenCount") + _count(meta, "thoughtsTokenCount"),
        cached=_count(meta, "cachedContentTokenCount"),
        reasoning=_count(meta, "thoughtsTokenCount") if thoughts is not None else None,
    )


def _count(meta: dict[str, Any], name: str) -> int:
    value = meta.get(name)
    return value if isinstance(value, int) else 0


def _candidate(response: dict[str, Any]) -> dict[str, Any] | None:
    candidates = response.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        return candidates[0]
    return None


def _reason(response: dict[str, Any]) -> str | None:
    """Gemini's finish reason in this response; a prompt blocked before any answer (no
    candidate, a promptFeedback.blockReason) is a filtered one."""
    candidate = _candidate(response)
    if candidate is None:
        feedback = response.get("promptFeedback")
        blocked = isinstance(feedback, dict) and feedback.get("blockReason")
        return "SAFETY" if blocked else None
    reason = candidate.get("finishReason")
    return reason if reason and reason != "FINISH_REASON_UNSPECIFIED" else None


def pieces(response: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """What a response's parts say, in order: ("text" | "reasoning", text), ("call",
    functionCall), ("signature", thoughtSignature). A thought's signature comes after its
    text; the signature Gemini puts on the answer's text or function call (the thinking
    before it signed) comes before that part's piece, as a thinking block's signature ends
    the block before the answer goes on (so the ``/v1/messages`` door writes the block whole,
    signed, then the text). Other parts (inline data, code execution) have no place in a chat
    answer."""
    candidate = _candidate(response) or {}
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        call, text = part.get("functionCall"), part.get("text")
        signature = part.get("thoughtSignature")
        signed = isinstance(signature, str) and signature != ""
        thought = bool(part.get("thought"))
        if signed and not thought:
            yield "signature", signature
        if isinstance(call, dict):
            yield "call", call
        elif isinstance(text, str) and text:
            yield ("reasoning" if thought else "text"), text
        if signed and thought:
            yield "signature", signature


def arguments(call: dict[str, Any]) -> str:
    """A functionCall's args (Gemini sends them whole) as the one arguments fragment."""
    return json.dumps(call.get("args") or {}, separators=(",", ":"), ensure_ascii=False)


def call_id(call: dict[str, Any], fallback_id: str, index: int) -> str:
    return _string(call.get("id")) or f"call_{fallback_id}_{index}"


def _string(value: Any) -> str:
    """A member that should be a string, "" when it is anything else."""
    return value if isinstance(value, str) else ""


class StreamToChat:
    """A Translator (app/dialects/__init__.py): Gemini's ``alt=sse`` body in, the canonical
    Chat Completions stream out (chat.py). The answer's id is its ``responseId`` (else
    ``fallback_id``), its model the ``modelVersion``. Gemini's stream has no end event: the
    end of its body is the end, so ``close()`` gives the usage and ``[DONE]`` when the chunk
    with ``finishReason`` came without usage (see the module's docstring)."""

    def __init__(self, include_usage: bool, created: int, fallback_id: str) -> None:
        self.include_usage, self.created, self.fallback_id = include_usage, created, fallback_id
        self._decoder = sse.Decoder()
        self._writer: chat.ChunkWriter | None = None
        self._usage: dict[str, Any] | None = None  # the latest usageMetadata
        self._finished = False  # the finish chunk went out: only usage may follow
        self._called = False  # a function call went out
        self._ended = False  # [DONE] or an error went out: nothing more

    @property
    def usage_reported(self) -> bool:
        """True once a ``usageMetadata`` came: the usage chunk is Gemini's own count."""
        return self._usage is not None

    def feed(self, data: bytes) -> bytes:
        out = []
        for event in self._decoder.feed(data):
            if not self._ended:
                out += self._event(event)
        return b"".join(out)

    def close(self) -> bytes:
        self._decoder.close()  # an unfinished event is not dispatched (SSE): the cut shows
        return self._end() if self._finished and not self._ended else b""

    def _event(self, event: sse.Event) -> list[bytes]:
        """The chunks one event of Gemini's stream gives."""
        try:
            response = event.json()
        except ValueError:
            return []  # a comment, or data that is no response: nothing to say
        if not isinstance(response, dict):
            return []
        error = response.get("error")
        if error is not None:
            self._ended = True
            return [chat.error_event(*_error_of(error))]
        out = []
        if self._writer is None:
            ident = _string(response.get("responseId")) or self.fallback_id
            model = _string(response.get("modelVersion"))
            self._writer = chat.ChunkWriter(ident, self.created, model)
            out.append(self._writer.role())
        has_usage = isinstance(response.get("usageMetadata"), dict)
        if has_usage:
            self._usage = response["usageMetadata"]
        if self._finished:  # a chunk after the finish: only its usage counts
            return [*out, self._end()] if has_usage else out
        out += [self._piece(self._writer, kind, value) for kind, value in pieces(response)]
        reason = _reason(response)
        if reason is not None:
            self._finished = True
            out.append(self._writer.finish(finish_reason(reason, self._called)))
            if has_usage or not self.include_usage:
                out.append(self._end())
        return out

    def _piece(self, writer: chat.ChunkWriter, kind: str, value: Any) -> bytes:
        if kind == "text":
            return writer.text(value)
        if kind == "reasoning":
            return writer.reasoning(value)
        if kind == "signature":
            return writer.signature(value)
        self._called = True
        ident = call_id(value, self.fallback_id, writer.tools)
        index, start = writer.tool_start(ident, _string(value.get("name")))
        return start + writer.tool_arguments(index, arguments(value))

    def _end(self) -> bytes:
        self._ended = True
        usage = b""
        if self.include_usage and self._usage is not None and self._writer is not None:
            usage = self._writer.usage(chat_usage(self._usage))
        return usage + chat.DONE


def answer_to_chat(body: bytes, *, created: int, fallback_id: str) -> bytes:
    """A whole GenerateContentResponse as a chat.completion (raises ValueError when ``body``
    is not JSON). ``thinking_blocks`` holds each signature with the thought text before it
    (since the previous signature): a thinking block whole, as a message carries one."""
    response = json.loads(body)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    signed = 0  # thoughts[:signed] belong to the blocks already made
    for kind, value in pieces(response):
        if kind == "text":
            texts.append(value)
        elif kind == "reasoning":
            thoughts.append(value)
        elif kind == "signature":
            thinking, signed = "".join(thoughts[signed:]), len(thoughts)
            blocks.append({"type": "thinking", "thinking": thinking, "signature": value})
        else:
            function = {"name": _string(value.get("name")), "arguments": arguments(value)}
            ident = call_id(value, fallback_id, len(calls))
            calls.append({"id": ident, "type": "function", "function": function})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": None,
    }
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if blocks:
        message["thinking_blocks"] = blocks
    if calls:
        message["tool_calls"] = calls
    completion: dict[str, Any] = {
        "id": _string(response.get("responseId")) or fallback_id,
        "object": "chat.completion",
        "created": created,
        "model": _string(response.get("modelVersion")),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(_reason(response) or "STOP", bool(calls)),
            }
        ],
    }
    if isinstance(response.get("usageMetadata"), dict):
        completion["usage"] = chat_usage(response["usageMetadata"])
    return chat.dumps(completion)


def _error_of(error: Any) -> tuple[str, str]:
    """(message, type) of Gemini's ``error`` member: its ``status`` lower-cased is the type
    (``RESOURCE_EXHAUSTED`` -> ``resource_exhausted``)."""
    if not isinstance(error, dict):
        return str(error), "api_error"
    status = error.get("status")
    message = error.get("message")
    return (
        message if isinstance(message, str) and message else json.dumps(error),
        status.lower() if isinstance(status, str) and status else "api_error",
    )


def error_to_chat(status: int, body: bytes) -> tuple[int, bytes]:
    """Gemini's error answer (``{"error": {"code", "message", "status"}}``, or a list of one
    such object) as OpenAI's error JSON, its status kept; any other body's text is the
    message."""
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, dict) and isinstance(value.get("error"), dict):
        message, type = _error_of(value["error"])
    else:
        text = body.decode("utf-8", errors="replace").strip()
        message, type = text or f"the upstream answered {status}", "api_error"
    return status, chat.dumps(chat.error_body(message, type))
