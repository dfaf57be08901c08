"""Chat Completions over Anthropic's Messages API: the translations the transport uses for an
upstream of kind ``anthropic``. No I/O here; no clock and no randomness either (the answer's
creation time is passed in; ids are Anthropic's).

- ``request_body``: a chat request as a Messages request (request_to_anthropic.py says which
  field goes where, which are refused and which are dropped);
- ``StreamToChat``: Anthropic's named SSE events as chat chunks, event by event;
- ``answer_to_chat``: a whole Messages answer as a ``chat.completion``;
- ``error_to_chat``: an Anthropic error answer as OpenAI's error JSON (529 becomes 503).

The answer side is answer_from_anthropic.py.
"""

from __future__ import annotations

from app.dialects.answer_from_anthropic import StreamToChat, answer_to_chat, error_to_chat
from app.dialects.request_to_anthropic import request_body

__all__ = ["StreamToChat", "answer_to_chat", "error_to_chat", "request_body"]
