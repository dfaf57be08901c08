"""The bodies tests send: a chat completion for the simulator's model, built in one place.

The simulator answers any model name, and its text is a pure function of the prompt and the
token count (simulator/text.py), so a test sets only what it is about and reads the answer
back from the prompt it chose.
"""

from __future__ import annotations

from typing import Any

MODEL = "sim-model"
CHAT: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a story"}],
}


def chat(stream: bool = False, **fields: Any) -> dict:
    """The story prompt's body, with ``fields`` added (or replacing its own)."""
    return {**CHAT, "stream": stream, **fields}


def chat_about(prompt: str, **fields: Any) -> dict:
    """A body whose one user message is ``prompt``, with ``fields`` after it in their order."""
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **fields}
