"""A script (scripts.py) in Anthropic's Messages dialect, and Anthropic's errors. No I/O here.

Non-stream, the answer is a ``message`` object: ``id`` (``msg_...``), ``type``, ``role``,
``model``, ``content`` blocks (``thinking`` with its ``signature``, ``text``, ``tool_use``
with its parsed ``input``), ``stop_reason``, ``stop_sequence`` and ``usage``
(``input_tokens`` uncached, ``cache_creation_input_tokens``, ``cache_read_input_tokens``,
``output_tokens``).

A stream is named events whose ``data`` repeats the name in ``type``, as the API sends them:
``message_start`` (the message with no content, ``output_tokens`` 1 and the prompt's counts)
and a ``ping`` at once, before the wait for the first token; then per block
``content_block_start``, one ``content_block_delta`` per piece (``thinking_delta``, then one
``signature_delta``; ``text_delta``; ``input_json_delta`` with ``partial_json``) and
``content_block_stop``, the start written with the block's first piece and the stop with
its last; then ``message_delta`` (``stop_reason``, and ``usage.output_tokens``, cumulative)
and ``message_stop``. A failure part-way (the ``overload`` script, the ``error-after``
fault) is ``event: error`` with an ``overloaded_error``, and nothing after it.

Errors are ``{"type": "error", "error": {"type", "message"}, "request_id"}``, the type
named by the status (``ERROR_TYPES``); 529 is Anthropic's "overloaded".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .responses import dumps
from .scripts import CONTENT_FILTER, ERROR, LENGTH, OVERLOADED, TOOL_CALLS, Block, Script, Step

STOP_REASONS = {
    "stop": "end_turn",
    LENGTH: "max_tokens",
    TOOL_CALLS: "tool_use",
    CONTENT_FILTER: "refusal",
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def error_body(status: int, message: str, request_id: str) -> dict[str, Any]:
    error = {"type": ERROR_TYPES.get(status, "api_error"), "message": message}
    return {"type": "error", "error": error, "request_id": request_id}


def event(kind: str, **fields: Any) -> bytes:
    """One named event; its data repeats the name in ``type``."""
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **fields}) + b"\n\n"


def overloaded_event() -> bytes:
    return event("error", error={"type": "overloaded_error", "message": OVERLOADED})


def usage(script: Script, output_tokens: int | None = None) -> dict[str, Any]:
    u = script.usage
    out: dict[str, Any] = {
        "input_tokens": u.input,
        "cache_creation_input_tokens": u.cache_creation,
        "cache_read_input_tokens": u.cache_read,
        "output_tokens": u.output if output_tokens is None else output_tokens,
    }
    if u.split:  # the writes by lifetime, as the API names them once a cache ran
        hour = u.cache_creation_1h
        split = {"ephemeral_5m_input_tokens": u.cache_creation - hour}
        out["cache_creation"] = {**split, "ephemeral_1h_input_tokens": hour}
    return out


def _whole(block: Block) -> dict[str, Any]:
    if block.kind == "thinking":
        return {"type": "thinking", "thinking": block.text, "signature": block.signature}
    if block.kind == "tool":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.arguments()}
    return {"type": "text", "text": block.text}


def _empty(block: Block) -> dict[str, Any]:
    """The block as ``content_block_start`` announces it: no content yet."""
    if block.kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if block.kind == "tool":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
    return {"type": "text", "text": ""}


def message(script: Script, id: str, model: str) -> dict[str, Any]:
    """The non-stream answer (a script that fails has none: the caller answers a 529)."""
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_whole(b) for b in script.blocks],
        "stop_reason": STOP_REASONS[script.finish],
        "stop_sequence": None,
        "usage": usage(script),
    }


_DELTAS = {
    "thinking": ("thinking_delta", "thinking"),
    "signature": ("signature_delta", "signature"),
    "text": ("text_delta", "text"),
    "arguments": ("input_json_delta", "partial_json"),
}
# A text delta of block 0 is most of a generated stream: its bytes around the text, once.
_TEXT0 = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":',
    b"}}\n\n",
)


@dataclass(frozen=True)
class MessageFramer:
    """The events of one streamed message (see the module docstring)."""

    script: Script
    id: str
    model: str
    pieces: tuple[Step, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pieces", self.script.steps())

    @property
    def opening_first(self) -> bool:
        return True  # message_start and a ping go out at once; content after the TTFT

    def opening(self) -> bytes:
        start: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(self.script, output_tokens=1),
        }
        return event("message_start", message=start) + PING

    def piece(self, slot: int) -> bytes:
        step = self.pieces[slot]
        if step.kind == "text" and step.block == 0 and not step.first and not step.last:
            return _TEXT0[0] + dumps(step.value) + _TEXT0[1]
        kind, name = _DELTAS[step.kind]
        out = b""
        if step.first:
            block = _empty(self.script.blocks[step.block])
            out += event("content_block_start", index=step.block, content_block=block)
        delta = {"type": kind, name: step.value}
        out += event("content_block_delta", index=step.block, delta=delta)
        if step.last:
            out += event("content_block_stop", index=step.block)
        return out

    def closing(self) -> list[bytes]:
        if self.script.finish == ERROR:
            return [overloaded_event()]
        delta = {"stop_reason": STOP_REASONS[self.script.finish], "stop_sequence": None}
        return [
            event("message_delta", delta=delta, usage={"output_tokens": self.script.usage.output}),
            event("message_stop"),
        ]

    def failure(self, slot: int) -> list[bytes]:
        del slot
        return [overloaded_event()]
