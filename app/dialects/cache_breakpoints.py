"""Prompt cache breakpoints placed on an Anthropic Messages request. No I/O here.

Anthropic caches a prompt only up to the blocks marked ``cache_control: {"type":
"ephemeral"}`` (at most four), and only a prefix of at least the model's minimum (1,024
tokens for Opus and Sonnet, 2,048 for Haiku); a read costs a tenth of the input price, a
write a quarter more (docs/providers.md#prompt-caches). For an upstream whose
``prompt_cache`` is ``auto`` (app/upstream/prompt_cache.py), ``with_breakpoints`` marks, in
the order Anthropic builds its prefix:

1. the last tool, when the tools reach the minimum;
2. the last system block (a system string becomes one text block), when the tools and the
   system prompt reach it;
3. the last block of the message before the newest user message, when the prompt up to it
   reaches it: the turn the next call will repeat. A thinking block cannot carry a mark, nor
   an empty text: the last block that can is marked, none when none can.

Never more than these three, and none at all when the caller placed any of its own (on a
tool, a system block, a message block or a tool result's block, or the request's own
top-level ``cache_control``): the caller decided. The tokens are estimated as a quarter of
the characters of the text and JSON of each part (the rule of the gateway's other estimates),
an image or document given inline as 1,600: a breakpoint a little below the real minimum
costs nothing (Anthropic caches nothing there and says so in the usage). The request given
is not changed: what is marked is copied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EPHEMERAL = {"type": "ephemeral"}
MINIMUM, HAIKU_MINIMUM = 1024, 2048
_MARK = "cache_control"
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})
_INLINE_TOKENS = 1600  # an inline image or document: about its largest, not its base64's size
_NESTED = ("content",)  # a tool result's blocks


def minimum_for(model: str) -> int:
    """The least prefix (tokens) Anthropic caches for ``model``."""
    return HAIKU_MINIMUM if "haiku" in model.lower() else MINIMUM


def with_breakpoints(body: Mapping[str, Any], minimum: int) -> dict[str, Any] | None:
    """``body`` with the module's breakpoints, or None when it gets none (the caller placed
    its own, or no prefix reaches ``minimum`` tokens)."""
    if _MARK in body or _marked(body.get("tools")) or _marked(body.get("system")):
        return None
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    if any(_marked(m.get("content")) for m in messages if isinstance(m, Mapping)):
        return None
    out = dict(body)
    placed, chars = 0, 0
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        chars += _chars(tools)
        if chars // 4 >= minimum and isinstance(tools[-1], Mapping):
            out["tools"] = [*tools[:-1], {**tools[-1], _MARK: EPHEMERAL}]
            placed += 1
    system = body.get("system")
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) and system else system
    if isinstance(blocks, list) and blocks:
        chars += _chars(blocks)
        marked = _mark_last(blocks) if chars // 4 >= minimum else None
        if marked is not None:
            out["system"] = marked
            placed += 1
    newest = _newest_user(messages)
    if newest > 0:
        chars += _chars(messages[:newest])
        turn = _mark_turn(messages[newest - 1]) if chars // 4 >= minimum else None
        if turn is not None:
            out["messages"] = [*messages[: newest - 1], turn, *messages[newest:]]
            placed += 1
    return out if placed else None


def _newest_user(messages: list[Any]) -> int:
    """The index of the newest user message, -1 when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        turn = messages[i]
        if isinstance(turn, Mapping) and turn.get("role") == "user":
            return i
    return -1


def _mark_turn(turn: Any) -> dict[str, Any] | None:
    """The message ``turn`` with its last markable block marked (None: it has none)."""
    if not isinstance(turn, Mapping):
        return None
    content = turn.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}] if content else []
    blocks = _mark_last(content) if isinstance(content, list) else None
    return None if blocks is None else {**turn, "content": blocks}


def _mark_last(blocks: list[Any]) -> list[Any] | None:
    """``blocks`` with the last one that can carry a mark marked; None when none can."""
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        if not isinstance(block, Mapping) or block.get("type") in _UNMARKABLE:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue  # Anthropic refuses a mark on empty text
        return [*blocks[:i], {**block, _MARK: EPHEMERAL}, *blocks[i + 1 :]]
    return None


def _marked(value: Any) -> bool:
    """Whether a tool, a system block, a message's block or a tool result's block in
    ``value`` (a list of them) carries the caller's own mark."""
    if not isinstance(value, list):
        return False
    for item in value:
        if isinstance(item, Mapping) and (
            _MARK in item or any(_marked(item.get(name)) for name in _NESTED)
        ):
            return True
    return False


def _chars(value: Any) -> int:
    """The characters ``value`` takes as text and JSON, an inline image or document as
    ``_INLINE_TOKENS`` tokens."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(item) for item in value) + len(value)
    if isinstance(value, Mapping):
        source = value.get("source")
        if isinstance(source, Mapping) and source.get("type") == "base64":
            return 4 * _INLINE_TOKENS
        return sum(len(str(k)) + _chars(v) + 4 for k, v in value.items())
    return len(str(value))
