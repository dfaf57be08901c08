"""Alarm, the timer armed again for every wait: each arming counts the full interval anew."""

from __future__ import annotations

import time

import gevent
import pytest

from app.core.timers import Alarm
from app.request import events as streams
from app.streams.flight import Flight
from app.streams.relay import relay


def _fires_after(alarm: Alarm, limit: float = 5.0) -> float:
    alarm.arm()
    began = time.monotonic()
    try:
        gevent.sleep(limit)
    except Alarm as exc:
        assert exc is alarm
        return time.monotonic() - began
    finally:
        alarm.disarm()
    raise AssertionError("the alarm never fired")


def test_arming_again_counts_the_whole_interval_each_time() -> None:
    alarm = Alarm(0.2)
    for _ in range(10):  # armed and disarmed before it fires: 0.5 s in all, never thrown
        alarm.arm()
        gevent.sleep(0.05)
        alarm.disarm()
    # gevent.Timeout restarted would fire at its first deadline, long past, so at once.
    assert _fires_after(alarm) >= 0.15
    assert _fires_after(alarm) >= 0.15  # and once fired, armed again: the interval anew
    alarm.close()
    alarm.disarm()  # harmless after close
    with pytest.raises(RuntimeError):
        alarm.arm()


def test_heartbeats_come_one_per_interval_while_nothing_arrives() -> None:
    listener = Flight(lambda flight: gevent.sleep(5)).join()  # no head, no event for 5 s
    pings = relay(listener, heartbeat=0.1, end=streams.DONE)
    began = time.monotonic()
    count = 0
    while time.monotonic() - began < 1.0:
        assert next(pings) == [b": ping\n\n"]
        count += 1
    listener.leave()
    assert 5 <= count <= 12  # ~10; a timer that fires at once would give thousands
