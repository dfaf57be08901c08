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
from app.request import events as streams
from app.request.call import SSE_HEADERS, Reply
from app.request.headers import STATUS_HEADER
from app.request.usage import answer_facts

# The largest form of an entry kept on it for its next hits: a stored completion made into
# events is several times its own size (each chunk repeats the answer's id and model), and
# the store keeps up to DECODED_KEYS entries decoded (app/cache/store.py).
FORM_MAX_BYTES = 32 * 1024


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
    # Each form is made once per entry, and the store keeps its hottest entries decoded: a
    # hit of a hot key converts and parses nothing (a 50-token answer replayed as a stream
    # was 19 chunks encoded again on each hit).
    try:
        if stream:
            events = entry.made(("events", route, include_usage),
                                lambda: events_of(entry, route, include_usage),
                                _small_events)  # fmt: skip
            if events is None:
                return None
            # One batch, of its own: a stored stream is all there, so it leaves in one write.
            return Reply(entry.status, list(SSE_HEADERS) + headers, iter([list(events)]))
        body = entry.made(("body", route), lambda: body_of(entry, route), _small_body)
        if body is None:
            return None
    except ValueError:  # ShapeError, or a stored body that is not JSON: a miss
        return None
    facts = entry.made(("facts", route), lambda: answer_facts(body, route), _always)
    ctype = entry.content_type if not entry.is_stream else "application/json"
    headers.insert(0, ("Content-Type", ctype or "application/json"))
    return Reply(entry.status, headers, body, facts)


def _small_events(events: list[bytes] | None) -> bool:
    return events is None or sum(map(len, events)) <= FORM_MAX_BYTES


def _small_body(body: bytes | None) -> bool:
    return body is None or len(body) <= FORM_MAX_BYTES


def _always(_: object) -> bool:
    return True


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
