"""Cached prompt tokens billed once, at the right price, whoever answered and whichever door
asked (issue 43, item 4). Each provider's usage object as its API documents it, whole and
streamed, is read through the translation the gateway makes for each door
(app/upstream/translation.py), found where the end of the call finds it (a body's usage, a
stream's usage chunk, a Messages stream's ``message_start`` updated by its
``message_delta``), and priced (app/tenancy/prices.py). The expected figures are worked out
here from what each provider documents its counts to mean: Anthropic's ``input_tokens`` are
the uncached part, beside the cache's reads and writes; OpenAI's ``prompt_tokens`` and
Gemini's ``promptTokenCount`` hold the cached ones.

The two bug shapes of a popular gateway's tracker are cases below: cached tokens charged
twice (a usage that names the cached tokens twice, in OpenAI's detail and in Anthropic's
names, as a gateway in front of Anthropic sends it), and a streamed cached answer priced
wrong (a Messages stream whose cache counts come only in ``message_start``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.edge.stream_facts import StreamFacts
from app.request.routes import CHAT, MESSAGES, RESPONSES, Route
from app.request.usage import PromptParts, Usage, answer_facts
from app.tenancy.prices import Price, load
from app.upstream.translation import Outgoing, translation_for
from llmgate_wire import sse
from tests.support.fake_raw import PieceRaw

# Claude Sonnet's prices per million tokens, as the config file takes them.
TABLE = {
    "version": "t",
    "models": {
        "m": {
            "input": 3,
            "cached_input": 0.3,
            "cache_write": 3.75,
            "cache_write_1h": 6,
            "output": 15,
        }
    },
}
PRICE = load(TABLE, lambda key, why: ValueError(f"{key} {why}")).models["m"]

# What every case's provider counted, in its own terms (and so what the caller is billed).
UNCACHED, READ, WRITTEN_5M, WRITTEN_1H, OUTPUT = 50, 2000, 400, 300, 30
WRITTEN = WRITTEN_5M + WRITTEN_1H
PROMPT = UNCACHED + READ + WRITTEN


def _cost(uncached: int, read: int, w5: int, w1h: int, output: int) -> int:
    """Picodollars, at TABLE's prices (USD per million tokens: picodollars per token)."""
    return (
        uncached * 3_000_000
        + read * 300_000
        + w5 * 3_750_000
        + w1h * 6_000_000
        + output * 15_000_000
    )


# -- each provider's usage, as documented ---------------------------------------------------
ANTHROPIC_USAGE = {
    "input_tokens": UNCACHED,
    "cache_creation_input_tokens": WRITTEN,
    "cache_read_input_tokens": READ,
    "cache_creation": {
        "ephemeral_5m_input_tokens": WRITTEN_5M,
        "ephemeral_1h_input_tokens": WRITTEN_1H,
    },
    "output_tokens": OUTPUT,
    "service_tier": "standard",
}
# OpenAI and Gemini charge nothing apart for a write: their prompt is uncached or read.
OPENAI_USAGE = {
    "prompt_tokens": UNCACHED + READ,
    "completion_tokens": OUTPUT,
    "total_tokens": UNCACHED + READ + OUTPUT,
    "prompt_tokens_details": {"cached_tokens": READ, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}
RESPONSES_USAGE = {
    "input_tokens": UNCACHED + READ,
    "input_tokens_details": {"cached_tokens": READ},
    "output_tokens": OUTPUT,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": UNCACHED + READ + OUTPUT,
}
GEMINI_USAGE = {
    "promptTokenCount": UNCACHED + READ,
    "candidatesTokenCount": OUTPUT - 5,
    "thoughtsTokenCount": 5,
    "cachedContentTokenCount": READ,
    "totalTokenCount": UNCACHED + READ + OUTPUT,
}
ANTHROPIC_COST = _cost(UNCACHED, READ, WRITTEN_5M, WRITTEN_1H, OUTPUT)
OTHERS_COST = _cost(UNCACHED, READ, 0, 0, OUTPUT)


def _dumps(value: Any) -> str:
    """Compact JSON, as the providers send it."""
    return json.dumps(value, separators=(",", ":"))


def _named(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {_dumps({'type': kind, **data})}\n\n".encode()


def _anthropic_message() -> bytes:
    content = [{"type": "text", "text": "Hi"}]
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": content,
        "stop_reason": "end_turn",
        "stop_sequence": None,
    }
    return _dumps({**message, "usage": ANTHROPIC_USAGE}).encode()


def _anthropic_stream(final: dict[str, Any]) -> bytes:
    """``final``: message_delta's usage (the API's older streams count only the output there;
    its newer ones repeat every count, cumulative)."""
    start_usage = {**ANTHROPIC_USAGE, "output_tokens": 1}
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    block = {"type": "text", "text": ""}
    return b"".join(
        [
            _named("message_start", message=message),
            _named("content_block_start", index=0, content_block=block),
            _named("ping"),
            _named("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
            _named("content_block_stop", index=0),
            _named(
                "message_delta",
                delta={"stop_reason": "end_turn", "stop_sequence": None},
                usage=final,
            ),
            _named("message_stop"),
        ]
    )


def _chat_chunk(delta: dict[str, Any] | None, usage: dict[str, Any] | None = None) -> bytes:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [],
    }
    if delta is not None:
        finish = "stop" if delta == {} else None
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    chunk["usage"] = usage
    return b"data: " + _dumps(chunk).encode() + b"\n\n"


def _openai_answer(usage: dict[str, Any]) -> bytes:
    message = {"role": "assistant", "content": "Hi", "refusal": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    return _dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [choice],
            "usage": usage,
        }
    ).encode()


def _openai_stream(usage: dict[str, Any]) -> bytes:
    return (
        _chat_chunk({"role": "assistant", "content": ""})
        + _chat_chunk({"content": "Hi"})
        + _chat_chunk({})
        + _chat_chunk(None, usage)
        + b"data: [DONE]\n\n"
    )


def _gemini_answer() -> bytes:
    candidate = {
        "content": {"parts": [{"text": "Hi"}], "role": "model"},
        "finishReason": "STOP",
        "index": 0,
    }
    return _dumps(
        {
            "candidates": [candidate],
            "usageMetadata": GEMINI_USAGE,
            "modelVersion": "m",
            "responseId": "r1",
        }
    ).encode()


def _gemini_stream() -> bytes:
    """Gemini puts a running usageMetadata on each chunk; the cached count may come only with
    the last one, which is the total."""
    first = {
        "candidates": [{"content": {"parts": [{"text": "H"}], "role": "model"}, "index": 0}],
        "usageMetadata": {"promptTokenCount": UNCACHED + READ, "totalTokenCount": 1},
    }
    last = json.loads(_gemini_answer())
    last["candidates"][0]["content"]["parts"] = [{"text": "i"}]
    return b"".join(b"data: " + _dumps(c).encode() + b"\r\n\r\n" for c in (first, last))


def _responses_stream() -> bytes:
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "m",
        "output": [],
        "usage": RESPONSES_USAGE,
    }
    done = {"type": "response.completed", "sequence_number": 3, "response": response}
    delta = {"type": "response.output_text.delta", "sequence_number": 2, "delta": "Hi"}
    return b"".join(f"event: {d['type']}\ndata: {_dumps(d)}\n\n".encode() for d in (delta, done))


def _responses_answer() -> bytes:
    return _dumps(
        {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": "m",
            "output": [],
            "usage": RESPONSES_USAGE,
        }
    ).encode()


# -- through the gateway ---------------------------------------------------------------------
def _billed(kind: str, route: Route, answer: bytes, stream: bool) -> Usage:
    """The usage the end of the call bills: ``answer`` (the upstream's bytes) read through the
    translation the call's door and the upstream's kind take, then found where finish.py
    finds it."""
    translation = translation_for(kind, route)
    if translation is not None:
        ctype = "text/event-stream" if stream else "application/json"
        sent = Outgoing("/x", "", {}, b"{}", stream, "m", include_usage=True)
        raw = PieceRaw([answer[i : i + 7] for i in range(0, len(answer), 7)], ctype)
        translated = translation.answer(
            raw,
            sent,
            limit=1 << 20,
            max_event=1 << 20,
            prompt_bytes=400,
        )
        answer = translated.read()
    if not stream:
        usage, _ = answer_facts(answer, route)
        assert usage is not None
        return usage
    facts = StreamFacts()
    events = [e.raw for e in sse.Decoder().feed(answer)]
    facts.each(events, route.events == "typed", route.events == "named", False)
    assert facts.usage is not None
    return facts.usage


CASES = [
    # (upstream kind, door's route, whole answer, stream, its expected cost)
    (
        "anthropic",
        MESSAGES,
        _anthropic_message(),
        _anthropic_stream(ANTHROPIC_USAGE),
        ANTHROPIC_COST,
    ),
    ("anthropic", CHAT, _anthropic_message(), _anthropic_stream(ANTHROPIC_USAGE), ANTHROPIC_COST),
    ("openai", CHAT, _openai_answer(OPENAI_USAGE), _openai_stream(OPENAI_USAGE), OTHERS_COST),
    ("openai", MESSAGES, _openai_answer(OPENAI_USAGE), _openai_stream(OPENAI_USAGE), OTHERS_COST),
    ("openai", RESPONSES, _responses_answer(), _responses_stream(), OTHERS_COST),
    ("gemini", CHAT, _gemini_answer(), _gemini_stream(), OTHERS_COST),
    ("gemini", MESSAGES, _gemini_answer(), _gemini_stream(), OTHERS_COST),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("kind", "route", "whole", "streamed", "cost"),
    CASES,
    ids=[f"{c[0]}-to-{c[1].name}" for c in CASES],
)
def test_cached_usage_is_billed_once_at_its_prices(
    kind: str, route: Route, whole: bytes, streamed: bytes, cost: int, stream: bool
) -> None:
    usage = _billed(kind, route, streamed if stream else whole, stream)
    written = (WRITTEN, WRITTEN_1H) if cost == ANTHROPIC_COST else (0, 0)
    assert usage.prompt_parts() == PromptParts(READ, *written, UNCACHED)
    assert PRICE.cost(usage) == cost
    # A key's token budget: each prompt token once, and the output.
    prompt = UNCACHED + READ + written[0]
    assert usage.total() == prompt + OUTPUT


def test_a_streamed_anthropic_answer_whose_cache_counts_come_only_first_is_billed_right() -> None:
    """The older Messages streams count only the output in ``message_delta``: the cache's
    reads and writes are ``message_start``'s, and must stay in the bill."""
    streamed = _anthropic_stream({"output_tokens": OUTPUT})
    for route in (MESSAGES, CHAT):
        usage = _billed("anthropic", route, streamed, stream=True)
        assert PRICE.cost(usage) == ANTHROPIC_COST
        assert usage.total() == PROMPT + OUTPUT


def test_cached_tokens_named_twice_are_charged_once() -> None:
    """A gateway in front of Anthropic answering in OpenAI's shape: ``prompt_tokens`` holds
    every prompt token, and the cache's counts are named again in Anthropic's words beside
    OpenAI's. Neither the price nor the token budget counts them twice, nor leaves out the
    uncached ones."""
    usage = {
        "prompt_tokens": PROMPT,
        "completion_tokens": OUTPUT,
        "prompt_tokens_details": {"cached_tokens": READ},
        "cache_read_input_tokens": READ,
        "cache_creation_input_tokens": WRITTEN,
    }
    for stream in (False, True):
        answer = _openai_stream(usage) if stream else _openai_answer(usage)
        billed = _billed("openai", CHAT, answer, stream)
        assert billed.prompt_parts() == PromptParts(READ, WRITTEN, 0, UNCACHED)
        assert PRICE.cost(billed) == _cost(UNCACHED, READ, WRITTEN, 0, OUTPUT)
        assert billed.total() == PROMPT + OUTPUT


def test_write_prices_default_to_the_input_price_and_the_hour_to_the_five_minutes() -> None:
    fail = lambda key, why: ValueError(f"{key} {why}")  # noqa: E731
    plain = load({"version": "v", "models": {"m": {"input": 1, "output": 2}}}, fail).models["m"]
    written = Usage(ANTHROPIC_USAGE)
    assert plain.cost(written) == PROMPT * 1_000_000 + OUTPUT * 2_000_000  # all at input
    five = {"input": 1, "output": 2, "cache_write": 1.25}
    priced = load({"version": "v", "models": {"m": five}}, fail).models["m"]
    expected = (UNCACHED + READ) * 1_000_000 + WRITTEN * 1_250_000 + OUTPUT * 2_000_000
    assert priced.cost(written) == expected
    # The bound of a call counts its prompt at the dearest of the prompt's prices.
    assert priced.bound(10, 0) == 12_500_000 and PRICE.bound(1, 0) == 6_000_000
    with pytest.raises(ValueError, match="cache_write_1h"):
        load({"version": "v", "models": {"m": {**five, "cache_write_1h": "x"}}}, fail)
    assert (
        Price(1, 1, 1)
        == load({"version": "v", "models": {"m": {"input": 1e-6, "output": 1e-6}}}, fail).models[
            "m"
        ]
    )


def test_a_chained_gateways_usage_keeps_its_writes_through_either_door() -> None:
    """An OpenAI-compatible upstream that is itself a gateway in front of Anthropic (as this
    one answers chat: tests/integration/test_chained_gateway.py): its usage names the writes
    and their hour's part; the Messages door gives them back in Anthropic's names, priced
    the same."""
    details = {
        "cached_tokens": READ,
        "cache_write_tokens": WRITTEN,
        "cache_write_1h_tokens": WRITTEN_1H,
    }
    usage = {
        "prompt_tokens": PROMPT,
        "completion_tokens": OUTPUT,
        "total_tokens": PROMPT + OUTPUT,
        "prompt_tokens_details": details,
    }
    for route in (CHAT, MESSAGES):
        for stream in (False, True):
            answer = _openai_stream(usage) if stream else _openai_answer(usage)
            billed = _billed("openai", route, answer, stream)
            assert PRICE.cost(billed) == ANTHROPIC_COST, (route, stream)
            assert billed.total() == PROMPT + OUTPUT
