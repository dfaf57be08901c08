"""Chat Completions over Google's Gemini API (``generateContent``, ``streamGenerateContent``
with ``alt=sse``). No I/O here: no clock, no randomness; ``created`` and the fallback ids are
passed in.

The whole translation, one entry each:

- ``target(model, stream)``: the path and query below the upstream's base URL (which ends
  with the API version, ``.../v1beta``);
- ``request_body(body)``: the Chat Completions body as Gemini's (request_to_gemini.py: what maps
  where, and what is refused by name with ``chat.Untranslatable``; ``user`` is dropped, Gemini
  has no such field);
- ``StreamToChat(include_usage, created, fallback_id)``: the stream's Translator, and
  ``answer_to_chat(body, created=, fallback_id=)``: a whole answer (answer_from_gemini.py; Gemini's
  stream has no end event, the end of its body is the end);
- ``error_to_chat(status, body)``: Gemini's error answer as OpenAI's error JSON.
"""

from __future__ import annotations

from urllib.parse import quote

from app.dialects.answer_from_gemini import StreamToChat, answer_to_chat, error_to_chat
from app.dialects.request_to_gemini import request_body

__all__ = ["StreamToChat", "answer_to_chat", "error_to_chat", "request_body", "target"]


def target(model: str, stream: bool) -> tuple[str, str]:
    """(path, query) of a call to ``model``. The model is one path segment, encoded whole (a
    gateway model name may hold "/", as the simulator's ``sim/script=tools``); a name given
    as Gemini's resource name (``models/gemini-2.5-flash``) is not prefixed twice."""
    name = model.removeprefix("models/")
    path = "/models/" + quote(name, safe="")
    if stream:
        return path + ":streamGenerateContent", "alt=sse"
    return path + ":generateContent", ""
