"""A caller's own non-stream call, made in the caller's greenlet: no flight.

A call nobody shares (no cache, or the cache bypassed: app/gateway.py ``own_flight``) that
answers whole needs nothing a flight is for: no log for followers, no second reader, no
events to hand over live. In a flight it paid for a greenlet, a listener and the switches
between them, about a tenth of the gateway's CPU per call over the floor's
(``python -m bench.floor_profile chat``). Here the caller's greenlet makes the exchange
itself, and keeps what a flight gave it:

- a caller who leaves ends the upstream call at once: the io watcher on its socket throws
  ``Interrupted`` into the greenlet, where a flight's cancel killed its producer;
- the drain ends it with ``gateway_shutdown``: its ``Guard`` is tracked with the worker's
  flights (app/streams/drain.py);
- a bug while producing is logged and answered as a flight's is (``producer_failed``).

An answer that turns out to be a stream (an upstream that streams a call that did not ask
to, or a forwarded path's stream) goes on in a flight of its own from where it is: the rest
of its parts are read there, and the caller listens to it as to any flight.
"""

from __future__ import annotations

import itertools
import time

import gevent
from greenlet import getcurrent

from app.core.errors import GatewayError
from app.request.call import CLIENT_CLOSED, Call, Reply
from app.streams.drain import Lifecycle
from app.streams.flight import producer_failed
from app.streams.relay import DisconnectWatcher, UpstreamCall, publish
from app.streams.reply import Replies, complete_reply


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

    def __init__(self) -> None:
        self._greenlet = getcurrent()
        self.on = True

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

    def gone() -> None:  # in the hub's loop: marks, and interrupts the parked greenlet
        trace.caller_left()
        guard.caller_left()

    watcher = DisconnectWatcher(call.client_socket, gone)
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
        flight = lifecycle.flight(lambda f: publish(f, rest), keep_log=False,
                                  request_id=trace.request_id, started=began)  # fmt: skip
        return replies.answer(call, flight.join(), False)
    next(parts, None)  # its end: the exchange closes as done, not as interrupted
    where = replies.whereabouts(head.upstream) if trace.span is not None else {}
    trace.answered(head.attempts, head.upstream, where)
    if at is not None:
        trace.upstream_began(at - began)
    return complete_reply(head, call.route)
