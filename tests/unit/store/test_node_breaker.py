"""Which Memcached nodes are skipped (app/store/node_breaker.py), on a clock of the test's.
The same breaker against real memcached nodes going down and coming back:
tests/integration/test_cache_backends.py."""

from __future__ import annotations

from app.store.node_breaker import NodeBreaker

A, B = "10.0.0.1:11211", "10.0.0.2:11211"


def _breaker(dead_timeout: float = 10.0) -> tuple[NodeBreaker, list[float]]:
    now = [100.0]
    return NodeBreaker(dead_timeout, lambda: now[0]), now


def test_a_failed_node_is_skipped_until_its_time_then_one_caller_probes() -> None:
    breaker, now = _breaker()
    assert breaker.allow([A, B])
    assert breaker.failed(A)  # alive until now: the caller says so once
    assert not breaker.failed(A)  # already dead: nothing new to say
    assert breaker.dead() == [A]
    assert not breaker.allow([A]) and not breaker.allow([B, A])
    assert breaker.allow([B])  # the other node is not held back by it
    now[0] += 10.0
    assert breaker.dead() == []  # its time is up: no longer reported skipped
    assert breaker.allow([A])  # the probe
    assert not breaker.allow([A]) and not breaker.allow([A])  # the others wait for its answer
    assert breaker.succeeded([A, B]) == [A]  # back; B never left
    assert breaker.allow([A]) and breaker.dead() == []


def test_a_failed_node_is_probed_after_a_second_then_twice_as_late_each_time() -> None:
    """A restarted node is back within a second or two: it is skipped a quarter of that at
    first; each failed probe doubles the skip (0.25, 0.5, 1, 2, 4 s), up to the timeout (5 s
    here)."""
    breaker, now = _breaker(dead_timeout=5.0)
    for skip in (0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0):
        breaker.failed(A)
        now[0] += skip - 0.1
        assert not breaker.allow([A]) and breaker.dead() == [A], skip
        now[0] += 0.1
        assert breaker.allow([A]), skip  # the probe
    breaker.succeeded([A])
    breaker.failed(A)  # down again later: a quarter of a second first, as for any new failure
    now[0] += 0.25
    assert breaker.allow([A])


def test_a_probe_that_never_reports_holds_the_node_back_one_skip_only() -> None:
    """The probe's caller may never say how it went (no connection slot free, a connection
    the node had dropped, the caller killed): another caller probes after one more skip."""
    breaker, now = _breaker(dead_timeout=10.0)
    breaker.failed(A)
    now[0] += 0.25
    assert breaker.allow([A])  # the probe, which never reports
    now[0] += 0.2
    assert not breaker.allow([A])
    now[0] += 0.05
    assert breaker.allow([A])  # not 10 s later


def test_a_node_that_left_the_ring_is_forgotten() -> None:
    breaker, _ = _breaker()
    breaker.failed(A)
    breaker.forget(A)
    assert breaker.dead() == [] and breaker.allow([A])
    assert breaker.succeeded([A]) == []  # nothing to announce: it was never back
