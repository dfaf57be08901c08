"""chat.py's canonical pieces written out literally: the other dialect tests build their
expected chunks with the same ChunkWriter, so its own bytes are pinned here."""

from __future__ import annotations

import json

from app.dialects import chat


def test_json_is_compact_utf8_not_escaped() -> None:
    assert chat.dumps({"a": "é", "b": [1]}) == '{"a":"é","b":[1]}'.encode()


def test_an_error_event_carries_its_code() -> None:
    assert chat.error_event("m", "t", "c") == (
        b'data: {"error":{"message":"m","type":"t","param":null,"code":"c"}}\n\n'
    )


def test_usage_without_cache_counts_says_none_were_cached() -> None:
    assert chat.usage(3, 4) == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_thinking_blocks_are_numbered_in_order_whether_signed_or_redacted() -> None:
    writer = chat.ChunkWriter("id", 1, "m")
    chunks = [
        writer.redacted("r1"),
        writer.redacted("r2"),
        writer.signature("s"),
        writer.signature("t"),
    ]
    blocks = [
        json.loads(c.removeprefix(b"data: "))["choices"][0]["delta"]["thinking_blocks"][0]
        for c in chunks
    ]
    assert [b["index"] for b in blocks] == [0, 1, 2, 3]


def test_a_thought_is_reasoning_content_and_in_the_block_its_signature_closes() -> None:
    writer = chat.ChunkWriter("id", 1, "m")
    deltas = [
        json.loads(c.removeprefix(b"data: "))["choices"][0]["delta"]
        for c in (writer.redacted("r"), writer.reasoning("a"), writer.signature("s"))
    ]
    assert deltas[1:] == [
        {"reasoning_content": "a", "thinking_blocks": [
            {"index": 1, "type": "thinking", "thinking": "a"}
        ]},
        {"thinking_blocks": [{"index": 1, "type": "thinking", "thinking": "", "signature": "s"}]},
    ]  # fmt: skip
