"""A call's upstream exchange as a flight's producer, or read part by part in its caller's
greenlet.

``UpstreamCall`` runs the upstream exchange (``Upstream.exchange`` in
app/upstream/exchange.py, where the attempts, the reads and the closing and accounting of
each all are) and hands over its parts: the head, each batch of events, the end. As a
flight's producer it turns them into flight calls (``publish``: the head together with the
first event or with the whole body, each later batch, the end; app/streams/flight.py keeps
them for the listeners); a caller's own call reads them in its own greenlet
(app/streams/alone.py). An error is the exchange's to raise and the flight's (or the
caller's) to announce.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

from app.request.routes import PASSTHROUGH, Route
from app.streams.answer import Finished, Head
from app.streams.flight import Flight
from app.upstream.continuation import Hooks
from app.upstream.exchange import Exchange, ReadRules, Upstream, UpstreamRequest
from app.upstream.reading import Patience
from app.upstream.retry import Deadline
from llmgate_wire import sse

# What an upstream call hands over, in order: its head with when it began (the answer's
# first byte, on the monotonic clock); for a stream, its events a batch per read, then its
# end (what followed its last whole event, often nothing, and whether its usage is the
# upstream's own).
Part = tuple[Head, float | None] | list[sse.Event] | Finished


class UpstreamCall:
    """A call's upstream exchange, made at most once: as a flight's producer (``__call__``),
    or read part by part in the caller's own greenlet (``parts``, app/streams/alone.py).

    ``request`` builds the request when the call first goes upstream, and is let go then: a
    call that never goes upstream (a cache hit) builds none. Run again, it fails: the
    exchange holds the request only until its answer started."""

    def __init__(
        self,
        upstream: Upstream,
        request: Callable[[], UpstreamRequest],
        deadline: Deadline,
        *,
        max_body: int,
        max_event_bytes: int | None = None,
        route: Route = PASSTHROUGH,
        hooks: Hooks | None = None,
    ) -> None:
        self._upstream = upstream
        self._hooks = hooks  # its call's, should its stream be continued (the Trace)
        self._build: Callable[[], UpstreamRequest] | None = request
        self._deadline = deadline
        self._reading = ReadRules(max_body, max_event_bytes, route)
        self._exchange: Exchange | None = None

    def parts(
        self, began: float, request_id: str, patience: Patience | None = None
    ) -> Generator[Part, None, None]:
        """The answer's parts (``Part``); the upstream response is closed when this is
        closed or ends. With ``patience`` (app/upstream/reading.py), a stream's reads wait
        at most its timeout for data, and an empty batch says none came (the caller's turn
        to send a heartbeat); the exchange closes before the last part (a whole answer's
        head, a stream's end), so whoever takes it need not resume this again."""
        if self._build is not None:
            self._exchange = self._upstream.exchange(
                self._build(), self._deadline, self._reading, self._hooks
            )
            # What the builder holds (the caller's prompt) goes with the request, which the
            # exchange lets go of once the answer started: not kept for a long stream.
            self._build = None
        assert self._exchange is not None
        with self._exchange.run(began=began, request_id=request_id) as answer:
            whole = answer.body is not None
            head = Head(
                answer.status,
                answer.headers,
                answer.attempts,
                answer.body,
                answer.upstream,
                usage_estimated=whole and answer.usage_estimated,
                routing=answer.routing,
                connect_s=answer.connect_s,
            )
            at = answer.started_at
            if not whole:
                yield head, at
                yield from answer.events(patience)
                end = Finished(answer.leftover(), answer.usage_estimated)
        if head.body is not None:
            yield head, at
        else:
            yield end

    def waitable(self) -> bool:
        """Whether the stream's reads can wait with ``patience`` (after its head)."""
        return self._exchange is not None and self._exchange.waitable()

    def __call__(self, flight: Flight) -> None:
        publish(flight, self.parts(flight.started, flight.request_id))


def publish(flight: Flight, parts: Iterator[Part]) -> None:
    """Publish an upstream call's parts into ``flight``: the head together with the first
    event (or with the whole body), each later batch of events, the end."""
    first = next(parts)
    assert isinstance(first, tuple)
    head, at = first
    if head.body is not None:
        flight.publish_head(head, at=at)
        return
    for events in parts:
        if isinstance(events, Finished):  # the end
            if flight.head is None:  # it ended before any event
                flight.publish_head(head)
            flight.finish(events.leftover, usage_estimated=events.usage_estimated)
            return
        assert isinstance(events, list)
        if flight.head is None:
            # Head and first event together: a listener learns the status only when the
            # stream is known to have started.
            flight.publish_head(head, at=at)
        flight.publish_all(events)
