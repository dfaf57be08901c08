"""Scripted answers: one answer, said the same way in every dialect. No I/O here.

A ``Script`` is an ordered list of blocks (thinking with its signature, text, tool calls),
how it ends (a finish reason, or an error part-way) and its token usage. Each dialect's
framer renders it (chat_scripts.py for OpenAI Chat Completions, anthropic.py, gemini.py),
stream and non-stream, so a test can ask the same answer of every kind of upstream and
compare what the gateway makes of each. A script's pieces go out on the same schedule as
generated words (one per ``1/tps`` after ``ttft_ms``), so the timing and fault controls act
on them as on any stream.

The rules every renderer keeps: a piece is never merged with another in a stream; finish
reasons are named as Chat Completions names them (``stop``, ``length``, ``tool_calls``,
``content_filter``) and mapped by each dialect; tool call ids are the script's own, the same
in every dialect; a tool call's argument fragments join to
``json.dumps(arguments, separators=(",", ":"))``. Usage: ``input`` is the uncached prompt
tokens (Anthropic's ``input_tokens``), so the whole prompt is ``input + cache_read +
cache_creation``; ``output`` counts every generated token, ``thinking`` the part of them
spent thinking.

A generated answer (words derived from the prompt, text.py) is a script too: one text block
(``generated``), so the Anthropic and Gemini dialects have one renderer each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

STOP, LENGTH, TOOL_CALLS, CONTENT_FILTER, ERROR = (
    "stop",
    "length",
    "tool_calls",
    "content_filter",
    "error",
)
OVERLOADED = "Overloaded"  # the message of every overloaded error, in every dialect


@dataclass(frozen=True)
class Block:
    """One block of an answer. ``kind`` is ``thinking`` (``pieces`` of thought, then its
    ``signature``), ``text`` (``pieces`` of text) or ``tool`` (a call ``id`` of ``name``
    whose ``pieces`` are its argument fragments)."""

    kind: str
    pieces: tuple[str, ...]
    signature: str = ""
    id: str = ""
    name: str = ""

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def arguments(self) -> Any:
        """A tool call's arguments, parsed from its joined fragments."""
        return json.loads(self.text)


@dataclass(frozen=True)
class Step:
    """One piece of a stream: the ``value`` of piece ``kind`` (``thinking``, ``signature``,
    ``text`` or ``arguments``) of block ``block``; ``first``/``last`` within that block."""

    block: int
    kind: str
    value: str
    first: bool
    last: bool


@dataclass(frozen=True)
class Usage:
    input: int
    output: int
    cache_read: int = 0
    cache_creation: int = 0
    thinking: int = 0
    # Of the written tokens, those for an hour; ``split``: Anthropic's usage names the
    # writes by lifetime too (its ``cache_creation``), as it does when a cache ran.
    cache_creation_1h: int = 0
    split: bool = False

    @property
    def prompt(self) -> int:
        """Every prompt token: uncached, read from the cache and written to it."""
        return self.input + self.cache_read + self.cache_creation


@dataclass(frozen=True)
class Script:
    name: str
    blocks: tuple[Block, ...]
    finish: str  # STOP, LENGTH, TOOL_CALLS, CONTENT_FILTER, or ERROR (part-way, OVERLOADED)
    usage: Usage

    def steps(self) -> tuple[Step, ...]:
        """Every piece in order; a thinking block's signature is its last piece."""
        out: list[Step] = []
        for i, block in enumerate(self.blocks):
            kind = "arguments" if block.kind == "tool" else block.kind
            values = [(kind, p) for p in block.pieces]
            if block.kind == "thinking":
                values.append(("signature", block.signature))
            for j, (k, value) in enumerate(values):
                out.append(Step(i, k, value, j == 0, j == len(values) - 1))
        return tuple(out)

    def of_kind(self, kind: str) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.kind == kind)

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.of_kind("text"))

    @property
    def thinking(self) -> str:
        return "".join(b.text for b in self.of_kind("thinking"))

    def with_cache_read(self, tokens: int | None) -> Script:
        """The script with ``tokens`` prompt tokens read from the cache (a control's say)."""
        if tokens is None:
            return self
        return replace(self, usage=replace(self.usage, cache_read=tokens))


def fragments(arguments: dict[str, Any], size: int) -> tuple[str, ...]:
    """A tool call's compact JSON cut every ``size`` characters, as a provider streams it:
    mid-name, mid-escape, anywhere."""
    text = json.dumps(arguments, separators=(",", ":"))
    return tuple(text[i : i + size] for i in range(0, len(text), size))


def generated(
    words: tuple[str, ...],
    finish: str,
    prompt_tokens: int,
    cached: int,
    written: int = 0,
    written_1h: int = 0,
    split: bool = False,
) -> Script:
    """A generated answer as a script: one text block of ``words``; ``cached`` of the
    ``prompt_tokens`` read from the cache, ``written`` written to it (``written_1h`` of them
    for an hour; ``split``: say so, prompt_cache.py having run)."""
    cached = min(cached, prompt_tokens)
    written = min(written, prompt_tokens - cached)
    usage = Usage(
        input=prompt_tokens - cached - written,
        output=len(words),
        cache_read=cached,
        cache_creation=written,
        cache_creation_1h=min(written_1h, written),
        split=split,
    )
    blocks = (Block("text", words),) if words else ()  # no words: an empty content list
    return Script("generated", blocks, finish, usage)


def _text(*pieces: str) -> Block:
    return Block("text", pieces)


WEATHER_ARGS = {
    "location": "San Francisco, CA",
    "unit": "celsius",
    "days": 3,
    "fields": ["temperature", "wind", "humidity"],
    "note": 'say "hi" to the fog',
}
TIME_ARGS = {"timezone": "Asia/Tokyo", "format": "24h", "locale": {"lang": "ja", "region": "JP"}}

_SCRIPTS = (
    Script(
        "text",
        (_text("Hello", " from", " the", " scripted", " simulator", "."),),
        STOP,
        Usage(input=10, output=6, cache_read=6),
    ),
    Script(
        "tools",
        (
            _text("Let", " me", " check", "."),
            Block("tool", fragments(WEATHER_ARGS, 7), id="call_sim_weather", name="get_weather"),
            Block("tool", fragments(TIME_ARGS, 5), id="call_sim_time", name="get_time"),
        ),
        TOOL_CALLS,
        Usage(input=40, output=52),
    ),
    Script(
        "thinking",
        (
            Block(
                "thinking",
                ("Let", " me", " think", " it", " through", "."),
                signature="c2ltLXNpZ25hdHVyZS0x",
            ),
            _text("The", " answer", " is", " 42", "."),
        ),
        STOP,
        Usage(input=20, output=30, cache_creation=3, thinking=18),
    ),
    Script(
        "length",
        (_text("This", " answer", " runs", " on", " until", " it", " hits", " the"),),
        LENGTH,
        Usage(input=8, output=8),
    ),
    Script("filter", (_text("I", " can", " help", " with"),), CONTENT_FILTER, Usage(9, 4)),
    Script("overload", (_text("Working", " on", " it"),), ERROR, Usage(input=7, output=3)),
)
SCRIPTS = {s.name: s for s in _SCRIPTS}
NAMES = tuple(SCRIPTS)
