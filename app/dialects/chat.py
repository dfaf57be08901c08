"""The Chat Completions side of every translation: the chunks, usage and errors a translator
writes, in one shape. No I/O here.

The shape (what a translated stream looks like, and what the simulator's OpenAI dialect sends
for the same scripted answer):

1. a role chunk, ``delta: {"role": "assistant", "content": ""}``, when the provider's answer
   starts (Anthropic's ``message_start``, Gemini's first chunk);
2. one chunk per provider delta, as it arrives: ``{"content": t}``; thinking as
   ``{"reasoning_content": t, "thinking_blocks": [{"index": b, "type": "thinking",
   "thinking": t}]}``, then its block's signature ``{"thinking_blocks": [{"index": b, "type":
   "thinking", "thinking": "", "signature": s}]}`` (``b`` counts the answer's signed or
   redacted blocks from 0: the OpenAI SDK's accumulator merges list entries by their
   ``index`` and joins their strings, so each block accumulates whole, its text with its
   signature, as the caller must send it back; ``reasoning_content`` alone would leave the
   block's text behind); a redacted block whole, with its index; a tool call's first fragment
   ``{"tool_calls": [{"index": k, "id", "type": "function", "function": {"name",
   "arguments": ""}}]}``
   and each argument fragment ``{"tool_calls": [{"index": k, "function": {"arguments": f}}]}``;
   ``k`` counts the answer's tool calls from 0 (not the provider's block index);
3. the finish chunk, ``delta: {}`` and ``finish_reason``;
4. when the caller asked (``stream_options.include_usage``), the usage chunk
   (``choices: []``);
5. ``data: [DONE]``.

A provider's error after the stream began is one error event, ``data: {"error": {...}}``, and
no ``[DONE]`` (how OpenAI-compatible servers end a stream that failed; the OpenAI SDK raises
it as an ``APIError``). A provider's keep-alive is an SSE comment (``: ping``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.core.errors import BadRequest

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"

# Finish reasons of Chat Completions.
STOP, LENGTH, TOOL_CALLS, CONTENT_FILTER = "stop", "length", "tool_calls", "content_filter"


class Untranslatable(BadRequest):
    """A request a provider cannot be asked in its dialect (``n`` > 1 where it has none, a
    content part it does not take): a 400 naming the field. Another upstream of the plan
    may still take the call (app/upstream/attempts.py fails over)."""

    code = "unsupported_by_upstream"


# Anthropic's least thinking budget (its budget_tokens must be at least this): the least any
# reasoning effort asks of either provider.
MIN_THINKING_BUDGET = 1024
_OUTPUT_BOUNDS = ("max_completion_tokens", "max_tokens")


def output_bound(body: Mapping[str, Any]) -> int | None:
    """The most tokens the caller lets the answer take, thinking included (as OpenAI's
    ``max_completion_tokens`` bounds a reasoning model's): ``max_completion_tokens`` or
    ``max_tokens``, the smaller when both are given (the key's reservation counts one of
    them); a key's cap arrives as ``max_completion_tokens`` (app/tenancy/call_grant.py).
    None when neither is given; a BadRequest naming one that is not an integer."""
    found = []
    for name in _OUTPUT_BOUNDS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadRequest(f"Invalid value for '{name}': expected an integer.", param=name)
        found.append(value)
    return min(found) if found else None


def thinking_budget(wanted: int, bound: int) -> int | None:
    """The thinking budget a reasoning effort gets within an output ``bound`` that counts the
    thinking too: the effort's ``wanted`` budget, at most the bound less one token (Anthropic
    wants the budget below its ``max_tokens``); None when that leaves less than
    ``MIN_THINKING_BUDGET``: the call goes without a budget rather than past the bound."""
    budget = min(wanted, bound - 1)
    return budget if budget >= MIN_THINKING_BUDGET else None


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def event(value: Any) -> bytes:
    """One ``data:`` event carrying ``value``."""
    return b"data: " + dumps(value) + b"\n\n"


class ChunkWriter:
    """The chunks of one translated stream: the answer's id, creation time and model in
    each, as OpenAI sends them."""

    def __init__(self, id: str, created: int, model: str) -> None:
        self.id, self.created, self.model = id, created, model
        self.tools = 0  # tool calls begun so far: the next one's index
        self.blocks = 0  # thinking blocks signed (or redacted) so far: the next one's index

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return event(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
                ],
            }
        )

    def role(self) -> bytes:
        return self.chunk({"role": "assistant", "content": ""})

    def text(self, text: str) -> bytes:
        return self.chunk({"content": text})

    def reasoning(self, text: str) -> bytes:
        """A piece of thinking: as ``reasoning_content``, and in the thinking block it belongs
        to (the next one signed), so an accumulated block holds its text beside its signature."""
        block = {"index": self.blocks, "type": "thinking", "thinking": text}
        return self.chunk({"reasoning_content": text, "thinking_blocks": [block]})

    def signature(self, signature: str) -> bytes:
        """A thinking block's signature. Each block's entry has its own ``index``, as a tool
        call's has: the OpenAI SDK's stream accumulator merges list entries by it (without
        one it refuses a second block)."""
        block = {"index": self.blocks, "type": "thinking", "thinking": "", "signature": signature}
        self.blocks += 1
        return self.chunk({"thinking_blocks": [block]})

    def redacted(self, data: str) -> bytes:
        """A redacted thinking block, whole (its encrypted ``data``), with its index."""
        block = {"index": self.blocks, "type": "redacted_thinking", "data": data}
        self.blocks += 1
        return self.chunk({"thinking_blocks": [block]})

    def tool_start(self, id: str, name: str) -> tuple[int, bytes]:
        """A new tool call: its index, and its first fragment (id and name)."""
        index, self.tools = self.tools, self.tools + 1
        call = {
            "index": index,
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        return index, self.chunk({"tool_calls": [call]})

    def tool_arguments(self, index: int, fragment: str) -> bytes:
        return self.chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})

    def finish(self, reason: str) -> bytes:
        return self.chunk({}, reason)

    def usage(self, usage: dict[str, Any]) -> bytes:
        return event(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
        )


def usage(
    prompt: int,
    completion: int,
    *,
    cached: int = 0,
    cache_creation: int = 0,
    reasoning: int | None = None,
    cache_creation_1h: int = 0,
) -> dict[str, Any]:
    """A Chat Completions usage object. ``prompt`` counts every prompt token (a provider's
    uncached, cache-read and cache-written ones together); ``cached`` those read from the
    provider's prompt cache, ``cache_creation`` those written to it, as
    ``prompt_tokens_details.cache_write_tokens``, the name the OpenAI SDK's
    ``PromptTokensDetails`` reads (named only when some were), and of them
    ``cache_creation_1h`` those written for an hour, priced apart, as
    ``cache_write_1h_tokens`` (named only when some were: Chat Completions has no name of
    its own for them); ``reasoning`` the thinking tokens when the provider counts them
    apart."""
    details: dict[str, Any] = {"cached_tokens": cached}
    if cache_creation:
        details["cache_write_tokens"] = cache_creation
    if cache_creation_1h:
        details["cache_write_1h_tokens"] = cache_creation_1h
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


def error_body(message: str, type: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope."""
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def error_event(message: str, type: str, code: str | None = None) -> bytes:
    return event(error_body(message, type, code))
