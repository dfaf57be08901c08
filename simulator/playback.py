"""Playing a reply over a connection: when each byte goes out, and which fault interrupts it.

A stream sends its headers at once, waits ``ttft_ms``, sends the role chunk and the first
token together, then one content event every ``1/tps`` seconds on a fixed schedule (a late
wake-up does not push every later token back), then the finish events. Faults act at
"slots": slot i is the moment content event i would be sent, and slot n (n = token count) is
the moment of the finish chunk. Both functions return whether the connection may serve
another request.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import gevent

from .behaviour import Behaviour
from .responses import ChunkFramer
from .stats import Stats
from .wire import ClientGone, Peer, StreamBody, send_full

# A stream that never has to wait still yields now and then, so one fast stream cannot
# starve the accept loop and every other connection.
_YIELD_EVERY = 32


def play_stream(
    peer: Peer,
    framer: ChunkFramer,
    behaviour: Behaviour,
    fault: str | None,
    headers: Iterable[tuple[str, str]],
    *,
    chunked: bool,
    stats: Stats,
) -> bool:
    """Stream one completion as SSE under ``behaviour`` and ``fault``."""
    body = StreamBody(peer, chunked=chunked and fault != "close-delimited", gzip=fault == "gzip")
    stats.streams_started += 1
    try:
        if fault == "reset-before":
            peer.reset()
            return False
        if fault == "slow-headers":
            peer.pause(behaviour.header_delay_ms / 1000)
        body.start(200, headers)
        if fault == "stall-before":
            peer.pause(behaviour.stall_ms / 1000)
        peer.pause(behaviour.ttft_ms / 1000)
        opening = framer.opening()
        if opening is not None:
            body.write(opening)
        if not _content(peer, body, framer, behaviour, fault):
            return False
        body.finish(framer.closing())
    except ClientGone:
        stats.streams_abandoned += 1
        return False
    stats.streams_completed += 1
    return body.chunked


def _content(
    peer: Peer, body: StreamBody, framer: ChunkFramer, b: Behaviour, fault: str | None
) -> bool:
    """Send the content events; False when a reset fault ended the connection."""
    tokens = framer.completion.tokens
    n = len(tokens)
    reset_slot = min(b.reset_after, n) if fault == "reset" else -1
    stall_slot = min(b.stall_after, n) if fault == "stall-after" else -1
    gap = b.token_gap
    start = time.monotonic()
    for slot in range(n + 1):
        if slot:
            delay = start + slot * gap - time.monotonic()
            if delay > 0:
                peer.pause(delay)
            elif slot % _YIELD_EVERY == 0:
                gevent.sleep(0)
        if slot == reset_slot:
            peer.reset()
            return False
        if slot == stall_slot:
            peer.pause(b.stall_ms / 1000)
            start = time.monotonic() - slot * gap  # the schedule resumes after the stall
        if slot < n:
            body.write(framer.token(tokens[slot]))
    return True


def play_full(
    peer: Peer,
    status: int,
    payload: bytes,
    behaviour: Behaviour,
    fault: str | None,
    headers: Iterable[tuple[str, str]],
    *,
    stats: Stats,
) -> bool:
    """A non-stream reply: wait (stall, slow headers, ttft), then answer, reset or not."""
    try:
        if fault in ("stall-before", "stall-after"):
            peer.pause(behaviour.stall_ms / 1000)
        if fault == "slow-headers":
            peer.pause(behaviour.header_delay_ms / 1000)
        peer.pause(behaviour.ttft_ms / 1000)
        if fault in ("reset", "reset-before"):
            peer.reset()
            return False
        send_full(
            peer,
            status,
            payload,
            headers,
            gzip=fault == "gzip",
            close_delimited=fault == "close-delimited",
        )
    except ClientGone:
        stats.requests_abandoned += 1
        return False
    return fault != "close-delimited"
