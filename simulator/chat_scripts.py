"""A script (scripts.py) in OpenAI's Chat Completions dialect. No I/O here.

This is the canonical shape of a translated stream that the gateway's translators write
(app/dialects/chat.py's docstring), written here without importing the gateway, so a test
can compare what the gateway makes of an Anthropic or Gemini answer with the same answer
from an OpenAI upstream, chunk for chunk:

1. the role chunk, ``delta: {"role": "assistant", "content": ""}``;
2. one chunk per piece: ``{"reasoning_content": t, "thinking_blocks": [{"index": b, "type":
   "thinking", "thinking": t}]}``, ``{"thinking_blocks": [{"index": b, "type": "thinking",
   "thinking": "", "signature": s}]}``, ``{"content": t}``, a tool call's first
   fragment ``{"tool_calls": [{"index": k, "id", "type": "function", "function": {"name",
   "arguments": ""}}]}`` (written with its first argument fragment, at the same moment) and
   each argument fragment ``{"tool_calls": [{"index": k, "function": {"arguments": f}}]}``;
3. the finish chunk, ``delta: {}`` and the finish reason;
4. the usage chunk (``choices: []``) when ``stream_options.include_usage`` asked for it;
5. ``data: [DONE]``.

Chunks carry no ``usage: null``. A script that fails part-way (``overload``), and the
``error-after`` fault, end with one ``data: {"error": {...}}`` event of type
``overloaded_error`` and no ``[DONE]``. Non-stream, the answer is a ``chat.completion``
whose message holds the text, the tool calls, and for a script that thinks
``reasoning_content`` and ``thinking_blocks`` (each block whole, with its signature).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .responses import DONE, sse
from .scripts import ERROR, OVERLOADED, Script, Step


def usage(script: Script) -> dict[str, Any]:
    """The usage object app/dialects/chat.py's ``usage()`` writes for these counts; reasoning
    tokens are named when the script thinks."""
    u = script.usage
    details: dict[str, Any] = {"cached_tokens": u.cache_read}
    if u.cache_creation:
        details["cache_write_tokens"] = u.cache_creation
    out: dict[str, Any] = {
        "prompt_tokens": u.prompt,
        "completion_tokens": u.output,
        "total_tokens": u.prompt + u.output,
        "prompt_tokens_details": details,
    }
    if script.of_kind("thinking"):
        out["completion_tokens_details"] = {"reasoning_tokens": u.thinking}
    return out


def error_body(message: str = OVERLOADED) -> dict[str, Any]:
    return {"error": {"message": message, "type": "overloaded_error", "param": None, "code": None}}


def _tool_call(block_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": block_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(script: Script, id: str, created: int, model: str) -> dict[str, Any]:
    """The non-stream ``chat.completion`` (a script that fails has none: see app.py)."""
    text = script.text
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not script.of_kind("tool") else None,
        "refusal": None,
    }
    thinking = script.of_kind("thinking")
    if thinking:
        message["reasoning_content"] = script.thinking
        message["thinking_blocks"] = [
            {"type": "thinking", "thinking": b.text, "signature": b.signature} for b in thinking
        ]
    tools = script.of_kind("tool")
    if tools:
        message["tool_calls"] = [_tool_call(b.id, b.name, b.text) for b in tools]
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": script.finish}
        ],
        "usage": usage(script),
    }


@dataclass(frozen=True)
class ScriptChatFramer:
    """The chunks of one scripted Chat Completions stream (see the module docstring)."""

    script: Script
    id: str
    created: int
    model: str
    include_usage: bool
    pieces: tuple[Step, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", self.script.steps())

    @property
    def opening_first(self) -> bool:
        return False  # the role chunk comes with the first piece, after the TTFT

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({**self._head(), "choices": [choice]})

    def opening(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def piece(self, slot: int) -> bytes:
        step = self.pieces[slot]
        # Each thinking block has its own index, as the OpenAI SDK's accumulator wants: its
        # pieces and its signature merge into one block there.
        index = sum(1 for p in self.pieces[:slot] if p.kind == "signature")
        if step.kind == "thinking":
            entry = {"index": index, "type": "thinking", "thinking": step.value}
            return self._chunk({"reasoning_content": step.value, "thinking_blocks": [entry]})
        if step.kind == "signature":
            signed = {"index": index, "type": "thinking", "thinking": "", "signature": step.value}
            return self._chunk({"thinking_blocks": [signed]})
        if step.kind == "text":
            return self._chunk({"content": step.value})
        index = self._tool_index(step.block)
        fragment = self._chunk(
            {"tool_calls": [{"index": index, "function": {"arguments": step.value}}]}
        )
        if not step.first:
            return fragment
        block = self.script.blocks[step.block]
        start = {"index": index, **_tool_call(block.id, block.name, "")}
        return self._chunk({"tool_calls": [start]}) + fragment

    def _tool_index(self, block: int) -> int:
        """The call's index among the answer's tool calls, counted from 0."""
        return sum(1 for b in self.script.blocks[:block] if b.kind == "tool")

    def closing(self) -> list[bytes]:
        if self.script.finish == ERROR:
            return [sse(error_body())]
        events = [self._chunk({}, self.script.finish)]
        if self.include_usage:
            events.append(sse({**self._head(), "choices": [], "usage": usage(self.script)}))
        events.append(DONE)
        return events

    def failure(self, slot: int) -> list[bytes]:
        """The ``error-after`` fault: the same overloaded error a failing script ends with."""
        del slot
        return [sse(error_body())]
