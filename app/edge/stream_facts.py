"""What a call's end reports of its stream, observed as each batch leaves (app/edge/finish.py).

Time to first token is the first data event of a chat or completions stream and the first
output delta of a Responses stream (its lifecycle events come before the model has produced
anything); the last token's time and the count of output events give tokens a second. The
usage and service tier come from the stream itself: a chat or completions stream's usage
chunk (app/request/usage.py), a Responses stream's terminal event, a Messages stream's
``message_start`` updated by each ``message_delta``. With Server-Timing on, each batch's time
in the worker is kept too (``RelayTimes``, app/request/stages.py): from the worker loop's
turn that woke the stream, its loop's clock (no clock read of its own), to the batch's
leaving, the clock these figures read anyway.
"""

from __future__ import annotations

import time

import gevent

from app.request import events as streams
from app.request.stages import RelayTimes
from app.request.usage import USAGE_OBJECT, Usage, may_carry_usage, tier_of, usage_in_event
from llmgate_wire import sse

PING = sse.comment()


class StreamFacts:
    def __init__(self, sent: int = 0, relay: RelayTimes | None = None) -> None:
        self.sent = sent
        self.first: float | None = None
        self.last: float | None = None
        self.events = 0
        self.usage: Usage | None = None
        self.service_tier: str | None = None
        self.begun = time.monotonic()  # when the body started to be sent
        self.first_chunk = b""  # the first output event (its model is the answer's)
        self.last_chunk = b""  # a chat or completions stream's last data event (its tier)
        self.model: str | None = None  # the answer's model, where the stream says it anyway
        self.relay = relay
        if relay is not None:
            # The loop's clock is the wall clock, these figures' the monotonic one: the
            # difference, taken once (a stream's life is short against a clock's slewing).
            self._loop_now = gevent.get_hub().loop.now
            self._offset = time.time() - time.monotonic()

    def relayed(self, at: float, events: int) -> None:
        """A batch of ``events`` left at ``at`` (monotonic): its time since the worker's
        loop last looked at its sockets."""
        assert self.relay is not None
        self.relay.add(at + self._offset - self._loop_now(), events)

    def output(self, chunk: bytes = b"") -> None:
        """An event with generated output left: first token, last token, count."""
        now = time.monotonic()
        if self.first is None:
            self.first, self.first_chunk = now, chunk
        self.last = now
        self.events += 1

    def chunk(self, chunk: bytes) -> None:
        """A chat or completions data event. Its tier is not looked for here (``ended``)."""
        self.output(chunk)
        self.last_chunk = chunk
        if may_carry_usage(chunk):
            self.usage = usage_in_event(chunk)

    def batch(self, batch: list[bytes]) -> int:
        """A chat or completions stream's batch as sent (events without id lines): what
        ``chunk`` does for each data event but ``[DONE]``, in one call, with one look at the
        clock (the batch's events arrived in one read, and leave in one write); its bytes
        counted. The number of pings in it is returned. Once a batch of every chat stream:
        ``may_carry_usage`` and ``relayed`` are written out here rather than called."""
        sent = pings = 0
        now = 0.0
        events = self.events
        for chunk in batch:
            sent += len(chunk)
            if not chunk.startswith(b"data: "):
                pings += chunk == PING
                continue
            if chunk.startswith(b"data: [DONE]"):
                continue
            if not now:
                now = time.monotonic()
                if self.first is None:
                    self.first, self.first_chunk = now, chunk
            self.events += 1
            self.last_chunk = chunk
            if USAGE_OBJECT in chunk:
                self.usage = usage_in_event(chunk)
        if now:
            self.last = now
            relay = self.relay
            if relay is not None:
                relay.add(now + self._offset - self._loop_now(), self.events - events)
        self.sent += sent
        return pings

    def ended(self) -> None:
        """At a chat or completions stream's end: its service tier, from its first data
        event, else its last. A provider that names the tier names it in every event
        (OpenAI) or once, with the usage at the end; searching each event for it cost a
        search of every token's bytes for a tier most providers never send."""
        for chunk in (self.first_chunk, self.last_chunk) if self.last_chunk else ():
            if self.service_tier is None and b'"service_tier"' in chunk:
                data = streams.data_of(chunk)
                self.service_tier = tier_of(
                    data.get("service_tier") if isinstance(data, dict) else None
                )

    def each(self, batch: list[bytes], typed: bool, messages: bool, resumable: bool) -> int:
        """Any stream's batch as sent, an event at a time: a Responses stream's (``typed``),
        a Messages stream's, or any whose events start with their id line (``resumable``,
        read past). The number of pings in it is returned."""
        pings = 0
        events = self.events
        for sent in batch:
            chunk = sse.split_id(sent)[1] if resumable else sent
            if chunk == PING:
                pings += 1
            elif typed:
                self.typed(chunk)
            elif messages:
                self.message_event(chunk)
            elif chunk.startswith(b"data: ") and not chunk.startswith(b"data: [DONE]"):
                self.chunk(chunk)
            self.sent += len(sent)
        if self.relay is not None and self.events > events and self.last is not None:
            self.relayed(self.last, self.events - events)
        return pings

    def typed(self, chunk: bytes) -> None:
        """A Responses event: output deltas count; the terminal one carries usage and tier."""
        if streams.is_output_delta(chunk):
            self.output()
        elif streams.event_type(chunk) in streams.TERMINAL_TYPES:
            data = streams.data_of(chunk)
            response = data.get("response") if isinstance(data, dict) else None
            if isinstance(response, dict):
                self.usage = Usage.of(response.get("usage"))
                self.service_tier = tier_of(response.get("service_tier"))
                model = response.get("model")
                self.model = model if isinstance(model, str) else None

    def message_event(self, chunk: bytes) -> None:
        """An Anthropic Messages event (the /v1/messages door): content deltas count; the
        usage is ``message_start``'s (the prompt) updated by each ``message_delta``'s
        cumulative counts."""
        kind = streams.event_type(chunk)
        if kind == "content_block_delta":
            self.output(chunk)
        elif kind in ("message_start", "message_delta"):
            data = streams.data_of(chunk)
            if not isinstance(data, dict):
                return
            holder = data.get("message") if kind == "message_start" else data
            usage = Usage.of(holder.get("usage")) if isinstance(holder, dict) else None
            if usage is not None:
                self.usage = usage if self.usage is None else self.usage.merged(usage)
            if kind == "message_start" and isinstance(holder, dict):
                model = holder.get("model")
                self.model = model if isinstance(model, str) else None
