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
from app.request.routes import CHUNKS, SHAPE_CHAT, SHAPE_COMPLETION, SHAPE_RESPONSE, Route
from app.request.usage import answer_facts

# The largest form of an entry kept on it for its next hits: a stored completion made into
# events is several times its own size (each chunk repeats the answer's id and model), and
# the store keeps up to DECODED_KEYS entries decoded (app/cache/store.py).
FORM_MAX_BYTES = 32 * 1024


def reply_from_entry(
    entry: Entry,
    *,
    route: Route,
    stream: bool,
    include_usage: bool,
    status: str,
    age: int | None,
) -> Reply | None:
    headers = [] if age is None else [("Age", str(age))]
    # Each form is made once per entry, and the store keeps its hottest entries decoded: a
    # hit of a hot key converts and parses nothing (a 50-token answer replayed as a stream
    # was 19 chunks encoded again on each hit).
    try:
        if stream:
            events = entry.made(
                ("events", route, include_usage),
                lambda: events_of(entry, route, include_usage),
                _small_events,
            )
            if events is None:
                return None
            # One batch, of its own: a stored stream is all there, so it leaves in one write.
            batch = iter([list(events)])
            return Reply(entry.status, list(SSE_HEADERS) + headers, batch, cache=status)
        body = entry.made(("body", route), lambda: body_of(entry, route), _small_body)
        if body is None:
            return None
    except ValueError:  # ShapeError, or a stored body that is not JSON: a miss
        return None
    facts = entry.made(("facts", route), lambda: answer_facts(body, route), _always)
    ctype = entry.content_type if not entry.is_stream else "application/json"
    headers.insert(0, ("Content-Type", ctype or "application/json"))
    return Reply(entry.status, headers, body, facts, cache=status)


def _small_events(events: list[bytes] | None) -> bool:
    return events is None or sum(map(len, events)) <= FORM_MAX_BYTES


def _small_body(body: bytes | None) -> bool:
    return body is None or len(body) <= FORM_MAX_BYTES


def _always(_: object) -> bool:
    return True


def events_of(entry: Entry, route: Route, include_usage: bool) -> list[bytes] | None:
    """The entry as stream events (raises ValueError when it cannot be converted), by the
    shape of the route's answers (app/request/routes.py). Embeddings do not stream; a
    Responses or Messages answer stored whole is not made into events: those go upstream."""
    if entry.events is not None:
        if route.events != CHUNKS:  # typed or named events are replayed as they came
            return list(entry.events)
        return shapes.replay_events(entry.events, include_usage=include_usage)
    assert entry.body is not None
    if route.shape == SHAPE_CHAT:
        return chunks.chat_to_events(json.loads(entry.body), include_usage=include_usage)
    if route.shape == SHAPE_COMPLETION:
        return chunks.completion_to_events(json.loads(entry.body), include_usage=include_usage)
    return None


def body_of(entry: Entry, route: Route) -> bytes | None:
    """The entry as a completion body (raises ValueError when it cannot be converted); a
    Messages stream is not assembled into a message."""
    if entry.body is not None:
        return entry.body
    assert entry.events is not None
    if route.shape == SHAPE_CHAT:
        obj = shapes.assemble_chat(entry.events)
    elif route.shape == SHAPE_COMPLETION:
        obj = shapes.assemble_completion(entry.events)
    elif route.shape == SHAPE_RESPONSE:
        obj = streams.completed_response(entry.events)
    else:
        return None
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
