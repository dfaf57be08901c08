"""A request that continues an answer cut short: the caller's request again, with the answer
so far handed back as a partial assistant turn, as the upstream takes one. No I/O here.

How an upstream continues is its ``continuation`` in the upstreams file
(app/upstream/catalog.py); unset, its kind's (``DEFAULTS``): an Anthropic upstream's prefill
and a Gemini one's model turn, the provider's own way of writing on from a partial turn, and
``off`` for the ``openai`` kind: the gateway cannot tell an OpenAI-compatible server that
takes a partial turn from one that does not (OpenAI's own takes none), and a mode that a
server does not understand would have it answer the question again, not continue. The modes
(docs/streams.md):

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
- ``model_turn`` (Gemini): the assistant turn last, which the translation sends as the
  ``generateContent`` request's last content, a ``model`` turn; Gemini writes on from its
  text. Not with thinking asked for, as for a prefill.
- ``instruction`` (any kind; for servers that take no partial turn, OpenAI's own): the
  answer so far as a whole assistant turn, then a user turn asking to go on exactly where it
  stopped without repeating it (``INSTRUCTION``). An approximation: the model writes on from
  an instruction, not from its own open turn, and may repeat the end of the answer so far;
  the repeat is trimmed before it is relayed (app/upstream/overlap.py).
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
MODEL_TURN = "model_turn"
INSTRUCTION = "instruction"

# The modes an upstream of each kind may have.
MODES = {
    "openai": (OFF, CONTINUE_FINAL, PREFIX, INSTRUCTION),
    "anthropic": (OFF, PREFILL, INSTRUCTION),
    "gemini": (OFF, MODEL_TURN, INSTRUCTION),
}
# Each kind's mode when its upstream sets none: the provider's own way to write on.
DEFAULTS = {"openai": OFF, "anthropic": PREFILL, "gemini": MODEL_TURN}
# The modes that hand the model its own turn to write on from (a thinking model cannot).
_OPEN_TURN = (PREFILL, MODEL_TURN)
# The user turn of ``instruction``: to write only the rest, from the very character after.
INSTRUCTION_TEXT = (
    "Your previous answer was cut off. Continue it exactly where it stopped, even in the "
    "middle of a word or sentence. Do not repeat any of it and do not add any preface: "
    "write only the rest."
)

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
    if mode not in (CONTINUE_FINAL, PREFIX, PREFILL, MODEL_TURN, INSTRUCTION):
        raise CannotContinue(f"continuation {mode!r} continues nothing")
    if mode in _OPEN_TURN and (body.get("reasoning_effort") or body.get("thinking")):
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
        elif mode == CONTINUE_FINAL:
            doc["continue_final_message"] = True
            doc["add_generation_prompt"] = False
        messages.append(turn)
        if mode == INSTRUCTION:
            messages.append({"role": "user", "content": INSTRUCTION_TEXT})
    for name in _CHAT_BOUNDS:
        bound = doc.get(name)
        if isinstance(bound, int) and not isinstance(bound, bool):
            if bound - partial.used < 1:
                raise CannotContinue("the answer so far used its whole output bound")
            doc[name] = bound - partial.used
            break
    return doc
