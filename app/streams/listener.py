"""One caller reading a flight (app/streams/flight.py): its head, its events live from
where it joined, and its end; ``leave()`` when the caller is done or gone.

A listener waits through its flight (``Flight.wait``) with a timer of its own, armed again
for each wait. A caller who leaves ends its waits at once (``lost``, from the hub's loop,
never blocking); leaving the flight, which may stop the producer, is the caller's own greenlet's
(``leave``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from app.core.errors import GatewayError
from app.core.timers import Alarm
from app.streams.answer import UPSTREAM, ClientGone, Finished, Head
from app.streams.event_log import EventLog
from llmgate_wire import sse


class Readable(Protocol):
    """What a listener reads: a flight (app/streams/flight.py), as its listeners see it."""

    head: Head | None
    end: Finished | GatewayError | None
    settled: bool
    log: EventLog
    started: float  # when the flight began; the answer's head came at head_at
    head_at: float | None

    @property
    def source(self) -> str: ...

    @property
    def event_count(self) -> int: ...

    @property
    def failure(self) -> GatewayError | None: ...

    @property
    def complete(self) -> bool: ...

    def wait(
        self, listener: Listener, ready: Callable[[], bool], timeout: float | None
    ) -> bool: ...

    def wake(self) -> None: ...

    def left(self, listener: Listener) -> None: ...

    def taken(self) -> None: ...

    def reads_whole(self, listener: Listener) -> None: ...


class Listener:
    """One caller reading a flight. ``leave()`` when the caller is done or gone."""

    def __init__(self, flight: Readable) -> None:
        self.flight = flight
        self.left = False
        self.position = 0  # number of the next event this listener reads
        self.bytes_read = 0  # raw bytes of the events it took
        self.gone = False  # the caller left; it still has to leave() (from its own greenlet)
        self._timer: Alarm | None = None

    def timer(self, seconds: float) -> Alarm:
        """A timer of ``seconds`` for this listener's waits, made once and armed again."""
        if self._timer is None or self._timer.seconds != seconds:
            if self._timer is not None:
                self._timer.close()
            self._timer = Alarm(seconds)
        return self._timer

    @property
    def began(self) -> float:
        """When its call began: the flight's start (monotonic)."""
        return self.flight.started

    @property
    def head_at(self) -> float | None:
        """When the flight's upstream began answering; None when its answer came from
        elsewhere (a stored entry, another process's call)."""
        flight = self.flight
        return flight.head_at if flight.source == UPSTREAM else None

    @property
    def stopped(self) -> bool:
        """It reads nothing more: it left (or was dropped), or its caller is gone."""
        return self.left or self.gone

    def lost(self) -> None:
        """The caller's connection ended: its waits end with ClientGone. Never blocks (it is
        called from the hub's loop); leaving, which may stop the producer, is the caller's."""
        self.gone = True
        self.flight.wake()

    def leave(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        if not self.left:
            self.left = True
            self.flight.left(self)

    def wait_head(self, timeout: float | None) -> Head | None:
        """The head, None on timeout; raises the flight's failure or ClientGone."""
        flight = self.flight

        def ready() -> bool:
            # A stream's head at once; a whole body once the flight settled (stored).
            head = flight.head
            return (head is not None and head.body is None) or flight.settled

        if not flight.wait(self, ready, timeout):
            return None
        if flight.head is None:
            raise flight.failure or ClientGone()
        return flight.head

    def wait_first_event(self, timeout: float | None) -> bool:
        """True once a first event or the end is in (raises the failure if that came first)."""
        flight = self.flight
        ready = lambda: flight.event_count > 0 or flight.settled  # noqa: E731
        if not flight.wait(self, ready, timeout):
            return False
        if flight.event_count == 0 and flight.failure is not None:
            raise flight.failure
        return True

    def next_item(self, timeout: float | None) -> sse.Event | Finished | GatewayError | None:
        """The next event, or the end once every event is read; None on timeout."""
        found = self._next(timeout, every=False)
        return found[0] if isinstance(found, list) else found

    def next_batch(self, timeout: float | None) -> list[sse.Event] | Finished | GatewayError | None:
        """Every event in that this listener has not read (at least one), or the end once
        every event is read; None on timeout."""
        return self._next(timeout, every=True)

    def _next(
        self, timeout: float | None, every: bool
    ) -> list[sse.Event] | Finished | GatewayError | None:
        flight = self.flight
        if self.stopped:
            raise ClientGone()  # dropped (or gone): its unread events may be trimmed already
        ready = lambda: self.position < flight.event_count or flight.settled  # noqa: E731
        if not flight.wait(self, ready, timeout):
            return None
        if self.position < flight.event_count:
            return self._take(flight.event_count if every else self.position + 1)
        if flight.end is None:
            raise ClientGone()
        return flight.end

    def _take(self, until: int) -> list[sse.Event]:
        """Read the events numbered from ``position`` up to ``until`` (exclusive)."""
        flight = self.flight
        events = flight.log.between(self.position, until)
        self.position = until
        self.bytes_read += sum(len(event.raw) for event in events)
        flight.taken()
        return events

    def wait_complete(self, timeout: float | None = None) -> None:
        """Until the whole answer is in; raises the failure or ClientGone. A listener that
        waits for the whole answer reads no events one by one: it holds no log back."""
        flight = self.flight
        flight.reads_whole(self)
        flight.wait(self, lambda: flight.settled, timeout)
        if not flight.complete:
            raise flight.failure or ClientGone()
