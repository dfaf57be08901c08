"""The Responses API: its response object and its typed event stream. No I/O here.

A stream follows the OpenAI API reference ("Responses streaming events") in this order:
``response.created`` and ``response.in_progress`` (the object so far, no output), then
``response.output_item.added`` and, for a message, ``response.content_part.added``, one
``response.output_text.delta`` per token, ``response.output_text.done`` and
``response.content_part.done``; for a function call one
``response.function_call_arguments.delta`` per fragment of the arguments and
``response.function_call_arguments.done``; then ``response.output_item.done`` and the
terminal ``response.completed`` carrying the whole object with its usage. Every event is an
``event: <type>`` line and a ``data:`` line whose JSON repeats ``type`` and counts
``sequence_number`` from 0. There is no ``data: [DONE]``. A failure part-way is a terminal
``response.failed`` whose response carries the error (what the API sends when generation
fails after it started).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .responses import Completion, dumps, obfuscation

FAILED_MESSAGE = "The server had an error while processing your request (simulated)."


@dataclass(frozen=True)
class Output:
    """What the model produced: a message (text tokens) or a function call (fragments)."""

    item_id: str
    pieces: tuple[str, ...]
    call: tuple[str, str] | None = None  # (call_id, function name) for a function call

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def function_call(item_id: str, call_id: str, name: str, words: tuple[str, ...]) -> Output:
    """A call of ``name`` whose JSON arguments are streamed a word at a time."""
    pieces = ('{"query":"', *(json.dumps(w)[1:-1] for w in words), '"}')
    return Output(item_id, pieces, (call_id, name))


def first_function(tools: Any) -> str | None:
    """The name of the first function tool of a request, if it has one."""
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "function":
            name = tool.get("name")
            if isinstance(name, str) and name:
                return name
    return None


def usage(c: Completion, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {"cached_tokens": min(cached_tokens, c.prompt_tokens)},
        "output_tokens": len(c.tokens),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.prompt_tokens + len(c.tokens),
    }


def item(output: Output, status: str, *, text: str | None = None) -> dict[str, Any]:
    """The output item in ``status``; ``text`` is what it holds so far (all when done)."""
    text = output.text if text is None else text
    if output.call is not None:
        call_id, name = output.call
        return {
            "id": output.item_id,
            "type": "function_call",
            "status": status,
            "arguments": text,
            "call_id": call_id,
            "name": name,
        }
    content = [] if status == "in_progress" else [_part(text)]
    return {
        "id": output.item_id,
        "type": "message",
        "status": status,
        "content": content,
        "role": "assistant",
    }


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


@dataclass(frozen=True)
class ResponseShape:
    """The fields of one response object that do not change while it streams."""

    completion: Completion
    output: Output
    service_tier: str = "default"
    store: bool = True
    cached_tokens: int = 0
    echo: tuple[tuple[str, Any], ...] = ()  # request fields the object repeats

    def object(self, status: str, *, error: dict[str, Any] | None = None) -> dict[str, Any]:
        c = self.completion
        done = status == "completed"
        obj: dict[str, Any] = {
            "id": c.id,
            "object": "response",
            "created_at": c.created,
            "status": status,
            "error": error,
            "incomplete_details": None,
            "model": c.model,
            "output": [item(self.output, "completed")] if done else [],
            "parallel_tool_calls": True,
            "service_tier": self.service_tier,
            "store": self.store,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage(c, self.cached_tokens) if done else None,
        }
        obj.update(self.echo)
        return obj


def response_object(shape: ResponseShape) -> dict[str, Any]:
    """The non-stream answer: the completed object."""
    return shape.object("completed")


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    data = dumps({"type": kind, "sequence_number": seq, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


@dataclass(frozen=True)
class ResponseFramer:
    """Encodes the typed events of one streamed response (see the module docstring)."""

    shape: ResponseShape
    obfuscate: bool = False
    _opening_count: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_opening_count", 3 if self._is_call else 4)

    @property
    def _is_call(self) -> bool:
        return self.shape.output.call is not None

    @property
    def completion(self) -> Completion:
        return self.shape.completion

    @property
    def pieces(self) -> tuple[str, ...]:
        return self.shape.output.pieces

    @property
    def opening_first(self) -> bool:
        return True  # response.created goes out at once; output waits for the first token

    def _where(self) -> dict[str, Any]:
        where: dict[str, Any] = {"item_id": self.shape.output.item_id, "output_index": 0}
        if not self._is_call:
            where["content_index"] = 0
        return where

    def opening(self) -> bytes:
        shape, output = self.shape, self.shape.output
        events = [
            _event("response.created", 0, response=shape.object("in_progress")),
            _event("response.in_progress", 1, response=shape.object("in_progress")),
            _event(
                "response.output_item.added",
                2,
                output_index=0,
                item=item(output, "in_progress", text=""),
            ),
        ]
        if not self._is_call:
            events.append(_event("response.content_part.added", 3, **self._where(), part=_part("")))
        return b"".join(events)

    def piece(self, slot: int) -> bytes:
        """The delta event of piece ``slot`` (a token, or a fragment of the arguments)."""
        piece = self.pieces[slot]
        kind = (
            "response.function_call_arguments.delta"
            if self._is_call
            else "response.output_text.delta"
        )
        fields = {**self._where(), "delta": piece}
        if not self._is_call:
            fields["logprobs"] = []
        if self.obfuscate:
            fields["obfuscation"] = obfuscation(piece)
        return _event(kind, self._opening_count + slot, **fields)

    def closing(self) -> list[bytes]:
        shape, output = self.shape, self.shape.output
        seq = self._opening_count + len(self.pieces)
        where = self._where()
        if self._is_call:
            events = [
                _event("response.function_call_arguments.done", seq, **where, arguments=output.text)
            ]
        else:
            events = [
                _event("response.output_text.done", seq, **where, text=output.text, logprobs=[]),
                _event("response.content_part.done", seq + 1, **where, part=_part(output.text)),
            ]
        seq += len(events)
        events.append(
            _event("response.output_item.done", seq, output_index=0, item=item(output, "completed"))
        )
        events.append(_event("response.completed", seq + 1, response=shape.object("completed")))
        return events

    def failure(self, slot: int) -> list[bytes]:
        """The terminal event when generation fails before piece ``slot``."""
        error = {"code": "server_error", "message": FAILED_MESSAGE}
        response = self.shape.object("failed", error=error)
        return [_event("response.failed", self._opening_count + slot, response=response)]
