"""A streamed Anthropic answer, accumulated as the OpenAI SDK accumulates it, sent back on
the next turn: what reaches Anthropic must be what it sent (issue 41, E).

The stream is tests/data/dialects/anthropic/thinking.sse, Anthropic's documented events (a
thinking block of two deltas and its signature, a redacted block, text). It goes through the
gateway's translator (app/dialects/answer_from_anthropic.py) in pieces, its chunks are
accumulated by the OpenAI SDK's own ``ChatCompletionStreamState``, the accumulated message
goes back as the SDK sends a message object (its ``model_dump`` of what was set), and the
request translator (app/dialects/request_to_anthropic.py) makes the next Messages request. The
expected blocks are read from the raw events, not from the translator.
"""

from __future__ import annotations

import json
from typing import Any

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from app.dialects.anthropic import StreamToChat, request_body
from tests.conftest import ROOT
from tests.support.sse_feed import decode, steps

RAW = (ROOT / "tests" / "data" / "dialects" / "anthropic" / "thinking.sse").read_bytes()


def _sent_blocks() -> list[dict[str, Any]]:
    """The blocks Anthropic streamed, put together from its raw events."""
    blocks: dict[int, dict[str, Any]] = {}
    for event in decode([RAW])[0]:
        data = event.json() if event.data else {}
        if data.get("type") == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif data.get("type") == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            for name in ("thinking", "signature", "text"):
                if name in delta:
                    block[name] += delta[name]
    return [blocks[i] for i in sorted(blocks)]


def _accumulated(pieces: list[bytes]) -> dict[str, Any]:
    """The assistant message the SDK's accumulator makes of the translated stream, as the SDK
    sends a message object back (what was set, nothing more)."""
    translator, state = StreamToChat(False, 1_700_000_000), ChatCompletionStreamState()
    out = b"".join(translator.feed(p) for p in pieces) + translator.close()
    for event in decode([out])[0]:
        if event.data and not event.is_done:
            state.handle_chunk(ChatCompletionChunk.model_validate(event.json()))
    message = state.current_completion_snapshot.choices[0].message
    return message.model_dump(exclude_unset=True)


def test_a_streamed_thinking_block_goes_back_with_its_text_and_signature() -> None:
    sent = _sent_blocks()
    for pieces in ([RAW], steps(RAW, 7)):
        message = _accumulated(pieces)
        assert message["reasoning_content"] == sent[0]["thinking"] == "Let me add 2 and 2."
        turn = [
            {"role": "user", "content": "What is 2 + 2?"},
            json.loads(json.dumps(message)),  # the JSON the SDK sends
            {"role": "user", "content": "And 3 + 3?"},
        ]
        body = request_body({"model": "c", "messages": turn}, default_max_tokens=100)
        assert body["messages"][1] == {"role": "assistant", "content": sent}
