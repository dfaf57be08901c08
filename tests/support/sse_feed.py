"""The SSE decoder fed as a network would feed it: in pieces, by one Decoder, then closed.

Whatever the chunking, a stream must decode to the same events and keep every byte; the
tests of llmgate_wire/sse.py and the properties over it cut their inputs with these.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgate_wire import sse


def decode(chunks: Iterable[bytes], limit: int | None = None) -> tuple[list[sse.Event], bytes]:
    """The events of ``chunks`` fed in turn to one Decoder (``limit``: its largest event),
    and the bytes its close() leaves over."""
    decoder = sse.Decoder(limit)
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    return events, decoder.close()


def cut_at(raw: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``raw`` cut at ``cuts``: each taken modulo len(raw) + 1, so any integers a property
    draws are places in it; repeats cut once, and no cut at all is the input whole."""
    pieces, start = [], 0
    for cut in [*sorted({c % (len(raw) + 1) for c in cuts}), len(raw)]:
        pieces.append(raw[start:cut])
        start = cut
    return pieces


def steps(raw: bytes, size: int) -> list[bytes]:
    """``raw`` in pieces of ``size`` bytes (the last may be shorter)."""
    return [raw[i : i + size] for i in range(0, len(raw), size)]
