"""Other providers' dialects, translated to and from OpenAI's. No I/O here.

The gateway's own dialect is OpenAI's (Chat Completions). An upstream of another ``kind``
(app/upstream/catalog.py: ``anthropic``, ``gemini``) is spoken to in its own dialect, and its
answer is turned back into Chat Completions before anything above the transport sees it: the
reader, the flights, the cache, the metering and the relay see an OpenAI upstream. The
Anthropic Messages front door (``POST /v1/messages``) is the same translation the other way.

Every translation is a pure value in, value out; a stream's is a ``Translator``: provider bytes
in as they arrive (``feed``), the caller's dialect's bytes out at once, event by event, never
held back for a later event; ``close`` at the end of the provider's body returns what is left
(a whole answer's translation, or a stream's end when the provider's stream ended as it should;
nothing for a stream cut short, so the reader above sees the cut).

Modules: chat.py (the OpenAI side every translator writes: chunks, usage, errors, the
``Untranslatable`` error); anthropic.py and gemini.py (Chat Completions over those providers:
``request_to_<provider>`` turns a chat request into the provider's, ``answer_from_<provider>``
its answer, whole or streamed, into chat's); anthropic_door.py (Anthropic Messages over Chat
Completions: ``request_from_anthropic`` turns the caller's Messages request into a chat one,
``answer_to_anthropic`` and ``stream_to_anthropic`` a chat answer and stream into Anthropic's).
Each file is named by its direction, Chat Completions being the hub every dialect is turned
into or out of.
"""
