"""Draining a worker for a deploy or a stop: unready first, then no stream ends silently.

On SIGTERM (gunicorn's stop, or a reload replacing its workers) the worker stops accepting
and lets in-flight calls run for gunicorn's graceful timeout (LLMGATE_GRACEFUL_TIMEOUT_S),
then kills whatever is left: a stream cut that way just stops. So the worker (app/edge/worker.py)
starts ``drain`` instead: ``/readyz`` answers 503 at once (a balancer stops sending here),
streams that finish in time finish, and shortly before gunicorn's cut every call still
running ends with a ``gateway_shutdown`` error (a 503 before the first byte, the final SSE
error event after it), which the OpenAI SDK raises and a caller can retry elsewhere.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import gevent

from app.core.errors import GatewayShutdown
from app.streams.flight import Flight, Producer

# Streams are ended this long before gunicorn's own cut (at most a fifth of the grace), so
# their error events are written and their connections closed cleanly in time.
MARGIN_S = 2.0


class Stoppable(Protocol):
    """What the drain ends: a flight, or a call made in its caller's greenlet
    (app/streams/alone.py's ``Guard``)."""

    def shut_down(self, exc: GatewayShutdown) -> None: ...


Tracked = TypeVar("Tracked", bound=Stoppable)


class Lifecycle:
    """The worker's calls in progress, each made here (``flight``) or tracked here
    (``track``) so the drain can end them."""

    def __init__(self, buffer_limit: int | None = None, send_timeout: float | None = None):
        self.draining = False
        self._calls: weakref.WeakSet[Stoppable] = weakref.WeakSet()
        # The per-stream bounds for slow callers (LLMGATE_STREAM_BUFFER_BYTES,
        # LLMGATE_SEND_TIMEOUT_S), the same for every flight of the worker.
        self.buffer_limit = buffer_limit
        self.send_timeout = send_timeout

    def flight(self, producer: Producer, **kw: Any) -> Flight:
        """A flight of this worker, with its per-stream bounds, tracked for the drain."""
        made = Flight(
            producer, buffer_limit=self.buffer_limit, send_timeout=self.send_timeout, **kw
        )
        return self.track(made)

    def track(self, call: Tracked) -> Tracked:
        self._calls.add(call)
        return call

    def drain(self, grace_s: float, sleep: Callable[[float], None] = gevent.sleep) -> None:
        """Turn unready, wait out most of the grace period, then end every call left."""
        self.draining = True
        sleep(max(0.0, grace_s - min(MARGIN_S, grace_s / 5)))
        self.stop_calls()

    def stop_calls(self) -> None:
        for call in list(self._calls):
            call.shut_down(
                GatewayShutdown("The gateway instance is shutting down; retry the request.")
            )
