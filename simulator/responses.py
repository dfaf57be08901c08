"""OpenAI response shapes. No I/O here: values in, JSON-ready dicts and SSE bytes out.

Shapes follow the OpenAI API reference as the official SDK parses them: chat.completion,
chat.completion.chunk, text_completion, embedding lists, model lists, the ``{"error": {...}}``
envelope and the headers every answer carries (the Responses API has its own module,
responses_api.py). Stream events are encoded once per token on the hot path, so
``ChunkFramer`` splices the token into pre-encoded JSON instead of dumping a dict each time.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

DONE = b"data: [DONE]\n\n"
MODELS = ("sim-model", "gpt-4o-mini", "gpt-4o", "text-embedding-3-small")
MODELS_CREATED = 1_700_000_000


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def sse(value: Any) -> bytes:
    """One server-sent event carrying ``value`` as JSON."""
    return b"data: " + dumps(value) + b"\n\n"


class ApiError(Exception):
    """An OpenAI-style error response: status, error body and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def to_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# Rate limits the simulator reports, per minute, as OpenAI's x-ratelimit-* headers do.
LIMIT_REQUESTS = 10_000
LIMIT_TOKENS = 2_000_000
OPENAI_VERSION = "2020-10-01"


def api_headers(requests: int, tokens: int) -> list[tuple[str, str]]:
    """``openai-version`` and the ``x-ratelimit-*`` headers after ``requests`` requests and
    ``tokens`` tokens since the last reset: remaining counts go down, resets are how long a
    steady refill takes to give them back (formatted like OpenAI's ``6m0s``, ``20ms``)."""
    requests_ms = requests * 60_000 // LIMIT_REQUESTS
    tokens_ms = tokens * 60_000 // LIMIT_TOKENS
    return [
        ("openai-version", OPENAI_VERSION),
        ("x-ratelimit-limit-requests", str(LIMIT_REQUESTS)),
        ("x-ratelimit-limit-tokens", str(LIMIT_TOKENS)),
        ("x-ratelimit-remaining-requests", str(max(0, LIMIT_REQUESTS - requests))),
        ("x-ratelimit-remaining-tokens", str(max(0, LIMIT_TOKENS - tokens))),
        ("x-ratelimit-reset-requests", duration(requests_ms)),
        ("x-ratelimit-reset-tokens", duration(tokens_ms)),
    ]


def duration(ms: int) -> str:
    """A duration as OpenAI writes it in rate-limit headers: 20ms, 1.5s, 6m0s."""
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:g}s"
    return f"{ms // 60_000}m{ms % 60_000 // 1000}s"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class Completion:
    """What the fake model said, independent of the endpoint that asked."""

    id: str
    created: int
    model: str
    tokens: tuple[str, ...]
    finish_reason: str
    prompt_tokens: int
    # Shown only when the request (service_tier) or a control (cached_tokens) asks, so the
    # shapes other tests pin down stay as they are.
    service_tier: str | None = None
    cached_tokens: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def usage(self) -> dict[str, Any]:
        counts: dict[str, Any] = usage(self.prompt_tokens, len(self.tokens))
        if self.cached_tokens is not None:
            cached = min(self.cached_tokens, self.prompt_tokens)
            counts["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        return counts

    def header(self) -> dict[str, Any]:
        """``service_tier`` where the API puts it, after ``model``, when there is one."""
        return {} if self.service_tier is None else {"service_tier": self.service_tier}


def chat_completion(c: Completion) -> dict[str, Any]:
    return {
        "id": c.id,
        "object": "chat.completion",
        "created": c.created,
        "model": c.model,
        **c.header(),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": c.text, "refusal": None},
                "logprobs": None,
                "finish_reason": c.finish_reason,
            }
        ],
        "usage": c.usage,
    }


def text_completion(c: Completion) -> dict[str, Any]:
    return {
        "id": c.id,
        "object": "text_completion",
        "created": c.created,
        "model": c.model,
        **c.header(),
        "choices": [
            {"text": c.text, "index": 0, "logprobs": None, "finish_reason": c.finish_reason}
        ],
        "usage": c.usage,
    }


def embedding_list(model: str, data: list[Any], prompt_tokens: int) -> dict[str, Any]:
    """``data`` holds one vector (list of floats or base64 string) per input."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": vector}
            for i, vector in enumerate(data)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def model_object(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": MODELS_CREATED, "owned_by": "llmgate"}


def model_list() -> dict[str, Any]:
    return {"object": "list", "data": [model_object(m) for m in MODELS]}


def obfuscation(piece: str) -> str:
    """Padding that evens out the length of a delta event (the API sends random characters
    here, so that the size of an encrypted event does not give away its token)."""
    return "abcdefghijklmnop"[: 16 - len(piece) % 16]


@functools.lru_cache(maxsize=4096)
def _encoded_token(token: str) -> bytes:
    # Tokens come from a small vocabulary: encode each one once per process, not per event.
    return dumps(token)


@dataclass(frozen=True)
class ChunkFramer:
    """Encodes the SSE events of one streamed completion, chat or legacy text."""

    completion: Completion
    chat: bool
    include_usage: bool
    obfuscate: bool = False  # stream_options.include_obfuscation: an `obfuscation` field
    # A running usage on every chunk (the prompt, and the pieces so far), as some
    # OpenAI-compatible servers send it, whether asked or not.
    running_usage: bool = False
    _token_template: tuple[bytes, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Dump a chunk once with a placeholder token, then splice real tokens in between.
        marker = "\x00"
        encoded = dumps(self._chunk(self._choice(marker, None)))
        prefix, _, suffix = encoded.partition(dumps(marker))
        # With obfuscation the pad is the last field, spliced in by token().
        suffix = suffix[:-1] + b',"obfuscation":"' if self.obfuscate else suffix + b"\n\n"
        object.__setattr__(self, "_token_template", (b"data: " + prefix, suffix))

    @property
    def pieces(self) -> tuple[str, ...]:
        return self.completion.tokens

    @property
    def opening_first(self) -> bool:
        return False  # the role chunk comes with the first token

    def piece(self, slot: int) -> bytes:
        if self.running_usage:
            c = self.completion
            counts = usage(c.prompt_tokens, slot + 1)
            return sse(self._chunk(self._choice(c.tokens[slot], None), usage=counts))
        return self.token(self.completion.tokens[slot])

    def _choice(self, token: str, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            delta = {"content": token} if finish_reason is None else {}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"text": token, "index": 0, "logprobs": None, "finish_reason": finish_reason}

    def _chunk(self, choice: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
        c = self.completion
        chunk: dict[str, Any] = {
            "id": c.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": c.created,
            "model": c.model,
            **c.header(),
            "choices": [choice] if choice is not None else [],
        }
        if self.include_usage:
            chunk["usage"] = None  # OpenAI sends null usage on every chunk but the last
        chunk.update(extra)
        return chunk

    def opening(self) -> bytes | None:
        """The role announcement that opens a chat stream; legacy streams have none."""
        if not self.chat:
            return None
        choice = self._choice("", None)
        choice["delta"] = {"role": "assistant", "content": ""}
        running = {"usage": usage(self.completion.prompt_tokens, 0)} if self.running_usage else {}
        return sse(self._chunk(choice, **running))

    def token(self, token: str) -> bytes:
        prefix, suffix = self._token_template
        if self.obfuscate:
            return prefix + _encoded_token(token) + suffix + obfuscation(token).encode() + b'"}\n\n'
        return prefix + _encoded_token(token) + suffix

    def failure(self, slot: int) -> list[bytes]:
        """What the API sends when generation fails part-way: one error event, no [DONE]."""
        del slot
        message = "The server had an error while processing your request (simulated)."
        error = ApiError(500, message, "server_error", code="server_error")
        return [sse(error.to_body())]

    def closing(self) -> list[bytes]:
        """Finish chunk, optional usage chunk, then the [DONE] sentinel."""
        c = self.completion
        running = {"usage": c.usage} if self.running_usage else {}
        events = [sse(self._chunk(self._choice("", c.finish_reason), **running))]
        if self.include_usage:
            events.append(sse(self._chunk(None, usage=c.usage)))
        events.append(DONE)
        return events
