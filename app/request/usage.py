"""A call's usage as the provider reported it: where it is in an answer, and what it counts.
No I/O here.

Where it is: a JSON answer's top-level ``usage`` (OpenAI puts it last), a chat or completions
stream's usage chunk (``"choices": []`` and a usage object, sent when
``stream_options.include_usage`` asks for it; some compatible servers put it on the last
choice chunk instead), a Responses stream's terminal event (its ``response.usage``).

What it counts, under each API's names: chat and completions say ``prompt_tokens`` (every
prompt token, those the provider's prompt cache served included), ``completion_tokens`` and
``prompt_tokens_details.cached_tokens`` (with ``cache_write_tokens`` beside it when a
translation from Anthropic wrote some: app/dialects/chat.py); the Responses API says
``input_tokens``, ``output_tokens`` and ``input_tokens_details.cached_tokens``; Anthropic's
Messages API (the /v1/messages door) ``input_tokens`` for the uncached prompt only, beside
``cache_read_input_tokens`` and ``cache_creation_input_tokens`` (its split by lifetime in
``cache_creation``): its prompt is the three together. A chat usage that carries Anthropic's
names as well (a gateway in front of Anthropic, answering in OpenAI's shape) is read by
chat's rule: its ``prompt_tokens`` already counts the cached ones, which are never added
again. A Messages stream's usage comes in two events, ``message_start`` (the prompt) and
``message_delta`` (the output, cumulative): ``merged`` joins them.

``Usage.sent`` is the object exactly as the provider sent it, never normalised: the log
line's receipt, matched with the provider's invoice. The counts are read from it:
``tokens()`` as sent (the log line's and the metrics' figures), ``billable()`` and
``prompt_parts()`` for a price and the prompt cache's counts, and ``total()`` for a key's
token budgets, each with its own rule for a count that is not a positive integer, written
down where it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.request.routes import Route

# In compact JSON these bytes can only be a member holding an object: a cheap test that a
# stream's event may carry a usage, made on every data event of every stream (a chat
# stream's batch asks it without a call: app/edge/stream_facts.py).
USAGE_OBJECT = b'"usage":{'


@dataclass(frozen=True)
class Usage:
    """One answer's usage object, as sent, and the counts read from it."""

    sent: dict[str, Any]

    @classmethod
    def of(cls, value: Any) -> Usage | None:
        """``value`` (an answer's ``usage`` member) as a usage; None unless it is an object."""
        return cls(value) if isinstance(value, dict) else None

    def __bool__(self) -> bool:
        """An empty object (``"usage": {}``) counts as no usage, as the dict it is: a billed
        call that reports nothing keeps its reservation, and is priced at nothing."""
        return bool(self.sent)

    @property
    def prompt(self) -> Any:
        """The prompt tokens as sent (an integer from any provider that counts them); for
        Anthropic's usage, its uncached, cache-read and cache-written counts together."""
        sent = self.sent
        if "prompt_tokens" in sent:
            return sent["prompt_tokens"]
        if _ANTHROPIC_CACHE[0] in sent or _ANTHROPIC_CACHE[1] in sent:
            return sum(_whole(sent.get(name)) for name in ("input_tokens", *_ANTHROPIC_CACHE))
        return sent.get("input_tokens")

    @property
    def output(self) -> Any:
        """The generated tokens as sent, reasoning included."""
        return self.sent.get("completion_tokens", self.sent.get("output_tokens"))

    @property
    def cached(self) -> Any:
        """The prompt tokens read from the provider's prompt cache, as sent."""
        sent = self.sent
        details = self._details()
        if details is not None and "cached_tokens" in details:
            return details["cached_tokens"]
        if _ANTHROPIC_CACHE[0] in sent:
            return sent[_ANTHROPIC_CACHE[0]]
        return None

    @property
    def written(self) -> Any:
        """The prompt tokens written to the provider's prompt cache, as sent: Anthropic's
        ``cache_creation_input_tokens``, or a chat usage's ``cache_write_tokens`` (the name
        a translation writes; ``cache_creation_tokens``, an older one); None where the API
        reports none (OpenAI and Gemini do not charge a write apart)."""
        details = self._details()
        if details is not None:
            for name in _WRITE_NAMES:
                if name in details:
                    return details[name]
        return self.sent.get(_ANTHROPIC_CACHE[1])

    @property
    def written_1h(self) -> Any:
        """Of the written tokens, those written for an hour (Anthropic's
        ``cache_creation.ephemeral_1h_input_tokens``; a chat usage's
        ``cache_write_1h_tokens``), priced apart; None when not told."""
        details = self._details()
        if details is not None and _WRITE_1H in details:
            return details[_WRITE_1H]
        split = self.sent.get("cache_creation")
        return split.get(_ANTHROPIC_1H) if isinstance(split, dict) else None

    def _details(self) -> dict[str, Any] | None:
        details = self.sent.get("prompt_tokens_details") or self.sent.get("input_tokens_details")
        return details if isinstance(details, dict) else None

    def tokens(self) -> tuple[Any, Any, Any]:
        """(prompt, output, cached) as sent: the log line writes them as they are."""
        return self.prompt, self.output, self.cached

    def billable(self) -> tuple[int, int, int]:
        """(prompt, output, cached) for a price: what is not a positive integer counts 0, and
        the cached tokens never count more than the prompt's, of which they are a part."""
        prompt, output, cached = (_whole(v) for v in self.tokens())
        return prompt, output, min(cached, prompt)

    def prompt_parts(self) -> PromptParts:
        """The prompt split as a price and the prompt cache's counts take it, each token
        once: read from the cache, written to it (of which those for an hour), and the rest.
        What is not a positive integer counts 0; each part is at most what the prompt has
        left, so the parts always add up to the prompt."""
        prompt, _, read = self.billable()
        written = min(_whole(self.written), prompt - read)
        hour = min(_whole(self.written_1h), written)
        return PromptParts(read, written, hour, prompt - read - written)

    def total(self) -> int:
        """The tokens a key's budgets are charged: ``total_tokens`` when it is an integer
        (never below 0), else the sum of the positive counts under either API's names;
        Anthropic's cache counts only where no ``prompt_tokens`` already holds them."""
        total = self.sent.get("total_tokens")
        if isinstance(total, int) and not isinstance(total, bool):
            return max(0, total)
        names: tuple[str, ...] = _COUNT_NAMES
        if "prompt_tokens" not in self.sent:
            names += _ANTHROPIC_CACHE
        return sum(_whole(self.sent.get(name)) for name in names)

    def merged(self, later: Usage) -> Usage:
        """This usage with ``later``'s counts over it: a Messages stream's ``message_start``
        usage updated by its ``message_delta``'s cumulative one."""
        return Usage({**self.sent, **later.sent})


# Anthropic's prompt counts beside ``input_tokens`` (the uncached part).
_ANTHROPIC_CACHE = ("cache_read_input_tokens", "cache_creation_input_tokens")
_ANTHROPIC_1H = "ephemeral_1h_input_tokens"  # in its ``cache_creation`` split
# A chat usage's written tokens (app/dialects/chat.py), in its prompt_tokens_details.
_WRITE_NAMES = ("cache_write_tokens", "cache_creation_tokens")
_WRITE_1H = "cache_write_1h_tokens"
_COUNT_NAMES = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class PromptParts:
    """A prompt's tokens by what the provider's prompt cache did with them; they add up to
    the prompt. ``written_1h`` is a part of ``written``."""

    read: int
    written: int
    written_1h: int
    uncached: int


def may_carry_usage(raw: bytes) -> bool:
    """Whether a stream's data event may hold a usage object: bytes only, no parse."""
    return USAGE_OBJECT in raw


def usage_in_event(raw: bytes) -> Usage | None:
    """The top-level usage of a chat or completions ``data:`` event (its raw bytes, starting
    with ``data: ``); None when it has none or its data is not one JSON object."""
    try:
        return Usage.of(json.loads(raw[6:]).get("usage"))
    except (ValueError, AttributeError):
        return None


def usage_chunk(raw: bytes) -> Usage | None:
    """The usage of a chat/completions stream's usage chunk (``"choices": []`` and a usage
    object), None for any other bytes. Cheap for the chunks that are not it: asked for the
    usage chunk, OpenAI writes ``"usage":null`` into every other chunk, and in compact JSON
    those bytes can only be a member (in a string the quotes would be escaped), so such a
    chunk is not parsed."""
    if not raw.startswith(b"data: {") or b'"usage"' not in raw or b'"usage":null' in raw:
        return None
    try:
        doc = json.loads(raw[6:])
    except ValueError:
        return None
    usage = Usage.of(doc.get("usage")) if isinstance(doc, dict) else None
    return usage if doc.get("choices") == [] else None


def usage_in_body(body: bytes) -> Usage | None:
    """The ``usage`` object of a JSON answer without parsing the whole answer: OpenAI puts it
    last, and an embeddings answer can be megabytes of floats. The last ``"usage"`` member
    is taken: for answers whose content cannot hold one (a generated answer's text can, so
    such an answer is parsed whole and its top-level member read with ``Usage.of``)."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    colon = body.find(b":", at + 7)
    try:
        usage, _ = json.JSONDecoder().raw_decode(body[colon + 1 :].decode("utf-8").lstrip())
    except (ValueError, UnicodeDecodeError):
        return None
    return Usage.of(usage)


def _whole(value: Any) -> int:
    """A count as a whole number: a positive integer as it is, anything else (a bool, a
    negative, a string, null) 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# What a whole answer says of itself: its usage, and the service tier it was billed in.
AnswerFacts = tuple[Usage | None, str | None]


def answer_facts(body: bytes, route: Route) -> AnswerFacts:
    """The top-level ``usage`` and ``service_tier`` of a whole JSON answer to ``route``: a
    generated answer is parsed once (never a member nested in its content: these answers are
    text, not megabytes of floats); any other (embeddings) is searched for its usage only."""
    if not route.generates:
        return usage_in_body(body), None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    return Usage.of(doc.get("usage")), tier_of(doc.get("service_tier"))


def tier_of(value: Any) -> str | None:
    """A service tier as the log line and the span take it: a string, at most 32 characters."""
    return value[:32] if isinstance(value, str) else None
