"""A Messages request (the ``/v1/messages`` door's) that continues an answer cut short: the
caller's request again, with the answer so far as its last, assistant, turn. No I/O here.

The chat door's edit is app/dialects/continuation.py's; this is the same edit in Anthropic's
dialect, the door's, before the translation, if any, turns it into the upstream's:

- to an ``anthropic`` upstream (``prefill``) the request goes as it is: its last turn is the
  prefill the model writes on from, without trailing whitespace (Anthropic refuses it);
- to an ``openai`` one (``prefix``, ``continue_final_message``) the translation makes it a
  chat request whose last message is that assistant turn, and ``partial_chat`` then marks it
  as the mode says (the chat door's own edit, ``continued_chat``, with nothing more to take
  off the bound: it was taken off here);
- to a ``gemini`` one (``model_turn``) the translation sends that turn as the request's last
  content, a model turn;
- ``instruction`` (any kind): the answer so far as a whole assistant turn, then a user turn
  asking to go on without repeating it (the chat door's ``INSTRUCTION_TEXT``).

A caller's own prefill (its request ends with an assistant turn) is the start of the answer:
the answer so far goes on in that turn, not in another one after it. The output bound
(``max_tokens``) is what is left of the caller's: less the tokens the answer so far took.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from app.dialects.continuation import (
    CONTINUE_FINAL,
    INSTRUCTION,
    INSTRUCTION_TEXT,
    MODEL_TURN,
    PREFILL,
    PREFIX,
    CannotContinue,
    Partial,
    continued_chat,
)

# The modes that hand the model its own turn to write on from (a thinking model cannot).
_OPEN_TURN = (PREFILL, MODEL_TURN)


def continued_message(body: Mapping[str, Any], partial: Partial, mode: str) -> dict[str, Any]:
    """A Messages request continuing ``partial`` in ``mode``; CannotContinue when it cannot
    be (no output bound left, thinking asked of a prefill, a mode with no edit)."""
    if mode not in (CONTINUE_FINAL, PREFIX, PREFILL, MODEL_TURN, INSTRUCTION):
        raise CannotContinue(f"continuation {mode!r} continues nothing")
    thinking = body.get("thinking")
    if mode in _OPEN_TURN and isinstance(thinking, Mapping) and thinking.get("type") != "disabled":
        raise CannotContinue("a prefill cannot follow thinking")
    doc = copy.deepcopy(dict(body))
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise CannotContinue("the request has no messages")
    said = partial.prefill if mode == PREFILL else partial.text
    if partial.prefill:  # else nothing was said yet: the request as it was
        last = messages[-1]
        if isinstance(last, dict) and last.get("role") == "assistant":
            last["content"] = _extended(last.get("content"), said, mode == PREFILL)
        else:
            messages.append({"role": "assistant", "content": said})
        if mode == INSTRUCTION:
            messages.append({"role": "user", "content": INSTRUCTION_TEXT})
    bound = doc.get("max_tokens")
    if isinstance(bound, int) and not isinstance(bound, bool):
        if bound - partial.used < 1:
            raise CannotContinue("the answer so far used its whole output bound")
        doc["max_tokens"] = bound - partial.used
    return doc


def _extended(content: Any, said: str, strip: bool) -> Any:
    """A caller's prefill with the answer so far after it (in its last text block)."""
    if isinstance(content, str):
        return content + said
    if not isinstance(content, list):
        raise CannotContinue("the request's last turn is not text")
    blocks = [dict(b) if isinstance(b, dict) else b for b in content]
    last = blocks[-1] if blocks else None
    if isinstance(last, dict) and last.get("type") == "text" and isinstance(last.get("text"), str):
        last["text"] += said
    else:
        blocks.append({"type": "text", "text": said})
    if strip and isinstance(blocks[-1], dict):
        blocks[-1]["text"] = blocks[-1]["text"].rstrip()
    return blocks


def partial_chat(chat: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The translation of a continuing Messages request (its last message the answer so
    far, an assistant's) as ``mode`` hands a partial turn to an OpenAI-kind server (an
    ``instruction`` is a whole turn and its user turn: nothing to mark)."""
    doc = dict(chat)
    if mode not in (PREFIX, CONTINUE_FINAL):
        return doc
    messages = list(doc.get("messages") or ())
    last = messages.pop() if messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise CannotContinue("the request does not end with the answer so far")
    content = last.get("content")
    if not isinstance(content, str):
        raise CannotContinue("the request does not end with the answer so far")
    doc["messages"] = messages
    return continued_chat(doc, Partial(content, 0), mode)
