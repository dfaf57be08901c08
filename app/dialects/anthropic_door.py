"""The Anthropic Messages front door (``POST /v1/messages``) over a Chat Completions
upstream: the translations both ways, in one place. No I/O here: values in, values out, the
message's id passed in.

- ``chat_body``: the caller's Messages request as a Chat Completions request
  (request_from_anthropic.py says what each member becomes, what is dropped and what refused);
- ``ChatToStream``: the upstream's Chat Completions stream as Anthropic's named events, a
  ``Translator`` (``feed``/``close``; stream_to_anthropic.py);
- ``chat_answer_to_message``: a whole ``chat.completion`` as an Anthropic message;
  ``error_body``, ``error_from_chat`` and ``error_event``: Anthropic's error shape, for an
  answer and for a stream that began (answer_to_anthropic.py, with the stop reasons and usage
  both share).
"""

from __future__ import annotations

from app.dialects.answer_to_anthropic import (
    chat_answer_to_message,
    error_body,
    error_event,
    error_from_chat,
)
from app.dialects.request_from_anthropic import chat_body
from app.dialects.stream_to_anthropic import ChatToStream

__all__ = [
    "ChatToStream",
    "chat_answer_to_message",
    "chat_body",
    "error_body",
    "error_event",
    "error_from_chat",
]
