"""The Anthropic Messages front door (``POST /v1/messages``) over a Chat Completions
upstream: the translations both ways, in one place. No I/O here: values in, values out, the
message's id passed in.

- ``chat_body``: the caller's Messages request as a Chat Completions request
  (messages_request.py says what each member becomes, what is dropped and what refused);
- ``ChatToStream``: the upstream's Chat Completions stream as Anthropic's named events, a
  ``Translator`` (``feed``/``close``; messages_stream.py);
- ``chat_answer_to_message``: a whole ``chat.completion`` as an Anthropic message;
  ``error_body``, ``error_from_chat`` and ``error_event``: Anthropic's error shape, for an
  answer and for a stream that began (messages_answer.py, with the stop reasons and usage
  both share).
"""

from __future__ import annotations

from app.dialects.messages_answer import (
    chat_answer_to_message,
    error_body,
    error_event,
    error_from_chat,
)
from app.dialects.messages_request import chat_body
from app.dialects.messages_stream import ChatToStream

__all__ = [
    "ChatToStream",
    "chat_answer_to_message",
    "chat_body",
    "error_body",
    "error_event",
    "error_from_chat",
]
