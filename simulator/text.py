"""Deterministic model output. No I/O here: prompts in, words and vectors out.

The same prompt always yields the same words and the same embedding: both are drawn from a
SHA-256 stream seeded with the prompt, so a test, a cache or a benchmark can predict what the
fake model answers without running it. Token counts are whitespace words, not BPE tokens.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Iterator
from typing import Any

# 64 words so that one hash byte picks one word without bias (256 % 64 == 0).
_WORDS = """
    the a gateway token stream cache model prompt answer fast quiet river stone light
    cloud signal packet socket buffer thread kernel vector matrix random simple clear
    bright small large early late north south east west green blue red yellow silver
    golden ocean forest mountain valley garden window mirror paper letter story music
    engine rocket planet comet orbit harbor bridge tower castle market village meadow
"""
VOCABULARY = tuple(_WORDS.split())
assert len(VOCABULARY) == 64


def _hash_stream(seed: str) -> Iterator[bytes]:
    """An endless, reproducible byte stream: SHA-256 of (seed digest, block number)."""
    root = hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest()
    block = 0
    while True:
        yield hashlib.sha256(root + block.to_bytes(8, "big")).digest()
        block += 1


def words(prompt: str, count: int) -> list[str]:
    """``count`` tokens for ``prompt``: words with a leading space, except the first."""
    picked: list[str] = []
    for digest in _hash_stream(prompt):
        if len(picked) >= count:
            break
        picked.extend(VOCABULARY[byte & 63] for byte in digest[: count - len(picked)])
    return [word if i == 0 else " " + word for i, word in enumerate(picked)]


def word_count(text: str) -> int:
    """Prompt tokens as the simulator counts them: whitespace words, at least one."""
    return max(1, len(text.split()))


def _content_text(content: Any) -> str:
    """Text of a message content: a string, or the text of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def chat_prompt(messages: list[Any]) -> str:
    """The prompt of a chat request: every message's content, joined by newlines."""
    return "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))


def completion_prompt(prompt: Any) -> str:
    """The prompt of a legacy completion: a string, strings, or token ids."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(p if isinstance(p, str) else _token_ids(p) for p in prompt)
    return ""


def responses_prompt(value: Any) -> str:
    """The prompt of a Responses API request: a string or a list of input items."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            _content_text(item.get("content")) for item in value if isinstance(item, dict)
        )
    return ""


def embedding_inputs(value: Any) -> list[str] | None:
    """The texts to embed, one per vector; None when ``input`` has no usable shape."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) for v in value):
            return [_token_ids(value)]  # one input given as token ids
        if all(isinstance(v, (str, list)) for v in value):
            return [v if isinstance(v, str) else _token_ids(v) for v in value]
    return None


def _token_ids(value: Any) -> str:
    return " ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def embedding(text: str, dimensions: int) -> list[float]:
    """A unit vector for ``text``, already rounded to float32 so both encodings agree."""
    raw: list[float] = []
    for digest in _hash_stream("embedding\x00" + text):
        for (word,) in struct.iter_unpack(">I", digest):
            raw.append(word / 2**31 - 1.0)  # uniform in [-1, 1)
        if len(raw) >= dimensions:
            break
    raw = raw[:dimensions]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    packed = struct.pack(f"<{dimensions}f", *(x / norm for x in raw))
    return list(struct.unpack(f"<{dimensions}f", packed))


def embedding_base64(vector: list[float]) -> str:
    """The vector as the API's base64 encoding: little-endian float32, no separators."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _blocks_text(content: Any) -> str:
    """Text of an Anthropic content: a string, or blocks whose text (or a tool result's
    nested content) counts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for block in content:
        if isinstance(block, dict):
            value = block.get("text") if "text" in block else _blocks_text(block.get("content"))
            if isinstance(value, str) and value:
                parts.append(value)
    return "\n".join(parts)


def messages_prompt(system: Any, messages: list[Any]) -> str:
    """The prompt of an Anthropic Messages request: the system text, then every message's."""
    texts = [_blocks_text(system)]
    texts.extend(_blocks_text(m.get("content")) for m in messages if isinstance(m, dict))
    return "\n".join(t for t in texts if t)


def _parts_text(content: Any) -> str:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return ""
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    return "\n".join(t for t in texts if isinstance(t, str) and t)


def gemini_prompt(system: Any, contents: list[Any]) -> str:
    """The prompt of a Gemini request: ``systemInstruction``'s text parts, then each content's."""
    texts = [_parts_text(system), *(_parts_text(c) for c in contents)]
    return "\n".join(t for t in texts if t)
