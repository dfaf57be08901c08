"""The most tokens one call can be billed, known before it goes upstream. No I/O here.

A key's token and money budgets reserve this bound before the call leaves and settle to the
answer's usage afterwards (app/tenancy/access.py), so concurrent calls can never spend past a budget
by more than the bound misses. Each part is an upper bound that needs no tokenizer:

- **Prompt**: the request body's size in bytes. Every tokenizer in use (byte-level BPE, and
  SentencePiece with byte fallback) makes at most one token of each byte of text, and the
  body holds every byte of the prompt plus JSON punctuation that outweighs the few tokens a
  provider adds per message and per tool definition; ``PROMPT_OVERHEAD`` covers what it adds
  once per call. An image is charged by its pixels, not its bytes: each image part counts
  ``IMAGE_TOKENS`` instead of its JSON. What the body cannot show is not bounded: context
  stored at the provider (``previous_response_id``, ``conversation``, prompt templates,
  files by id, documents such as PDFs rendered as page images, built-in tools that add
  search results); docs/security.md lists it.
- **Output**: the call's own ``max_tokens`` (or ``max_completion_tokens``,
  ``max_output_tokens``), else the ceiling given for the model (the price table's
  ``max_output_tokens``, else ``LLMGATE_DEFAULT_MAX_OUTPUT_TOKENS``), times the answers
  asked for (``n``, or ``best_of`` for completions, which bills every candidate).

The bound is loose on purpose: English text is about four bytes per token, so a prompt
reserves about four times what it will cost, until its usage settles it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from app.request.routes import Route

# Body fields that bound how many tokens one call may generate, by API surface (the one a
# call is sent its key's cap in is its route's ``output_field``: app/request/routes.py).
MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Tokens one image part may cost. Providers charge images by their size in pixels, up to a
# few thousand tokens for the largest they accept; this sits above every such charge.
IMAGE_TOKENS = 4096
IMAGE_TYPES = frozenset({"image_url", "input_image", "image"})
# Tokens a provider adds once per call beyond the body's bytes (the reply's priming, a tools
# preamble): a few dozen at most.
PROMPT_OVERHEAD = 64


def prompt_bound(size: int, body: Mapping[str, Any], raw: bytes | None = None) -> int:
    """The most prompt tokens a body of ``size`` bytes can be billed (module docstring).
    ``raw``: the bytes ``body`` was parsed from, when known. An image part's type is a
    string holding "image", which JSON spells with those letters or with a ``\\u`` escape:
    raw bytes with neither hold no image part, and the body is not walked to look for one
    (a walk of every message and part, on every call of a key with a token budget)."""
    if raw is not None and b"image" not in raw and b"\\u" not in raw:
        return size + PROMPT_OVERHEAD
    images, image_bytes = _images(body)
    return max(0, size - image_bytes) + images * IMAGE_TOKENS + PROMPT_OVERHEAD


def own_output_bound(body: Mapping[str, Any]) -> int | None:
    """The output bound the call names itself, or None."""
    return next((body[f] for f in MAX_TOKEN_FIELDS if is_count(body.get(f))), None)


def choices(route: Route, body: Mapping[str, Any]) -> int:
    """How many answers the call is billed for: the largest of its route's ``choice_fields``
    (``n``; ``best_of`` too for the legacy completions, which generate that many and bill
    them all)."""
    counts = [body.get(field) for field in route.choice_fields]
    return max([1, *(c for c in counts if is_count(c))])


def output_bound(route: Route, body: Mapping[str, Any], ceiling: int) -> int:
    """The most output tokens the call can be billed: its own bound, else ``ceiling`` (the
    model's), times its answers; 0 for a route that generates nothing (embeddings bill the
    input alone)."""
    if not route.generates:
        return 0
    own = own_output_bound(body)
    return (ceiling if own is None else own) * choices(route, body)


def _images(value: Any) -> tuple[int, int]:
    """Image parts anywhere in ``value``, and the bytes of the strings inside them (a URL,
    base64 data): never more than the part takes in the body, where escapes only add."""
    if isinstance(value, dict):
        if value.get("type") in IMAGE_TYPES:
            return 1, _text_bytes(value)
        found = [_images(v) for v in value.values() if isinstance(v, dict | list)]
    elif isinstance(value, list):
        found = [_images(v) for v in value if isinstance(v, dict | list)]
    else:
        return 0, 0
    return sum(n for n, _ in found), sum(b for _, b in found)


def _text_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return sum(_text_bytes(k) + _text_bytes(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    return 0


def is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
