"""What an upstream's ``prompt_cache = "auto"`` changes on the wire. No I/O here.

Off by default: the request goes as the caller made it. On, for a call whose route holds a
prompt (app/request/routes.py, ``Route.prompt``):

- to an **Anthropic** upstream, a Messages request gets cache breakpoints on its tools, its
  system prompt and the turn before its newest user message, where the prefix reaches the
  model's minimum and the caller placed none of its own (app/dialects/cache_breakpoints.py):
  a Chat Completions call as it is translated (``marked``), a Messages call relayed as it
  is, its body re-encoded only when a breakpoint was placed (``edited``);
- to an **OpenAI**-compatible upstream, a chat or Responses request that names no
  ``prompt_cache_key`` is sent its conversation's affinity key (app/request/affinity.py) as
  one, its other bytes as the caller wrote them (``edited``); a Messages call translated to
  chat gets it in the translated body (``keyed``). OpenAI sends calls with one key to the
  same machines. A server that refuses unknown fields should keep the switch off.

Gemini caches implicitly: nothing changes for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.core.doors import ANTHROPIC, OPENAI
from app.dialects.cache_breakpoints import minimum_for, with_breakpoints
from app.request import jsonedit
from app.request.affinity import Affinity
from app.request.routes import CHAT_PROMPT, MESSAGES_PROMPT, RESPONSES_PROMPT, Route
from app.upstream.catalog import UpstreamSpec

AUTO = "auto"
_KEY = "prompt_cache_key"
_KEYED = (CHAT_PROMPT, RESPONSES_PROMPT)  # the OpenAI APIs that take a prompt_cache_key


def edited(
    spec: UpstreamSpec, route: Route, affinity: Affinity | None, body: bytes | None
) -> bytes | None:
    """The body of a call sent to ``spec`` in the caller's own dialect, as the switch
    wants it; ``body`` itself when nothing changes."""
    if spec.prompt_cache != AUTO or not body:
        return body
    if spec.kind == ANTHROPIC and route.prompt == MESSAGES_PROMPT:
        doc = json.loads(body)  # a Messages call's body: a JSON object (app/request/schema.py)
        if not isinstance(doc, dict):
            return body
        placed = with_breakpoints(doc, minimum_for(str(doc.get("model", ""))))
        return body if placed is None else _dumps(placed)
    if spec.kind == OPENAI and route.prompt in _KEYED and affinity is not None:
        try:
            if jsonedit.find_member(body, _KEY) is None:
                return jsonedit.with_member(body, _KEY, _dumps(affinity.hex))
        except ValueError:  # not a JSON object in UTF-8: sent as it is
            return body
    return body


def keyed(spec: UpstreamSpec, chat: dict[str, Any], affinity: Affinity | None) -> dict[str, Any]:
    """A chat request translated for an OpenAI upstream, with its ``prompt_cache_key``."""
    if spec.prompt_cache != AUTO or affinity is None or chat.get(_KEY):
        return chat
    return {**chat, _KEY: affinity.hex}


def marked(spec: UpstreamSpec, sent: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Messages request translated for an Anthropic upstream, with its breakpoints."""
    if spec.prompt_cache != AUTO:
        return sent
    placed = with_breakpoints(sent, minimum_for(str(sent.get("model", ""))))
    return sent if placed is None else placed


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
