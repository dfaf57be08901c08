"""A partial answer continued, as a provider that takes one does. No I/O here.

A chat request whose last message is an assistant turn marked ``prefix: true`` (DeepSeek's and
Mistral's way) or that says ``continue_final_message: true`` (vLLM's), an Anthropic Messages
request whose last message is an assistant turn (its prefill), and a Gemini request whose last
content is a ``model`` turn, ask the model to write on from that turn's text. The simulator's
answer to its prompt without that turn is a fixed word sequence (text.py), so it can continue
deterministically: when the turn is the start of that sequence, the answer is the rest of it,
and the caller who joins the two has the uncut answer. A turn that is not (another model's
words) is continued with words seeded by it.

A scripted chat answer (scripts.py) continues the same way: when the turn is its leading
text pieces joined, the answer is the script without them (its calls, its finish), so a
stream cut inside a tool call is answered with that call again, whole; other text changes
nothing. Its usage is the script's, less one output token a piece left out.

How much is written: an answer of natural length (the ``tokens`` control, or the default)
stops where the uncut answer would have; an answer bounded by the request's
``max_tokens`` writes that many more (the gateway sends what is left of the caller's bound).
The prompt tokens count the turn too, as a provider bills a prefilled turn.

An instruction to go on (the gateway's ``instruction`` continuation, on any route: an
assistant or model turn, then a user turn that asks to continue it "exactly where it
stopped") is followed as a model that half obeys it does: deterministically, the answer
repeats the answer so far's last words (as many as make ``REPEATED_CHARS`` characters, all
of them when it is shorter; without the space before the first), then writes the rest as
above. The repeated words are output tokens of its usage; the gateway trims them.
"""

from __future__ import annotations

import re
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


# What a user turn that asks to go on says (the gateway's words: app/dialects/continuation.py).
ASKS_TO_GO_ON = "continue it exactly where it stopped"
REPEATED_CHARS = 16  # the least an instructed answer repeats of the answer so far


def model_turn(contents: list[Any]) -> str | None:
    """The text of a Gemini request's last content, if it is a ``model`` turn."""
    last = contents[-1]
    if not isinstance(last, dict) or last.get("role") != "model":
        return None
    return text.gemini_prompt(None, [last]) or None


def instructed(turns: list[tuple[Any, str]]) -> str | None:
    """The answer so far that an instruction asks to continue (None: none asked): the text
    of an assistant (or model) turn followed by a last, user, turn that asks to go on;
    ``turns``: each turn's (role, text)."""
    if len(turns) < 2:
        return None
    (role, said), (last_role, asks) = turns[-2], turns[-1]
    if role in ("assistant", "model") and last_role == "user" and said:
        return said if ASKS_TO_GO_ON in asks.lower() else None
    return None


def repeated(partial: str) -> list[str]:
    """The words of ``partial`` an instructed answer repeats (see the module), as tokens."""
    tokens = re.findall(r"\s*\S+", partial)
    k = 0
    while k < len(tokens) and len("".join(tokens[len(tokens) - k :]).lstrip()) < REPEATED_CHARS:
        k += 1
    out = tokens[len(tokens) - k :]
    return [out[0].lstrip(), *out[1:]] if out else []


def rest_of(prompt: str, partial: str, wanted: int, natural: bool) -> list[str]:
    """The words that continue ``partial`` of the answer to ``prompt``: to ``wanted`` words
    in all when the answer has its natural length, else ``wanted`` more."""
    done = len(partial.split())
    if "".join(text.words(prompt, done)) == partial.rstrip():
        total = wanted if natural else done + wanted
        return text.words(prompt, max(total, done))[done:]
    return [" " + word.strip() for word in text.words(prompt + "\x00" + partial, wanted)]


def continued(
    c: Completion, messages: list[Any], partial: str, natural: bool, told: bool = False
) -> Completion:
    """``c`` (the answer as counted for the whole request) as the rest of ``partial``;
    ``told``: asked by an instruction (the last message), the answer repeats some first."""
    before = messages[:-2] if told else messages[:-1]
    rest = rest_of(text.chat_prompt(before), partial, len(c.tokens), natural)
    return replace(c, tokens=tuple((repeated(partial) if told else []) + rest))


def chat_turns(messages: list[Any]) -> list[tuple[Any, str]]:
    """Each chat (or Anthropic) message's (role, text), for ``instructed``."""
    return [(m.get("role"), text.chat_prompt([m])) for m in messages if isinstance(m, dict)]


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
