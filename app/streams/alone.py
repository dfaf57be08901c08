"""A caller's own call, made in the caller's greenlet: no flight.

A call nobody shares (no cache, or the cache bypassed, and not asking to be resumable:
app/gateway.py ``own_flight``) needs nothing a flight is for: no log for followers or a
resume, no second reader. In a flight it paid for a second greenlet per call (for a held
stream, most of what a worker held over the floor's: docs/performance.md), a listener and
the switches between them.

- ``answer_alone``: a whole answer. The caller's greenlet makes the exchange itself. A
  caller who leaves ends the upstream call at once (the io watcher on its socket throws
  ``Interrupted`` into the greenlet, where a flight's cancel killed its producer); the drain
  ends it with ``gateway_shutdown`` (its ``Guard`` is tracked with the worker's flights,
  app/streams/drain.py); a bug is logged and answered as a flight's is
  (``producer_failed``). An answer that turns out to be a stream (an upstream that streams
  a call that did not ask to, or a forwarded path's stream) goes on in a flight of its own
  from where it is.
- ``answer_stream_alone``: a stream, read through ``Solo`` (its docstring says how the
  heartbeats, the caller's leaving and the drain reach it).
"""

from __future__ import annotations

import itertools
import time

import gevent
from greenlet import getcurrent

from app.core.errors import GatewayError
from app.request.call import CLIENT_CLOSED, Call, Reply
from app.streams.answer import ClientGone, Finished, Head
from app.streams.disconnect import watch
from app.streams.drain import Lifecycle
from app.streams.flight import producer_failed
from app.streams.reply import Replies, complete_reply
from app.streams.upstream_call import UpstreamCall, publish
from app.upstream.reading import Patience
from llmgate_wire import sse


class Interrupted(BaseException):
    """Thrown into a call's greenlet: its caller left (``error`` None), or the drain ends
    the call with ``error``. A BaseException, as a timer's Alarm and a kill's GreenletExit
    are, so no ``except Exception`` on the way takes it for an upstream's failure."""

    def __init__(self, error: GatewayError | None = None) -> None:
        super().__init__(error)
        self.error = error


class Guard:
    """While it is on, the greenlet that made it can be interrupted, once: by its caller
    leaving (``caller_left``, from the hub's loop) or by the drain (``shut_down``)."""

    def __init__(self, on: bool = True) -> None:
        self._greenlet = getcurrent()
        self.on = on

    def caller_left(self) -> None:
        """From the hub's loop (the watcher's callback): the greenlet is parked, and the
        exception reaches it where it waits, as a timer's does."""
        self._interrupt(Interrupted())

    def shut_down(self, exc: GatewayError) -> None:
        """From the drain's greenlet: thrown from the hub's loop, not from here (a throw from
        another greenlet would leave that one parked for good)."""
        gevent.get_hub().loop.run_callback(self._interrupt, Interrupted(exc))

    def off(self) -> None:
        self.on = False

    def _interrupt(self, exc: Interrupted) -> None:
        if self.on:  # checked in the hub, where the greenlet is parked: no race with ``off``
            self.on = False
            self._greenlet.throw(exc)


def answer_alone(
    call: Call, upstream: UpstreamCall, lifecycle: Lifecycle, replies: Replies
) -> Reply:
    """The call's reply from its own upstream exchange, made in this greenlet."""
    began = time.monotonic()
    trace = call.trace
    guard = lifecycle.track(Guard())
    watcher = watch(call, guard.caller_left)  # interrupts the parked greenlet
    parts = upstream.parts(began, trace.request_id)
    try:
        first = next(parts)
    except Interrupted as exc:
        if exc.error is not None:
            raise exc.error from None
        return Reply(CLIENT_CLOSED, [], b"")
    except GatewayError:
        raise
    except Exception:
        raise producer_failed(trace.request_id) from None
    finally:
        guard.off()
        watcher.stop()
    assert isinstance(first, tuple)
    head, at = first
    if head.body is None:
        # A stream after all: the rest is read in a flight of its own, from where it is.
        rest = itertools.chain((first,), parts)
        flight = lifecycle.flight(
            lambda f: publish(f, rest), keep_log=False, request_id=trace.request_id, started=began
        )
        return replies.answer(call, flight.join(), False)
    replies.answered(trace, head, began, at)
    return complete_reply(head, call.route)


class Solo:
    """A stream of the caller's own, read in the caller's greenlet: what a reply reads
    (app/streams/reply.py's ``Source``), without a flight.

    Until its head and first event are in, the exchange runs in a greenlet of its own
    (``_begin``), which the caller waits on one heartbeat interval at a time: connecting,
    retries and hedges block, and the caller must be free to send heartbeats meanwhile.
    That greenlet then ends, and the rest is read here, each read waiting at most until
    the next heartbeat for data (``Patience``; nothing is taken from the connection while it
    waits). A body that cannot be waited on that way (compressed, or not chunked) is read
    in a greenlet per read instead. Nothing is kept beyond the batch being relayed: the
    upstream is not read while the caller's write waits (back-pressure, as a flight's
    buffer limit gives).

    Its caller leaving ends the upstream call at once (``lost``: the greenlet reading
    is killed, or the caller's own interrupted where it waits for data); the drain ends it
    with an error event, or a 503 before its head (``shut_down``).
    """

    def __init__(self, upstream: UpstreamCall, request_id: str) -> None:
        self.began = time.monotonic()
        self.request_id = request_id
        self.position = 0
        self.head: Head | None = None
        self.head_at: float | None = None
        self.gone = False
        self._patience = Patience()
        self._upstream = upstream
        self._parts = upstream.parts(self.began, request_id, self._patience)
        self._events: list[sse.Event] = []  # read, not yet relayed
        self._end: Finished | GatewayError | None = None
        self._guard = Guard(on=False)
        self._shut: GatewayError | None = None
        self._inline = False
        self._reading: gevent.Greenlet | None = gevent.spawn(self._begin)

    # -- reading ---------------------------------------------------------------------------
    def _begin(self) -> None:
        """The head, and a stream's first events (they come with it: no second read)."""
        self._step()
        if self.head is not None and self.head.body is None and self._end is None:
            self._step()
        self._inline = self._upstream.waitable()

    def _step(self) -> None:
        """One part of the exchange: the head, a batch of events (none: nothing came in
        the patience's time), or the end. Errors end the stream, as a flight's do."""
        try:
            part = next(self._parts)
        except StopIteration:
            self._end = self._end or Finished(b"")
        except Interrupted as exc:
            if exc.error is None:
                self.gone = True
            else:
                self._end = exc.error
        except GatewayError as exc:
            self._end = exc
        except Exception:
            self._end = producer_failed(self.request_id)
        else:
            if isinstance(part, tuple):
                self.head, self.head_at = part
            elif isinstance(part, Finished):
                self._end = part
            else:  # the batch as read: handed on whole, not copied
                self._events = self._events + part if self._events else part

    def _wait(self, timeout: float | None) -> bool:
        """Run the next read in a greenlet of its own (or wait for the one running) for at
        most ``timeout``; False when it is still going. A stream's reads once its first
        events are in run in the caller's greenlet instead (``next_batch``)."""
        if self._reading is None and self._shut is not None and self._end is None:
            self._parts.close()  # the drain: its error instead of what follows
            self._end = self._shut
        if self._reading is None and self._end is None:
            self._reading = gevent.spawn(self._step)
        if self._reading is not None:
            self._reading.join(timeout)
            if not self._reading.dead:
                return False
            self._reading = None
        return True

    # -- what relay reads ------------------------------------------------------------------
    def wait_head(self, timeout: float | None) -> Head | None:
        """The head once a stream's first event (or the whole body) is in; None on timeout;
        raises the error that ended it first, or ClientGone."""
        if (self.head is None or self._reading is not None) and not self._wait(timeout):
            if self.gone:
                raise ClientGone()
            return None
        if self.gone:
            raise ClientGone()
        if self.head is None:
            raise self._end if isinstance(self._end, GatewayError) else ClientGone()
        if self.head.body is None and not self._events and isinstance(self._end, GatewayError):
            raise self._end  # it failed before its first event: a proper HTTP error
        return self.head

    def next_batch(self, timeout: float | None) -> list[sse.Event] | Finished | GatewayError | None:
        """The events read and not yet relayed, or the end once every event is read; None
        on timeout."""
        if not self._events and self._end is None and not self.gone:
            if self._inline and self._reading is None and self._shut is None:
                # The usual read, once the first events are in: here, in this greenlet.
                self._patience.timeout = timeout
                self._guard.on = True
                try:
                    self._step()
                finally:
                    self._guard.on = False  # ``off``, without a call: once per read
            else:
                self._wait(timeout)
        if self.gone:
            raise ClientGone()
        batch = self._events
        if batch:
            self._events = []
            self.position += len(batch)
            return batch
        return self._end

    # -- the caller and the drain ----------------------------------------------------------
    def lost(self) -> None:
        """From the hub's loop: the caller's connection ended."""
        self.gone = True
        if self._reading is not None:
            self._reading.kill(block=False)  # its unwinding closes the upstream response
        else:
            self._guard.caller_left()

    def shut_down(self, exc: GatewayError) -> None:
        """The drain: the stream ends with ``exc`` (a 503 before its head)."""
        self._shut = exc
        if self._reading is not None:
            self._reading.kill(Interrupted(exc), block=False)
        else:
            self._guard.shut_down(exc)

    def leave(self) -> None:
        """The caller is done or gone: whatever still reads the upstream stops, and its
        response is closed (not drained)."""
        self._guard.off()
        if self._reading is not None:
            self._reading.kill(block=True, timeout=2.0)
            self._reading = None
        self._parts.close()


def answer_stream_alone(
    call: Call, upstream: UpstreamCall, lifecycle: Lifecycle, replies: Replies
) -> Reply:
    """The reply to a stream of the caller's own: its head and first event waited for one
    heartbeat interval, as a flight's are (app/streams/reply.py), then relayed from here."""
    solo = lifecycle.track(Solo(upstream, call.trace.request_id))
    heartbeat = replies.heartbeat_s if replies.heartbeat_s > 0 else None
    return replies.reply_after(call, solo, lambda: solo.wait_head(heartbeat))
