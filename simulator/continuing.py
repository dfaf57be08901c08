"""A partial answer continued, as a provider that takes one does. No I/O here.

A chat request whose last message is an assistant turn marked ``prefix: true`` (DeepSeek's and
Mistral's way) or that says ``continue_final_message: true`` (vLLM's), and an Anthropic
Messages request whose last message is an assistant turn (its prefill), ask the model to write
on from that turn's text. The simulator's answer to its prompt without that turn is a fixed
word sequence (text.py), so it can continue deterministically: when the turn is the start of
that sequence, the answer is the rest of it, and the caller who joins the two has the uncut
answer. A turn that is not (another model's words) is continued with words seeded by it.

A scripted chat answer (scripts.py) continues the same way: when the turn is its leading
text pieces joined, the answer is the script without them (its calls, its finish), so a
stream cut inside a tool call is answered with that call again, whole; other text changes
nothing. Its usage is the script's, less one output token a piece left out.

How much is written: an answer of natural length (the ``tokens`` control, or the default)
stops where the uncut answer would have; an answer bounded by the request's
``max_tokens`` writes that many more (the gateway sends what is left of the caller's bound).
The prompt tokens count the turn too, as a provider bills a prefilled turn.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import scripts, text
from .responses import Completion


def partial_turn(body: dict[str, Any], messages: list[Any]) -> str | None:
    """The answer so far this request asks to continue, if it asks (None: an ordinary one)."""
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    content = last.get("content")
    if not isinstance(content, str) or not content:
        return None
    if last.get("prefix") is True or body.get("continue_final_message") is True:
        return content
    return None


def prefill(messages: list[Any]) -> str | None:
    """The text of a Messages request's last, assistant, turn (its prefill), if it has one."""
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    return text.messages_prompt(None, [last]) or None


def rest_of(prompt: str, partial: str, wanted: int, natural: bool) -> list[str]:
    """The words that continue ``partial`` of the answer to ``prompt``: to ``wanted`` words
    in all when the answer has its natural length, else ``wanted`` more."""
    done = len(partial.split())
    if "".join(text.words(prompt, done)) == partial.rstrip():
        total = wanted if natural else done + wanted
        return text.words(prompt, max(total, done))[done:]
    return [" " + word.strip() for word in text.words(prompt + "\x00" + partial, wanted)]


def continued(c: Completion, messages: list[Any], partial: str, natural: bool) -> Completion:
    """``c`` (the answer as counted for the whole request) as the rest of ``partial``."""
    rest = rest_of(text.chat_prompt(messages[:-1]), partial, len(c.tokens), natural)
    return replace(c, tokens=tuple(rest))


def script_rest(script: scripts.Script, partial: str | None) -> scripts.Script:
    """``script`` without the leading text pieces ``partial`` holds (as it is, when it holds
    none, or other text)."""
    first = script.blocks[0] if script.blocks else None
    if not partial or first is None or first.kind != "text":
        return script
    for k in range(1, len(first.pieces) + 1):
        if "".join(first.pieces[:k]) == partial:
            rest = replace(first, pieces=first.pieces[k:])
            blocks = ((rest,) if rest.pieces else ()) + script.blocks[1:]
            usage = replace(script.usage, output=max(0, script.usage.output - k))
            return replace(script, blocks=blocks, usage=usage)
    return script
