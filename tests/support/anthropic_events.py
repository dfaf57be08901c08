"""Anthropic's Messages stream events as the tests of the Messages door expect them written
(app/dialects/stream_to_anthropic.py): the data of each event, as a dict. No I/O here."""

from __future__ import annotations

from typing import Any


def message_start(model: str, input_tokens: int, message_id: str = "msg_1") -> dict[str, Any]:
    """The first event: an empty assistant message of ``model`` whose prompt counts
    ``input_tokens`` (the translator's estimate) and nothing written yet."""
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    return {"type": "message_start", "message": message}
