"""The gateway's own time by stage (app/request/stages.py) as the Trace learns it: each stage
once, in the header's order; ``work`` the rest and ``gateway`` all but the upstream's own;
nginx's start time read and bounded; a follower's wait counted from when it joined; a
stream's relay time kept in a few counts, its median within a quarter, its longest exact."""

from __future__ import annotations

import time

import pytest

from app.request.call import Trace
from app.request.stages import RelayTimes, Stages, header, queue_start, queued
from tests.support.clock import Clock


def test_the_figures_name_each_stage_the_call_had_in_order() -> None:
    stages = Stages(queue_s=0.002, auth_s=0.001, cache_s=0.0005, connect_s=0.003, upstream_s=0.1)
    figures = stages.figures(elapsed=0.110)
    assert [name for name, _ in figures] == [
        "queue", "auth", "cache", "connect", "upstream", "work", "gateway",
    ]  # fmt: skip
    found = dict(figures)
    assert found["work"] == pytest.approx(0.110 - 0.001 - 0.0005 - 0.003 - 0.1)
    # Everything but the upstream's own, the queue included (it is before the worker's time).
    assert found["gateway"] == pytest.approx(0.002 + 0.110 - 0.1)
    assert sum(v for k, v in figures if k != "gateway") == pytest.approx(0.002 + 0.110)
    assert header(figures).startswith("queue;dur=2.0, auth;dur=1.0, cache;dur=0.5, connect;")


def test_a_call_with_no_stages_has_its_work_and_its_total() -> None:
    assert Stages().figures(0.004) == [("work", 0.004), ("gateway", 0.004)]


@pytest.mark.parametrize(
    ("value", "start"),
    [("t=1700000000.123", 1700000000.123), ("1700000000.5", 1700000000.5), ("t=x", None),
     ("", None), ("t=nan", None), ("t=-3", None)],
)  # fmt: skip
def test_nginxs_start_time_is_read_or_refused(value: str, start: float | None) -> None:
    assert queue_start(value) == start


def test_the_queue_is_bounded_and_rounds_up_to_zero() -> None:
    assert queued(100.0, 100.25) == pytest.approx(0.25)
    assert queued(100.0005, 100.0) == 0.0  # nginx's millisecond, read a little late
    assert queued(100.0, 98.0) is None  # another clock
    assert queued(100.0, 100.0 + 3600) is None  # an hour: no call waits that long
    assert queued(None, 1.0) is None


def test_the_trace_learns_the_upstream_stages_with_the_connect_apart(monkeypatch) -> None:
    monkeypatch.setattr(time, "monotonic", Clock(10.0))
    trace = Trace(started=9.0)
    trace.upstream_began(began=10.0, head_at=10.3, connect_s=0.05)
    assert (trace.stages.connect_s, trace.stages.upstream_s) == pytest.approx((0.05, 0.25))
    # A follower waits from when it joined: a flight that began before counts less.
    follower = Trace(started=9.0)
    follower.followed(None)  # at 10.0
    follower.upstream_began(began=9.5, head_at=10.3, connect_s=0.05)
    assert (follower.stages.connect_s, follower.stages.upstream_s) == pytest.approx((0.05, 0.25))
    # One that joined after the head: none of it (nor of the leader's connect).
    late = Trace(started=9.0)
    late.followed(None)
    late.upstream_began(began=9.5, head_at=9.8, connect_s=0.05)
    assert (late.stages.connect_s, late.stages.upstream_s) == (0.0, 0.0)


def test_auth_and_cache_add_up_their_steps(monkeypatch) -> None:
    clock = Clock(5.0)
    monkeypatch.setattr(time, "monotonic", clock)
    trace = Trace(started=4.0)
    trace.authorized(4.9)  # the key's check
    trace.authorized(4.98)  # the grant
    trace.looked_up(4.99, None)
    trace.looked_up(4.995, "l1")
    assert trace.stages.auth_s == pytest.approx(0.12)
    assert trace.stages.cache_s == pytest.approx(0.015)


def test_the_relay_keeps_a_median_within_a_quarter_and_the_longest() -> None:
    relay = RelayTimes()
    for seconds in [0.0001] * 50 + [0.002] * 49 + [0.75]:
        relay.add(seconds)
    assert relay.events == 100 and relay.longest == 0.75
    assert 0.0001 <= relay.median <= 0.0001 * 1.25
    heavy = RelayTimes()
    for _ in range(3):
        heavy.add(0.004)
    heavy.add(0.0001, events=4)  # a batch of four events weighs four
    assert 0.0001 <= heavy.median <= 0.0001 * 1.25
    assert RelayTimes().median == 0.0
    median = f"{relay.median * 1000:.2f}".encode()  # 0.10 to 0.13 ms
    assert relay.comment() == b": server-timing: relay;dur=" + median + b", relay-max;dur=750.00\n"


def test_a_relay_time_past_the_buckets_is_its_longest() -> None:
    relay = RelayTimes()
    relay.add(30.0)
    relay.add(-0.00001)  # a clock's rounding: the first bucket
    assert relay.longest == 30.0 and relay.median <= 1e-5
    relay.add(40.0)
    assert relay.median == 40.0
