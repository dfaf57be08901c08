"""Anthropic Messages answers as Chat Completions answers. No I/O here.

Rule: each Anthropic event becomes its chat chunks in the ``feed`` call that completes it,
in chat.py's canonical shape, and nothing is lost on the way: every tool-call argument
fragment, every thinking piece and its signature, the cumulative usage.

A stream (named SSE events, each ``data`` repeating its ``type``):

- ``message_start`` -> the role chunk (the chunks' id and model are the message's); its usage
  is noted;
- ``content_block_start``: ``text`` -> nothing unless it has text already; ``tool_use`` -> the
  tool call's first fragment (its index counts tool calls from 0, not Anthropic's block
  index); ``thinking`` -> nothing; ``redacted_thinking`` -> a ``thinking_blocks`` chunk;
- ``content_block_delta``: ``text_delta`` -> content, ``input_json_delta`` -> an argument
  fragment (empty ones skipped), ``thinking_delta`` -> reasoning_content,
  ``signature_delta`` -> a ``thinking_blocks`` signature chunk;
- ``content_block_stop`` of a tool call that got no argument fragment (a call without
  arguments: Anthropic streams ``input: {}`` then ``partial_json: ""``) -> the fragment
  ``{}``, so the arguments are JSON, as the same call's whole answer gives them;
- ``message_delta`` -> its stop reason and usage noted (counts are cumulative);
- ``message_stop`` -> the finish chunk, the usage chunk when asked, ``[DONE]``;
- ``ping`` -> an SSE comment; ``error`` -> one error event, and the stream ends there;
- any other ``content_block_stop``, and any type Anthropic adds later -> nothing.

Usage: prompt_tokens = input + cache read + cache creation tokens (Anthropic counts them
apart), cached_tokens = cache read, cache_write_tokens = cache creation (and
cache_write_1h_tokens its 1-hour part, from ``cache_creation``), completion_tokens = output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.core.errors import UpstreamProtocolError
from app.dialects import chat
from llmgate_wire import sse

_FINISH = {
    "end_turn": chat.STOP,
    "stop_sequence": chat.STOP,
    "pause_turn": chat.STOP,
    "max_tokens": chat.LENGTH,
    "tool_use": chat.TOOL_CALLS,
    "refusal": chat.CONTENT_FILTER,
}
_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
# The split of the written tokens by lifetime (an object of counts), cumulative as they are.
_SPLIT = "cache_creation"
# An error page is kept as the message, but not a whole one.
_MAX_ERROR_TEXT = 2000


def finish_reason(stop_reason: Any) -> str:
    return _FINISH.get(stop_reason, chat.STOP) if isinstance(stop_reason, str) else chat.STOP


def usage(counts: Mapping[str, Any]) -> dict[str, Any]:
    """Chat usage from Anthropic's usage object (missing or null counts are 0); of the
    written tokens, those written for an hour (its ``cache_creation`` split) are kept apart,
    being priced apart."""
    read = counts.get("cache_read_input_tokens") or 0
    created = counts.get("cache_creation_input_tokens") or 0
    prompt = (counts.get("input_tokens") or 0) + read + created
    hour = _object(counts.get("cache_creation")).get("ephemeral_1h_input_tokens") or 0
    output = counts.get("output_tokens") or 0
    return chat.usage(prompt, output, cached=read, cache_creation=created, cache_creation_1h=hour)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class StreamToChat:
    """Anthropic's stream as Chat Completions chunks (the Translator of app/dialects).

    ``close`` always returns b"": a stream that ended as it should ended in the ``feed``
    that completed ``message_stop`` (the end is never held back), and a stream cut short
    gets no ``[DONE]``, so the reader above sees the cut.
    """

    def __init__(
        self, include_usage: bool, created: int, *, max_event_bytes: int | None = None
    ) -> None:
        self._decoder = sse.Decoder(max_event_bytes)
        self._include_usage = include_usage
        self._created = created
        self._writer: chat.ChunkWriter | None = None
        self._tools: dict[Any, int] = {}  # Anthropic's block index -> the tool call's index
        self._empty: set[Any] = set()  # tool blocks that have had no argument fragment yet
        self._stop_reason: Any = None
        self._counts: dict[str, Any] = {}
        self._final_counts = False  # a message_delta's usage came
        self._ended = False

    @property
    def usage_reported(self) -> bool:
        """True once Anthropic's final counts came (a ``message_delta``'s usage; the one in
        ``message_start`` counts no output yet): the usage chunk is Anthropic's own."""
        return self._final_counts

    def feed(self, data: bytes) -> bytes:
        out = []
        for event in [] if self._ended else self._decoder.feed(data):
            out.append(self._event(event))
            if self._ended:  # nothing after message_stop or an error counts
                break
        return b"".join(out)

    def close(self) -> bytes:
        self._decoder.close()
        return b""

    def _event(self, event: sse.Event) -> bytes:
        try:
            data = event.json()
        except ValueError:  # a comment, or no JSON: nothing Anthropic documents
            return b""
        if not isinstance(data, dict):
            return b""
        kind = data.get("type", event.event)
        if kind == "ping":
            return chat.PING
        if kind == "error":
            self._ended = True
            error = _object(data.get("error"))
            message = error.get("message") or "The upstream's stream failed."
            return chat.error_event(str(message), str(error.get("type") or "api_error"))
        if kind == "message_start":
            return self._start(_object(data.get("message")))
        writer = self._writer
        if writer is None:  # before message_start: nothing to attach it to
            return b""
        if kind == "content_block_start":
            return self._block_start(writer, data.get("index"), _object(data.get("content_block")))
        if kind == "content_block_delta":
            return self._delta(writer, data.get("index"), _object(data.get("delta")))
        if kind == "content_block_stop":
            return self._block_stop(writer, data.get("index"))
        if kind == "message_delta":
            self._stop_reason = _object(data.get("delta")).get("stop_reason") or self._stop_reason
            self._final_counts = self._final_counts or isinstance(data.get("usage"), dict)
            self._note(_object(data.get("usage")))
        elif kind == "message_stop":
            self._ended = True
            end = writer.finish(finish_reason(self._stop_reason))
            if self._include_usage:
                end += writer.usage(usage(self._counts))
            return end + chat.DONE
        return b""

    def _start(self, message: dict[str, Any]) -> bytes:
        if self._writer is not None:
            return b""
        self._writer = chat.ChunkWriter(
            str(message.get("id", "")), self._created, str(message.get("model", ""))
        )
        self._note(_object(message.get("usage")))
        return self._writer.role()

    def _note(self, counts: dict[str, Any]) -> None:
        """Anthropic's counts are cumulative: the latest of each is the total so far."""
        for name in _COUNTS:
            value = counts.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                self._counts[name] = value
        if isinstance(counts.get(_SPLIT), dict):
            self._counts[_SPLIT] = counts[_SPLIT]

    def _block_start(self, writer: chat.ChunkWriter, index: Any, block: dict[str, Any]) -> bytes:
        kind = block.get("type")
        if kind == "text":
            return writer.text(block["text"]) if block.get("text") else b""
        if kind == "thinking":
            return writer.reasoning(block["thinking"]) if block.get("thinking") else b""
        if kind == "redacted_thinking":
            return writer.redacted(block.get("data", ""))
        if kind == "tool_use":
            k, first = writer.tool_start(str(block.get("id", "")), str(block.get("name", "")))
            self._tools[index] = k
            if block.get("input"):  # streamed calls start with {}: the input comes in deltas
                first += writer.tool_arguments(k, _arguments(block["input"]))
            else:
                self._empty.add(index)
            return first
        return b""

    def _block_stop(self, writer: chat.ChunkWriter, index: Any) -> bytes:
        """A tool call's block ended without a fragment: its arguments are ``{}``."""
        if not isinstance(index, int) or index not in self._empty:
            return b""
        self._empty.discard(index)
        return writer.tool_arguments(self._tools[index], "{}")

    def _delta(self, writer: chat.ChunkWriter, index: Any, delta: dict[str, Any]) -> bytes:
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return writer.text(delta["text"])
        if kind == "input_json_delta" and delta.get("partial_json") and index in self._tools:
            self._empty.discard(index)
            return writer.tool_arguments(self._tools[index], delta["partial_json"])
        if kind == "thinking_delta" and delta.get("thinking"):
            return writer.reasoning(delta["thinking"])
        if kind == "signature_delta" and delta.get("signature"):
            return writer.signature(delta["signature"])
        return b""


def _arguments(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def answer_to_chat(body: bytes, *, created: int) -> bytes:
    """A whole Messages answer as a ``chat.completion`` JSON body."""
    try:
        answer = json.loads(body)
    except ValueError as e:
        raise UpstreamProtocolError("The Anthropic upstream's answer is not JSON.") from e
    if not isinstance(answer, dict):
        raise UpstreamProtocolError("The Anthropic upstream's answer is not a JSON object.")
    texts, thoughts, blocks, calls = [], [], [], []
    for block in answer.get("content") or []:
        block = _object(block)
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking", "")))
            blocks.append(
                {"type": kind, "thinking": thoughts[-1], "signature": block.get("signature", "")}
            )
        elif kind == "redacted_thinking":
            blocks.append({"type": kind, "data": block.get("data", "")})
        elif kind == "tool_use":
            function = {"name": block.get("name", ""), "arguments": _arguments(block.get("input"))}
            calls.append({"id": block.get("id", ""), "type": "function", "function": function})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    if blocks:
        message["reasoning_content"] = "".join(thoughts)
        message["thinking_blocks"] = blocks
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason(answer.get("stop_reason")),
    }
    return chat.dumps(
        {
            "id": answer.get("id", ""),
            "object": "chat.completion",
            "created": created,
            "model": answer.get("model", ""),
            "choices": [choice],
            "usage": usage(_object(answer.get("usage"))),
        }
    )


def error_to_chat(status: int, body: bytes) -> tuple[int, bytes]:
    """An Anthropic error answer as (status, OpenAI error JSON). The message and type are
    Anthropic's; a body that is not Anthropic's error JSON (a proxy's HTML page) is the
    message itself. 529 (overloaded) becomes 503, which callers and SDKs retry."""
    try:
        error = _object(_object(json.loads(body)).get("error"))
    except ValueError:
        error = {}
    message = error.get("message")
    if not isinstance(message, str) or not message:
        text = body.decode("utf-8", errors="replace").strip()[:_MAX_ERROR_TEXT]
        message = text or f"The Anthropic upstream answered HTTP {status}."
    kind = error.get("type")
    kind = kind if isinstance(kind, str) and kind else "api_error"
    return (503 if status == 529 else status), chat.dumps(chat.error_body(message, kind))
