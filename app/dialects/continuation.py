"""A request that continues an answer cut short: the caller's request again, with the answer
so far handed back as a partial assistant turn, as the upstream takes one. No I/O here.

How an upstream continues is its ``continuation`` in the upstreams file
(app/upstream/catalog.py), ``off`` unless the operator sets it, for every kind: the gateway
cannot tell an OpenAI-compatible server that takes a partial turn from one that does not
(OpenAI's own takes none), and a mode that a server does not understand would have it answer
the question again, not continue. The modes built (docs/streams.md):

- ``continue_final_message`` (vLLM, SGLang and other servers that render the chat template):
  the assistant turn last, with ``continue_final_message: true`` and
  ``add_generation_prompt: false``: the template leaves that turn open instead of closing it.
- ``prefix`` (DeepSeek's and Mistral's APIs): the assistant turn last, marked
  ``prefix: true``.
- ``prefill`` (Anthropic): the assistant turn last, which the translation sends as the
  Messages request's last turn, its prefill; the model writes on from its end. Anthropic
  refuses trailing whitespace there, so it goes without (``Partial.prefill``), and the
  continuation's leading whitespace is not relayed twice (app/upstream/splice.py). Not with
  thinking asked for: a prefill cannot follow it (``CannotContinue``).
- ``off``: never continued there.

The edit is made on a Chat Completions request (the chat door's), before the translation,
if any, turns it into the upstream's dialect. The output bound is what is left of the
caller's: less the tokens the answer so far took.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OFF = "off"
CONTINUE_FINAL = "continue_final_message"
PREFIX = "prefix"
PREFILL = "prefill"

# The modes an upstream of each kind may have (the others' are not built yet: off).
MODES = {"openai": (OFF, CONTINUE_FINAL, PREFIX), "anthropic": (OFF, PREFILL), "gemini": (OFF,)}

# The output bound's names, in the order a chat request's are read (the newer first).
_CHAT_BOUNDS = ("max_completion_tokens", "max_tokens")


class CannotContinue(ValueError):
    """This request cannot be continued this way (it says why)."""


@dataclass(frozen=True)
class Partial:
    """The answer so far: its ``text`` as the caller received it, and the output tokens it
    took (``used``: as the upstream reported them, else one a content event)."""

    text: str
    used: int

    @property
    def prefill(self) -> str:
        """The text as a prefill carries it: without trailing whitespace."""
        return self.text.rstrip()


def continued_chat(body: Mapping[str, Any], partial: Partial, mode: str) -> dict[str, Any]:
    """A Chat Completions request continuing ``partial`` in ``mode``; CannotContinue when
    it cannot be (no output bound left, a mode it has no edit for)."""
    if mode not in (CONTINUE_FINAL, PREFIX, PREFILL):
        raise CannotContinue(f"continuation {mode!r} continues nothing")
    if mode == PREFILL and (body.get("reasoning_effort") or body.get("thinking")):
        raise CannotContinue("a prefill cannot follow thinking")
    doc = copy.deepcopy(dict(body))
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise CannotContinue("the request has no messages")
    if partial.prefill:  # else nothing was said yet: the request as it was
        turn: dict[str, Any] = {"role": "assistant", "content": partial.text}
        if mode == PREFIX:
            turn["prefix"] = True
        elif mode == PREFILL:
            turn["content"] = partial.prefill
        else:
            doc["continue_final_message"] = True
            doc["add_generation_prompt"] = False
        messages.append(turn)
    for name in _CHAT_BOUNDS:
        bound = doc.get(name)
        if isinstance(bound, int) and not isinstance(bound, bool):
            if bound - partial.used < 1:
                raise CannotContinue("the answer so far used its whole output bound")
            doc[name] = bound - partial.used
            break
    return doc
