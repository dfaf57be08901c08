"""A caller's reply from a flight: a whole response, or a live stream with heartbeats.

Headers wait for the upstream's status where they can: a stream waits up to one heartbeat
interval for the upstream's head and first event before committing a 200, so a failure in
that window is a real HTTP error; after it, a failure is one SSE error event. A stream still
silent after that interval is committed with a ``: ping`` at once and kept alive by pings
(app/streams/relay.py). The caller's socket is watched the whole time (app/streams/
disconnect.py): a caller who leaves stops being waited for, and the last one to leave
cancels the flight. A stream of the caller's own (app/streams/alone.py) waits for its head
through the same ``reply_after``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.config import Settings
from app.core.errors import wrap_upstream_body
from app.observe.tracing import Value
from app.request.call import CLIENT_CLOSED, SSE_HEADERS, Call, Reply, Trace
from app.request.headers import downstream_headers
from app.request.metering import without_usage_chunk
from app.request.routes import PASSTHROUGH, Route
from app.streams.answer import ClientGone, Head
from app.streams.disconnect import DisconnectWatcher, watch
from app.streams.listener import Listener
from app.streams.relay import Listening, relay
from app.upstream.retry import Deadline

UPSTREAM_HEADER = "X-LLMGate-Upstream"
# Where an upstream is, by its configured name, for the request's span (app/upstream/spans.py).
Whereabouts = Callable[[str], Mapping[str, Value]]


@dataclass(frozen=True)
class Offer:
    """What a call about to stream from a flight got when it asked to be resumable
    (app/resume/service.py): its stream id (None: not resumable), the headers that say
    whether, and for a resumable one a look at whether its log was withdrawn since it
    began (the reason, said to the caller in-stream: app/resume/writer.py)."""

    stream_id: str | None
    headers: list[tuple[str, str]]
    withdrawn: Callable[[], str | None] | None = None


NO_OFFER = Offer(None, [])
Resumable = Callable[[Call, Any], Offer]


class Source(Listening, Protocol):
    """What a reply reads: a flight's listener, or a call of its own read in the caller's
    greenlet (app/streams/alone.py). ``began``: when the call began; ``head_at``: when its
    upstream began answering (None: the answer came from elsewhere), both on the monotonic
    clock; ``lost``: its caller left (from the hub's loop: it marks and wakes, never
    blocks); ``leave`` when the caller is done or gone."""

    @property
    def began(self) -> float: ...

    @property
    def head_at(self) -> float | None: ...

    def lost(self) -> None: ...

    def leave(self) -> None: ...


class Replies:
    """Turns a listener of a flight into the caller's ``Reply``."""

    def __init__(
        self, settings: Settings, whereabouts: Whereabouts, resumable: Resumable | None = None
    ) -> None:
        self.heartbeat_s = settings.heartbeat_s
        self.whereabouts = whereabouts
        self.resumable = resumable

    def answer(self, call: Call, listener: Listener, stream: bool) -> Reply:
        """The caller's reply from a flight: a complete response, or a live stream (a
        resumable one's events numbered, when the call asked: docs/streams.md)."""
        offer = NO_OFFER
        if stream and self.resumable is not None:
            # Before anything waits: the log starts at the flight's first event.
            offer = self.resumable(call, listener.flight)
        first_byte = lambda: self._await_first_byte(listener, stream)  # noqa: E731
        reply = self.reply_after(call, listener, first_byte, offer)
        if offer.headers and not isinstance(reply.body, bytes):
            reply.headers += offer.headers
            reply.stream_id = offer.stream_id
        return reply

    def reply_after(
        self,
        call: Call,
        reading: Source,
        first_byte: Callable[[], Head | None],
        offer: Offer = NO_OFFER,
    ) -> Reply:
        """The caller's reply once ``first_byte()`` has the head (None: a stream to commit
        before it, for heartbeats), the caller watched from now until the reply's end (a
        stream's end, ``_stream``; a whole answer's reply). A caller gone meanwhile gets
        nothing (499); a wait that raises leaves ``reading`` and stops the watcher first."""
        watcher = watch(call, reading.lost)
        try:
            head = first_byte()
        except BaseException as exc:
            watcher.stop()
            reading.leave()
            if isinstance(exc, ClientGone):
                return Reply(CLIENT_CLOSED, [], b"")
            raise
        self.answered(call.trace, head, reading.began, reading.head_at)
        return self._reply_for(call, head, reading, watcher, offer)

    def answered(
        self, trace: Trace, head: Head | None, started: float, head_at: float | None
    ) -> None:
        """What the call's trace learns of its head: the attempts and which upstream (and
        where it is, with tracing on), and how long the upstream took to begin answering
        (``head_at``: when it did, None when the answer came from elsewhere)."""
        if head is not None:
            where = self.whereabouts(head.upstream) if trace.span is not None else {}
            trace.answered(head.attempts, head.upstream, where, head.routing)
            if head.body is not None:
                trace.answer_whole(head.usage_estimated)
            if head_at is not None:
                trace.upstream_began(started, head_at, head.connect_s)
        else:
            trace.upstream_waiting(started)  # a stream committed before its upstream began

    def _reply_for(
        self,
        call: Call,
        head: Head | None,
        listener: Source,
        watcher: DisconnectWatcher,
        offer: Offer = NO_OFFER,
    ) -> Reply:
        """The caller's reply once the head and first event are in (``head``), or once a
        stream's first heartbeat interval passed without them (None): a stream, or a whole
        answer (the listener left then)."""
        if head is None:
            # The upstream is slow to answer a stream: commit the 200 now, a ping with it,
            # and keep the line alive with pings; whatever the upstream says later travels
            # as SSE.
            body = self._stream(call.route, call.trace, listener, watcher, offer, ping_first=True)
            return Reply(200, list(SSE_HEADERS), body)
        if head.body is None:
            headers = [
                (k, v)
                for k, v in downstream_headers(head.headers)
                if k.lower() not in ("content-type", "cache-control")
            ]
            headers += upstream_header(head)
            return Reply(
                head.status,
                list(SSE_HEADERS) + headers,
                self._stream(call.route, call.trace, listener, watcher, offer),
            )
        watcher.stop()
        listener.leave()
        return complete_reply(head, call.route)

    def _await_first_byte(self, listener: Listener, stream: bool) -> Head | None:
        """The upstream's head once its first event (or whole body) is in; None when a
        stream should be committed before that, to send heartbeats.

        Waiting for the first event, not just the headers, lets a stream that fails before
        producing anything still answer with a proper HTTP error status.
        """
        heartbeat = self.heartbeat_s
        window = None if not stream or heartbeat <= 0 else Deadline.start(heartbeat)
        head = listener.wait_head(window.remaining() if window else None)
        if head is None:
            return None
        if head.body is None and not listener.wait_first_event(
            window.remaining() if window else None
        ):
            return None
        return head

    def _stream(
        self,
        route: Route,
        trace: Trace,
        listener: Source,
        watcher: DisconnectWatcher,
        offer: Offer = NO_OFFER,
        *,
        ping_first: bool = False,
    ) -> Iterator[list[bytes]]:
        """The stream's body: the route and trace of its call, not the call (what lives as
        long as the stream does not hold the caller's request body). At its end (normal, an
        error, or the WSGI server closing it because the caller left) the watcher stops and
        the listener is left."""

        def ended() -> None:
            watcher.stop()
            listener.leave()

        chunks = relay(
            listener,
            heartbeat=self.heartbeat_s,
            # A stream cut before its route's end is reported as broken (app/request/events.py).
            end=route.end,
            on_error=trace.stream_broke,
            on_end=ended,
            on_complete=trace.answer_whole,
            ping_first=ping_first,
            door=route.door,
            stream_id=offer.stream_id,
            withdrawn=offer.withdrawn,
        )
        return without_usage_chunk(chunks, trace.usage_taken) if trace.hide_usage else chunks


def wait_whole(call: Call, listener: Listener) -> bool:
    """Wait for the flight's whole answer, watching the caller: False when the caller left."""
    watcher = watch(call, listener.lost)
    try:
        listener.wait_complete()
    except ClientGone:
        return False
    finally:
        watcher.stop()
        listener.leave()
    return True


def complete_reply(head: Head, route: Route = PASSTHROUGH) -> Reply:
    """A whole answer as the caller gets it: an upstream's error body in the shape of the
    caller's door (``route``: OpenAI's, Anthropic's on /v1/messages), and after our own
    retries a word to the SDK not to retry again."""
    assert head.body is not None
    headers = downstream_headers(head.headers)
    body = head.body
    if head.status >= 400:
        wrapped = wrap_upstream_body(head.status, body, route.door)
        if wrapped is not body:
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            headers.append(("Content-Type", "application/json"))
        body = wrapped
        if head.attempts > 1:
            # We already retried: the SDK must not multiply the calls again (whatever the
            # upstream said of its own answer).
            headers = [(k, v) for k, v in headers if k.lower() != "x-should-retry"]
            headers.append(("x-should-retry", "false"))
    return Reply(head.status, headers + upstream_header(head), body)


def upstream_header(head: Head) -> list[tuple[str, str]]:
    """Which upstream answered, by its configured name (never its URL or key)."""
    return [(UPSTREAM_HEADER, head.upstream)] if head.upstream else []
