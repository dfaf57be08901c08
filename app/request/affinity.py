"""What keeps a conversation on one upstream: its affinity key, and the routing's choice as a
call's trace records it. No I/O here.

A provider keeps a prompt's prefix in its prompt cache for minutes, per account: a
conversation that returns to the upstream that served its last turn finds its prefix there
(docs/providers.md#prompt-caches). The key says which conversation a call belongs to, from
the first of:

1. the caller's ``X-LLMGate-Session`` header (``SESSION``): any string naming its session;
2. the body's ``prompt_cache_key`` (``CACHE_KEY``: OpenAI's field for the same purpose);
3. the body's ``user`` (chat, Responses) or ``metadata.user_id`` (Messages) (``USER``);
4. the prompt's head (``PREFIX``): the tools, the system prompt (Responses: its
   ``instructions``) and the conversation up to its first user turn, inclusive. That head is
   what every turn of a conversation repeats, so it names the conversation from its first
   turn to its last: a fingerprint of the whole prefix (up to the newest user turn, or the
   last cache breakpoint) would change with each turn and send each to another upstream.
   The caller's ``cache_control`` marks are left out of it, and a content of one text
   part counts as its text (the providers read the two alike): a client that moves its
   breakpoint to the newest turn each time, making that turn a part, keeps one key.

The key is a digest (BLAKE2b, 16 bytes), never the caller's text: it is what an OpenAI
upstream is sent as ``prompt_cache_key`` when the switch is on (app/upstream/prompt_cache.py).
Its cost is one pass over the head's strings, the parsed body's, once per call that goes
upstream (app/upstream/call_request.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.request.routes import CHAT_PROMPT, MESSAGES_PROMPT, Route

SESSION_HEADER = "x-llmgate-session"
# What an affinity key was made of (``Affinity.source``; the log line's ``routing.key``).
SESSION, CACHE_KEY, USER, PREFIX = "session", "prompt_cache_key", "user", "prefix"
# Why the plan's first upstream is the one it is (``Routing.reason``): the key's first choice,
# its next one because the first had its share of calls in flight already (bounded load), or
# at random by weight (no key, or LLMGATE_ROUTING=weighted).
AFFINE, SPILL, WEIGHTED = "affine", "spill", "weighted"

_SEP = b"\x1e"  # between the parts hashed: no two heads hash as one
_TEXT_PART = {"type", "text", "cache_control"}  # a text part that is its text and no more


@dataclass(frozen=True)
class Affinity:
    """A call's affinity key and what it was made of."""

    key: bytes
    source: str

    @property
    def hex(self) -> str:
        return self.key.hex()


@dataclass(frozen=True)
class Routing:
    """How the upstreams of a call were ordered: the first one planned (the answer may come
    from another, by failover or a hedge), why, and what the key was made of (None: none)."""

    choice: str
    reason: str
    key: str | None = None

    def fields(self) -> dict[str, str | None]:
        return {"choice": self.choice, "reason": self.reason, "key": self.key}


def affinity_of(
    route: Route, body: Mapping[str, Any] | None, headers: Iterable[tuple[str, str]]
) -> Affinity | None:
    """The call's affinity key (the module's order); None for a route with no prompt to keep
    (embeddings, a forwarded path) or a body with nothing to key it by."""
    if route.prompt is None or body is None:
        return None
    for name, value in headers:
        if value and name.lower() == SESSION_HEADER:
            return _keyed(SESSION, value)
    given = body.get("prompt_cache_key")
    if isinstance(given, str) and given:
        return _keyed(CACHE_KEY, given)
    user = body.get("user")
    if route.prompt == MESSAGES_PROMPT:
        metadata = body.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    if isinstance(user, str) and user:
        return _keyed(USER, user)
    digest = hashlib.blake2b(digest_size=16)
    if not _head(route.prompt, body, digest):
        return None
    return Affinity(digest.digest(), PREFIX)


def _keyed(source: str, value: str) -> Affinity:
    data = source.encode() + _SEP + value.encode("utf-8", "surrogatepass")
    return Affinity(hashlib.blake2b(data, digest_size=16).digest(), source)


def _head(prompt: str, body: Mapping[str, Any], digest: Any) -> bool:
    """Feed ``digest`` the prompt's head (the module's item 4); False when it has none."""
    fed = _feed(digest, body.get("tools"))
    if prompt == CHAT_PROMPT:
        turns = body.get("messages")
    elif prompt == MESSAGES_PROMPT:
        fed |= _feed(digest, body.get("system"))
        turns = body.get("messages")
    else:  # Responses: its instructions, then its input (a string, or items)
        fed |= _feed(digest, body.get("instructions"))
        turns = body.get("input")
        if isinstance(turns, str):
            return _feed(digest, turns) or fed
    for turn in turns if isinstance(turns, list) else ():
        if not isinstance(turn, Mapping):
            continue
        role = turn.get("role")
        digest.update(_SEP + str(role).encode())
        fed |= _feed(digest, turn.get("content"))
        if role == "user":
            break
    return fed


def _feed(digest: Any, value: Any) -> bool:
    """Hash ``value`` (a string as it is; a content of one text part as its text; a list
    item by item; an object as compact JSON, its ``cache_control`` left out); False for
    nothing to hash."""
    value = _as_text(value)
    if value is None or value == "" or value == []:
        return False
    digest.update(_SEP)
    if isinstance(value, str):
        digest.update(value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, list):
        for item in value:
            _feed(digest, item)
    else:
        if isinstance(value, Mapping) and "cache_control" in value:
            value = {k: v for k, v in value.items() if k != "cache_control"}
        digest.update(json.dumps(value, separators=(",", ":"), default=str).encode())
    return True


def _as_text(value: Any) -> Any:
    """A content of one text part is its text: a provider reads ``"hi"`` and ``[{"type":
    "text", "text": "hi"}]`` as the same prompt, and a client that marks its newest turn
    (Anthropic's guide) sends that turn as a part on the turn it is newest and as a string
    on the next ones: the conversation keeps one key."""
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], Mapping):
        return value
    part = value[0]
    text = part.get("text")
    if part.get("type") != "text" or not isinstance(text, str) or set(part) - _TEXT_PART:
        return value
    return text
