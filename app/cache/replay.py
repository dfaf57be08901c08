"""A stored answer as the caller asked for it: the same shape it was stored in, or the other.

A stream stored as events replays those events in order, byte for byte (only the usage chunk
is added or dropped to match the caller's `stream_options.include_usage`); a non-stream caller
gets the completion assembled from them. A stored non-stream completion reaches a stream
caller as chunk events. A Responses stream is replayed exactly as stored (its events have no
usage chunk to adapt), and reaches a non-stream caller as the object of its
``response.completed`` event; a stored Responses object is not turned into typed events.
An Anthropic Messages answer (the /v1/messages door) replays only in the shape it was stored
in. Any conversion that fails returns None: the caller goes upstream.
"""

from __future__ import annotations

import json

from app.cache import chunks, shapes
from app.cache.entry import Entry
from app.cache.policy import STATUS_HEADER
from app.request import events as streams
from app.request.call import SSE_HEADERS, Reply


def reply_from_entry(
    entry: Entry,
    *,
    route: str,
    stream: bool,
    include_usage: bool,
    status: str,
    age: int | None,
) -> Reply | None:
    headers = [(STATUS_HEADER, status)]
    if age is not None:
        headers.append(("Age", str(age)))
    try:
        if stream:
            events = events_of(entry, route, include_usage)
            if events is None:
                return None
            # One batch: a stored stream is all there, so it leaves in one write.
            return Reply(entry.status, list(SSE_HEADERS) + headers, iter([events]))
        body = body_of(entry, route)
        if body is None:
            return None
    except ValueError:  # ShapeError, or a stored body that is not JSON: a miss
        return None
    ctype = entry.content_type if not entry.is_stream else "application/json"
    return Reply(entry.status, [("Content-Type", ctype or "application/json"), *headers], body)


def events_of(entry: Entry, route: str, include_usage: bool) -> list[bytes] | None:
    """The entry as stream events (raises ValueError when it cannot be converted)."""
    if entry.events is not None:
        if route in ("responses", "messages"):
            return list(entry.events)
        return shapes.replay_events(entry.events, include_usage=include_usage)
    assert entry.body is not None
    completion = json.loads(entry.body)
    if route == "chat":
        return chunks.chat_to_events(completion, include_usage=include_usage)
    if route == "completions":
        return chunks.completion_to_events(completion, include_usage=include_usage)
    return None  # embeddings do not stream


def body_of(entry: Entry, route: str) -> bytes | None:
    """The entry as a completion body (raises ValueError when it cannot be converted)."""
    if entry.body is not None:
        return entry.body
    assert entry.events is not None
    if route == "chat":
        obj = shapes.assemble_chat(entry.events)
    elif route == "completions":
        obj = shapes.assemble_completion(entry.events)
    elif route == "responses":
        obj = streams.completed_response(entry.events)
    else:  # embeddings do not stream; a Messages stream is not assembled into a message
        return None
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
