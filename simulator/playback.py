"""Playing a reply over a connection: when each byte goes out, and which fault interrupts it.

A stream sends its headers at once, waits ``ttft_ms``, sends the role chunk and the first
token together (a Responses stream sends its lifecycle events before that wait, as the API
does: ``response.created`` at once, the first output delta after the model's TTFT), then one
content event every ``1/tps`` seconds on a fixed schedule (a late wake-up does not push
every later token back), then the finish events. Faults act at "slots": slot i is the
moment content event i would be sent, and slot n (n = token count) is the moment of the
finish chunk. A stream is framed by a ``Framer``: chat and legacy chunks (responses.py), the
Responses API's typed events (responses_api.py), a scripted answer in Chat Completions
(chat_scripts.py), Anthropic's events (anthropic.py) or Gemini's chunks (gemini.py), so every
fault works the same on each. A dialect with a keep-alive event (Anthropic's ``ping``) sends
it every ``ping_ms`` while the stream waits after its opening went out (the TTFT, a stall, a
slow token), when that control is set. Both functions return whether the connection may
serve another request.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Protocol

import gevent

from .behaviour import Behaviour
from .stats import Stats
from .wire import ClientGone, Peer, StreamBody, send_full


class Framer(Protocol):
    """The events of one stream: an opening, one event per piece, then an end."""

    @property
    def pieces(self) -> Sequence[object]: ...  # one per slot

    @property
    def opening_first(self) -> bool: ...  # the opening goes out before the TTFT wait

    def opening(self) -> bytes | None: ...

    def piece(self, slot: int) -> bytes: ...

    def closing(self) -> list[bytes]: ...

    def failure(self, slot: int) -> list[bytes]: ...


def processing_ms(started: float) -> tuple[str, str]:
    """OpenAI's ``openai-processing-ms``: time spent on the request before the head went out."""
    return ("openai-processing-ms", str(round((time.monotonic() - started) * 1000)))


# A stream that never has to wait still yields now and then, so one fast stream cannot
# starve the accept loop and every other connection.
_YIELD_EVERY = 32


def play_stream(
    peer: Peer,
    framer: Framer,
    behaviour: Behaviour,
    fault: str | None,
    headers: Iterable[tuple[str, str]],
    *,
    chunked: bool,
    stats: Stats,
    started: float,
    ping: bytes | None = None,
) -> bool:
    """Stream one completion as SSE under ``behaviour`` and ``fault``; ``ping`` is the
    dialect's keep-alive event, if it has one."""
    body = StreamBody(peer, chunked=chunked and fault != "close-delimited", gzip=fault == "gzip")
    stats.streams_started += 1
    try:
        if fault == "reset-before":
            peer.reset()
            return False
        if fault == "slow-headers":
            peer.pause(behaviour.header_delay_ms / 1000)
        body.start(200, [*headers, processing_ms(started)])
        if fault == "stall-before":
            peer.pause(behaviour.stall_ms / 1000)
        opening = framer.opening()
        wait = _Wait(peer, body, None, behaviour.ping_ms)
        if opening is not None and framer.opening_first:
            body.write(opening)
            wait = _Wait(peer, body, ping, behaviour.ping_ms)
        wait(behaviour.ttft_ms / 1000)
        if opening is not None and not framer.opening_first:
            body.write(opening)
            wait = _Wait(peer, body, ping, behaviour.ping_ms)
        ended = _content(wait, body, framer, behaviour, fault)
        if ended is None:
            return False
        body.finish(ended)
    except ClientGone:
        stats.streams_abandoned += 1
        return False
    stats.streams_completed += 1
    return body.chunked


class _Wait:
    """Waits inside a stream: with a ping and ``ping_ms``, the ping goes out every
    ``ping_ms`` while a wait lasts longer than that."""

    def __init__(self, peer: Peer, body: StreamBody, ping: bytes | None, every_ms: float | None):
        self.peer, self.body, self.ping = peer, body, ping or b""
        self.every = every_ms / 1000 if ping and every_ms else None

    def __call__(self, seconds: float) -> None:
        if self.every is None:
            self.peer.pause(seconds)
            return
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > self.every:
            self.peer.pause(self.every)
            self.body.write(self.ping)
        self.peer.pause(left)


def _content(
    wait: _Wait, body: StreamBody, framer: Framer, b: Behaviour, fault: str | None
) -> list[bytes] | None:
    """Send the content events; the events that end the stream (the finish, or an error
    event), or None when a reset fault ended the connection."""
    n = len(framer.pieces)
    reset_slot = min(b.reset_after, n) if fault == "reset" else -1
    # "end-after": the body ends cleanly at reset_after, without the dialect's end events.
    end_slot = min(b.reset_after, n) if fault == "end-after" else -1
    stall_slot = min(b.stall_after, n) if fault == "stall-after" else -1
    error_slot = min(b.error_after, n) if fault == "error-after" else -1
    # "malformed-after": the piece at error_after goes out cut short, and the stream goes on.
    bad_slot = b.error_after if fault == "malformed-after" else -1
    gap = b.token_gap
    peer = wait.peer
    start = time.monotonic()
    for slot in range(n + 1):
        if slot:
            delay = start + slot * gap - time.monotonic()
            if delay > 0:
                wait(delay)
            elif slot % _YIELD_EVERY == 0:
                gevent.sleep(0)
        if slot == reset_slot:
            peer.reset()
            return None
        if slot == end_slot:
            return []
        if slot == error_slot:
            return framer.failure(slot)
        if slot == stall_slot:
            wait(b.stall_ms / 1000)
            start = time.monotonic() - slot * gap  # the schedule resumes after the stall
        if slot < n:
            piece = framer.piece(slot)
            body.write(cut_short(piece) if slot == bad_slot else piece)
    return framer.closing()


def cut_short(piece: bytes) -> bytes:
    """``piece`` with its last event's data line cut in half: an event whose data is not
    JSON (a strict prefix of a JSON object never is), as a server that garbled one writes
    it. The events before it in the piece go out whole."""
    at = piece.rfind(b"data: ")
    if at < 0:
        return piece
    start = at + len(b"data: ")
    end = piece.find(b"\n", start)
    data = piece[start : end if end >= 0 else len(piece)]
    return piece[:start] + data[: len(data) // 2] + b"\n\n"


def play_full(
    peer: Peer,
    status: int,
    payload: bytes,
    behaviour: Behaviour,
    fault: str | None,
    headers: Iterable[tuple[str, str]],
    *,
    stats: Stats,
    started: float,
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
            [*headers, processing_ms(started)],
            gzip=fault == "gzip",
            close_delimited=fault == "close-delimited",
        )
    except ClientGone:
        stats.requests_abandoned += 1
        return False
    return fault != "close-delimited"
