"""A scripted producer for flights (app/streams/flight.py), shared by the unit tests of
flights and of the memory their logs keep."""

from __future__ import annotations

from collections.abc import Callable

import gevent
import gevent.event

from app.streams.flight import Finished, Flight, Head
from llmgate_wire import sse


def script(*steps: object) -> Callable[[Flight], None]:
    """A producer that runs ``steps``: a Head, an Event, "sleep" (let listeners run), a
    gevent Event to wait for (at most 5 s), Finished, or an exception to raise."""

    def produce(flight: Flight) -> None:
        for step in steps:
            if isinstance(step, Head):
                flight.publish_head(step)
            elif isinstance(step, sse.Event):
                flight.publish(step)
            elif isinstance(step, gevent.event.Event):
                step.wait(5)
            elif step == "sleep":
                gevent.sleep(0)
            elif isinstance(step, Finished):
                flight.finish(step.leftover, usage_estimated=step.usage_estimated)
            elif isinstance(step, BaseException):
                raise step

    return produce
