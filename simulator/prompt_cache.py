"""A provider's prompt cache, simulated: a prompt's prefix read back instead of computed.

Only the cache's state lives here (``PromptCache``: prefix digests with their expiry, per
cache group), and what a prompt offers it (``Prompt``); app.py asks it once per generated
answer when the ``prompt_cache`` control is on, and the answer's usage and its time to first
token follow from what it did (``Use``). Its clock is passed in; nothing runs at import time.

How each dialect caches, as its provider documents it (docs/providers.md#prompt-caches),
tokens being the simulator's whitespace words:

- **automatic** (OpenAI's chat, completions and Responses; Gemini): a prompt of at least
  ``cache_min_tokens`` words is stored at every multiple of 128 words it reaches; a later
  prompt reads the longest stored prefix it starts with (a multiple of 128). Writes are not
  reported: these providers do not charge one apart.
- **explicit** (Anthropic): only the prefixes up to a block marked with ``cache_control`` are
  stored (those reaching ``cache_min_tokens``), for ``cache_ttl_s`` or an hour with
  ``"ttl": "1h"``; a prompt reads the longest stored prefix that ends at one of its block
  boundaries up to its last mark (Anthropic looks back from a breakpoint for an earlier
  hit), and writes what lies between that and its last mark (``cache_creation_input_tokens``,
  its hour's part apart). Tools are not counted as prompt tokens by the simulator, so a mark
  on them stores nothing.

A read renews the entry's lifetime. A group is one account's cache: the simulator keys it
by the credential a request presents, so upstreams configured with different keys have
separate caches, as two accounts do, and one simulator can stand for several.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

STEP = 128  # automatic caching's granularity (OpenAI counts hits in 128-token steps)
HOUR_S = 3600.0
MAX_ENTRIES = 200_000  # the oldest go first beyond this: a long benchmark stays bounded


@dataclass(frozen=True)
class Mark:
    at: int  # words before the end of the marked block
    ttl_s: float | None  # None: the cache_ttl_s control


@dataclass(frozen=True)
class Prompt:
    """What a prompt offers the cache: its words, and for the explicit dialect its block
    boundaries and marks (``marks`` None: automatic caching)."""

    words: tuple[str, ...]
    marks: tuple[Mark, ...] | None = None
    ends: tuple[int, ...] = ()


@dataclass(frozen=True)
class Use:
    """What the cache did with one prompt's words; they add up to the prompt."""

    read: int
    written: int  # reported only by the explicit dialect
    written_1h: int
    computed: int  # uncached, written included: what costs prefill time

    @property
    def uncached(self) -> int:
        """Neither read nor reported written (Anthropic's ``input_tokens``)."""
        return self.computed - self.written


class PromptCache:
    """Every group's stored prefixes: (group, digest) -> when it expires."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, bytes], float] = OrderedDict()

    def clear(self) -> None:
        self._entries.clear()

    def use(self, group: str, prompt: Prompt, now: float, minimum: int, ttl_s: float) -> Use:
        """Read what ``prompt`` finds of its prefix in ``group``, store what it offers."""
        n = len(prompt.words)
        if prompt.marks is None:
            stored = [(p, ttl_s) for p in range(STEP, n + 1, STEP) if p >= minimum]
            readable = [p for p, _ in stored]
        else:
            marks = [(m.at, ttl_s if m.ttl_s is None else m.ttl_s) for m in prompt.marks]
            stored = sorted({(p, t) for p, t in marks if p >= minimum and p > 0})
            last = max((p for p, _ in marks), default=0)
            readable = sorted({p for p in (*prompt.ends, *(p for p, _ in marks)) if p <= last})
        digests = _digests(prompt.words, sorted({*readable, *(p for p, _ in stored)}))
        read = 0
        for p in readable:
            expiry = self._entries.get((group, digests[p]))
            if expiry is not None and expiry > now and p > read:
                read = p
        if read:
            self._store(group, digests[read], now + self._ttl_at(stored, read, ttl_s))
        for p, ttl in stored:
            self._store(group, digests[p], now + ttl)
        if prompt.marks is None or not stored:
            return Use(read, 0, 0, n - read)
        last = stored[-1][0]
        written = max(0, last - read)
        hour = max((p for p, t in stored if t >= HOUR_S), default=0)
        return Use(read, written, min(written, max(0, hour - read)), n - read)

    def _store(self, group: str, digest: bytes, expiry: float) -> None:
        key = (group, digest)
        self._entries[key] = max(expiry, self._entries.get(key, 0.0))
        self._entries.move_to_end(key)
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)

    @staticmethod
    def _ttl_at(stored: list[tuple[int, float]], at: int, default: float) -> float:
        return next((t for p, t in stored if p == at), default)


def _digests(words: tuple[str, ...], positions: list[int]) -> dict[int, bytes]:
    """The digest of the prefix of ``positions[i]`` words, for each: the words each followed
    by a space, so a prefix has one digest however the positions cut it."""
    digest = hashlib.blake2b(digest_size=16)
    out, prev = {}, 0
    for p in positions:
        digest.update("".join(w + " " for w in words[prev:p]).encode("utf-8", "surrogatepass"))
        out[p] = digest.copy().digest()
        prev = p
    return out


def automatic(text: str) -> Prompt:
    """A prompt that OpenAI or Gemini caches by itself."""
    return Prompt(tuple(text.split()))


def anthropic(system: Any, messages: list[Any]) -> Prompt:
    """A Messages prompt as the simulator counts it (text.py's ``messages_prompt``: the system
    text, then each message's), with its block boundaries and ``cache_control`` marks."""
    words: list[str] = []
    ends: list[int] = []
    marks: list[Mark] = []
    contents = [system, *(m.get("content") for m in messages if isinstance(m, dict))]
    for content in contents:
        blocks = [{"text": content}] if isinstance(content, str) else content
        for block in blocks if isinstance(blocks, list) else ():
            if not isinstance(block, dict):
                continue
            words += _block_text(block).split()
            ends.append(len(words))
            mark = block.get("cache_control")
            if isinstance(mark, dict):
                marks.append(Mark(len(words), HOUR_S if mark.get("ttl") == "1h" else None))
    return Prompt(tuple(words), tuple(marks), tuple(ends))


def _block_text(block: dict[str, Any]) -> str:
    """A block's text as text.py counts it: its text, or a tool result's nested content."""
    if "text" in block:
        value = block.get("text")
        return value if isinstance(value, str) else ""
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_block_text(b) for b in content if isinstance(b, dict))
    return ""
