"""Reading an upstream's answer: bounded reads under the idle and total timers, then whole SSE
events or a whole body.

The rule: every read ends within the idle timeout and the deadline, whichever comes first;
what the upstream breaks after its headers fails its attempt (``Ledger.broken``), here and
nowhere else: a read that fails or times out (and its connection is dropped: a half-read
connection is never reused), a body over its size limit, an event over
LLMGATE_MAX_EVENT_BYTES, a stream that ends before its route's end or with the upstream's own
error event. ``start`` reads an answer
up to its first event, or whole when it is not an event stream: what a hedge race compares
(app/upstream/race.py); ``events`` reads the rest, a batch of whole events per read, as soon
as ``read1`` and the pure decoder have one.

Timers: the idle one is the response's own ``Alarm`` armed again for each read (a timer per
exchange, not one per event); when less than an idle interval is left of the deadline, a
timer for what is left, reported as the deadline. A stream read with patience waits for data
under one timer first; a read that wait found buffered whole cannot wait, and arms none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from app.core.config import Settings
from app.core.errors import (
    GatewayError,
    UpstreamError,
    UpstreamEventTooLarge,
    UpstreamRedirect,
    UpstreamReset,
    UpstreamTimeout,
)
from app.core.frozen import quick_init
from app.core.timers import Alarm
from app.patches.chunked_reads import ARRIVED, BUFFERED, NOT_YET
from app.request.events import StreamEnd, is_error_event
from app.request.routes import PASSTHROUGH, Route
from app.upstream.ledger import Ledger
from app.upstream.pools import READ_SIZE
from app.upstream.retry import Deadline
from app.upstream.transport import UpstreamResponse
from llmgate_wire import sse

# Redirects (RFC 9110 section 15.4); 304 is an answer to a conditional request, not one.
# A generation call is never legitimately redirected: a caller's SDK following one would send
# the prompt where the operator never configured, past the gateway's keys, limits and cache,
# so it is a 502. Other paths pass a redirect on as the upstream's answer (a provider may
# send a file download to signed storage); the gateway itself follows none.
_REDIRECTS = frozenset({300, 301, 302, 303, 305, 307, 308})


@quick_init
@dataclass(frozen=True)
class ReadRules:
    """What an answer may be: its body's size limit, an event's (None: the decoder's
    default), and the route whose streams must reach its end (app/request/events.py) and
    whose calls take no redirect (any but a forwarded one)."""

    max_body: int
    max_event_bytes: int | None = None
    route: Route = PASSTHROUGH

    @property
    def end(self) -> StreamEnd | None:
        return self.route.end


@dataclass
class Patience:
    """How long a stream's next read may wait for data before it hands back an empty batch
    (None: as long as the idle timer allows). Set by whoever reads the stream in its
    caller's greenlet before each turn: the time left to its next heartbeat."""

    timeout: float | None = None


@dataclass
class Start:
    """An answer up to its first event, or whole when it is not a stream."""

    resp: UpstreamResponse
    ledger: Ledger  # closes it (race.Contender's ``close``)
    body: bytes | None = None  # the whole body when the answer is not an event stream
    decoder: sse.Decoder | None = None  # a stream's, holding what follows its first events
    events: list[sse.Event] = field(default_factory=list)
    ended: bool = False  # the stream ended before an event
    too_large: int | None = None  # the event size limit an event broke

    @property
    def ok(self) -> bool:
        return self.resp.status < 300

    def close(self) -> None:
        self.ledger.close(self.resp)


class Reader:
    """Reads the answers of one worker's upstreams."""

    def __init__(self, settings: Settings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger

    def start(
        self,
        resp: UpstreamResponse,
        deadline: Deadline,
        reading: ReadRules,
    ) -> Start:
        """Read ``resp`` up to its first event (or its whole body); closed on failure."""
        try:
            if resp.status in _REDIRECTS and not reading.route.forwarded:
                raise UpstreamRedirect(
                    f"The upstream answered with a redirect (HTTP {resp.status}); the gateway "
                    "follows none. Its configured URL needs correcting."
                )
            ctype = resp.headers.get("content-type", "")
            if resp.status >= 300 or not ctype.startswith("text/event-stream"):
                return Start(resp, self.ledger, body=self.whole(resp, deadline, reading.max_body))
            decoder = sse.Decoder(reading.max_event_bytes)
            while chunk := self.chunk(resp, deadline):
                try:
                    events = decoder.feed(chunk)
                except sse.EventTooLarge as exc:
                    return Start(resp, self.ledger, None, decoder, exc.events, too_large=exc.limit)
                if events:
                    return Start(resp, self.ledger, None, decoder, events)
            return Start(resp, self.ledger, None, decoder, ended=True)
        except BaseException:
            self.ledger.close(resp)
            raise

    def events(
        self,
        start: Start,
        deadline: Deadline,
        end: StreamEnd | None,
        patience: Patience | None = None,
    ) -> Iterator[list[sse.Event]]:
        """A stream's events, a batch per read, the start's first; the events before one
        over the size limit still come, then UpstreamEventTooLarge. A stream that ends
        before ``end`` (a clean close where its route's end should be) fails its attempt
        and ends quietly: the relay tells each caller. At its end the connection goes back
        to the pool. With ``patience``, each read first waits at most its timeout for data
        (``UpstreamResponse.wait_readable``: nothing is taken from the connection while it
        waits), and an empty batch says none came."""
        resp, decoder = start.resp, start.decoder
        assert decoder is not None
        if start.events:
            yield start.events
        limit, ended = start.too_large, start.ended
        last = _last_event(start.events, None)
        since = time.monotonic()  # when data last came: the idle timer runs from there
        ready = ARRIVED
        while limit is None and not ended:
            if patience is not None:
                ready = self._data_within(resp, deadline, patience, since)
                if ready == NOT_YET:
                    yield []
                    continue
                since = time.monotonic()
            chunk = self.chunk(resp, deadline, timed=ready != BUFFERED)
            try:
                events = decoder.feed(chunk) if chunk else []
            except sse.EventTooLarge as exc:
                events, limit = exc.events, exc.limit  # the events before it still go
            if events:
                yield events
                # An event with data is not a comment: the usual last event, without a call.
                last = events[-1] if events[-1].data is not None else _last_event(events, last)
            ended = not chunk
        if limit is not None:
            too_large = UpstreamEventTooLarge(
                f"The upstream sent an event larger than {limit} bytes (LLMGATE_MAX_EVENT_BYTES)."
            )
            self.ledger.broken(resp, too_large)  # a malformed stream: the attempt failed
            raise too_large
        if end is not None and not _ends(end, last):
            cut = UpstreamReset(f"Upstream ended the stream before {end.expected}.")
            self.ledger.broken(resp, cut)
        elif last is not None and is_error_event(last):
            # The upstream's own error after its 200 (Anthropic's overloaded_error, a
            # server_error): relayed to the caller as it is, and a failure of the upstream.
            # Its code is the attempt span's error.type, as it is the caller's stream's.
            failed = UpstreamError(
                "The upstream ended its stream with an error.", code="upstream_error"
            )
            self.ledger.broken(resp, failed)
        resp.release()

    def _data_within(
        self, resp: UpstreamResponse, deadline: Deadline, patience: Patience, since: float
    ) -> int:
        """Whether data came within the patience's time (NOT_YET: the caller's turn), and
        whether the read can wait at all (``UpstreamResponse.wait_readable``). The idle
        and total timers still end the wait, as they end a read: when one of them comes
        before the patience runs out, the wait is theirs, and their error is raised."""
        s = self.settings
        now = time.monotonic()  # one look at the clock for both budgets (a read per event)
        idle_left = s.idle_timeout_s - (now - since)
        left = min(idle_left, deadline.at - now)  # at most 0 once either has run out
        wait = left if patience.timeout is None else min(patience.timeout, left)
        if wait > 0 and (ready := resp.wait_readable(wait)):
            return ready
        if patience.timeout is not None and wait == patience.timeout and wait < left:
            return NOT_YET
        if idle_left <= deadline.remaining():
            raise self._broke_off(resp, UpstreamTimeout("idle", s.idle_timeout_s))
        raise self._broke_off(resp, UpstreamTimeout("deadline", s.deadline_s))

    def chunk(self, resp: UpstreamResponse, deadline: Deadline, timed: bool = True) -> bytes:
        """What has arrived of the body (b"" at its end), within the idle and total budgets.
        On any failure the response is closed: a half-read connection is never reused.
        ``timed`` False: what the read needs is buffered (a wait said BUFFERED, within both
        budgets), so it cannot wait, and no timer is armed around it: one timer a read,
        the wait's, where there were two."""
        if not timed:
            try:
                chunk = resp.read1(READ_SIZE)
            except UpstreamReset as exc:
                raise self._broke_off(resp, exc) from None
            if not chunk:
                resp.attempt.body_ended()
            return chunk
        s = self.settings
        remaining = deadline.remaining()
        if remaining >= s.idle_timeout_s:
            # The response's one idle timer, armed again for each read: a timer per
            # exchange, not one per event (this runs for every read of every stream).
            phase, reported = "idle", s.idle_timeout_s
            if resp.idle_timer is None:
                resp.idle_timer = Alarm(s.idle_timeout_s)
            timer = resp.idle_timer
        elif remaining > 0:  # the deadline comes first
            phase, reported = "deadline", s.deadline_s
            timer = Alarm(remaining)
        else:
            raise self._broke_off(resp, UpstreamTimeout("deadline", s.deadline_s))
        timer.arm()
        try:
            chunk = resp.read1(READ_SIZE)
        except Alarm as exc:
            if exc is not timer:
                raise
            raise self._broke_off(resp, UpstreamTimeout(phase, reported)) from None
        except UpstreamReset as exc:
            raise self._broke_off(resp, exc) from None
        finally:
            timer.disarm()
            if timer is not resp.idle_timer:
                timer.close()
        if not chunk:
            resp.attempt.body_ended()  # once per answer, not per read
        return chunk

    def whole(self, resp: UpstreamResponse, deadline: Deadline, limit: int) -> bytes:
        """The whole body, at most ``limit`` bytes; its connection back to the pool."""
        parts: list[bytes] = []
        size = 0
        while chunk := self.chunk(resp, deadline):
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise self._broke_off(
                    resp, UpstreamError(f"Upstream response exceeds {limit} bytes.")
                )
        resp.release()
        return b"".join(parts)

    def _broke_off(self, resp: UpstreamResponse, error: GatewayError) -> GatewayError:
        """A read failed (a reset, a timeout, too much): the attempt failed, its connection
        is dropped. The error, for the caller to raise."""
        resp.close()
        self.ledger.broken(resp, error)
        return error


def _last_event(events: list[sse.Event], before: sse.Event | None) -> sse.Event | None:
    """The last event that is not a comment: ``events``' own, else ``before``."""
    for event in reversed(events):
        if not event.is_comment:
            return event
    return before


def _ends(end: StreamEnd, last: sse.Event | None) -> bool:
    """Whether a stream whose last event is ``last`` ended as its route's streams end: with
    its end, or with the upstream's own error event (an answer, not a cut)."""
    return last is not None and (end.ends(last) or is_error_event(last))
