"""Hedged first token: the delay (app/upstream/hedge.py) and the race of two starts
(app/upstream/race.py).

The race runs real greenlets; the exchanges are stand-ins that sleep and then return or
raise, recording whether they were closed, so each outcome can be counted.
"""

from __future__ import annotations

import gevent
import pytest

from app.core.errors import UpstreamUnreachable
from app.upstream import race
from app.upstream.catalog import load
from app.upstream.hedge import MIN_SAMPLES, HedgePolicy, TtftWindow


# -- the delay -------------------------------------------------------------------------------
def test_a_fixed_delay_ignores_what_was_seen() -> None:
    window = TtftWindow()
    for _ in range(MIN_SAMPLES):
        window.add(5.0)
    assert HedgePolicy.parse(300).delay(window) == 0.3


def test_a_percentile_waits_for_enough_samples_then_follows_them_within_bounds() -> None:
    policy = HedgePolicy.parse("p90", min_ms=50, max_ms=1500)
    window = TtftWindow()
    for _ in range(MIN_SAMPLES - 1):
        window.add(0.2)
    assert policy.delay(window) == 1.5  # cold: the ceiling, not a guess
    window.add(0.2)
    assert policy.delay(window) == pytest.approx(0.2)
    for _ in range(MIN_SAMPLES):
        window.add(0.001)
    assert policy.delay(window) == pytest.approx(0.2)  # p90 of 20x1 ms + 20x200 ms
    for _ in range(10 * MIN_SAMPLES):
        window.add(0.001)
    assert policy.delay(window) == pytest.approx(0.05)  # the floor
    for _ in range(300):
        window.add(9.0)
    assert policy.delay(window) == 1.5  # the ceiling


def test_the_percentile_is_nearest_rank_over_the_latest_window() -> None:
    window = TtftWindow(size=100)
    for ms in range(1, 201):  # only 101..200 are kept
        window.add(ms / 1000)
    assert len(window) == 100
    assert window.percentile(95) == 0.195
    assert window.percentile(50) == 0.150
    assert window.percentile(99.9) == 0.200
    assert window.percentile(1) == 0.101


@pytest.mark.parametrize("value", [True, None, "p0", "p100", "fast", -5, [300]])
def test_what_hedge_after_refuses(value) -> None:
    with pytest.raises(ValueError):
        HedgePolicy.parse(value)


def test_the_config_file_turns_hedging_on_per_upstream() -> None:
    text = """
[[upstreams]]
name = "a"
base_url = "http://a"
hedge_after = "p95"
hedge_max_ms = 800

[[upstreams]]
name = "b"
base_url = "http://b"
"""
    a, b = load(text, {})
    assert a.hedge == HedgePolicy(percentile=95.0, min_ms=50, max_ms=800)
    assert b.hedge is None


# -- the race --------------------------------------------------------------------------------
class Start:
    def __init__(self, name: str, ok: bool = True) -> None:
        self.name, self.ok, self.closed = name, ok, False

    def close(self) -> None:
        self.closed = True


class Exchange:
    """Sleeps ``after`` seconds, then returns ``result`` (or raises it); notes a kill."""

    def __init__(self, after: float, result) -> None:
        self.after, self.result = after, result
        self.calls = self.killed = 0

    def __call__(self):
        self.calls += 1
        try:
            gevent.sleep(self.after)
        except gevent.GreenletExit:
            self.killed += 1
            raise
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def test_a_primary_in_time_sends_no_backup() -> None:
    primary, backup = Exchange(0.01, Start("p")), Exchange(0, Start("b"))
    start, verdict = race.first_to_start(primary, backup, delay=0.5)
    assert (start.name, verdict, backup.calls) == ("p", "not_sent", 0)


def test_a_late_primary_loses_to_the_backup_and_is_killed() -> None:
    primary, backup = Exchange(5.0, Start("p")), Exchange(0.01, Start("b"))
    start, verdict = race.first_to_start(primary, backup, delay=0.05)
    assert (start.name, verdict) == ("b", "backup")
    assert (primary.killed, backup.calls) == (1, 1)


def test_a_primary_that_starts_while_the_backup_connects_wins_and_the_backup_is_killed() -> None:
    primary, backup = Exchange(0.1, Start("p")), Exchange(5.0, Start("b"))
    start, verdict = race.first_to_start(primary, backup, delay=0.02)
    assert (start.name, verdict, backup.killed) == ("p", "primary", 1)


def test_a_loser_that_finished_too_is_closed() -> None:
    late = Start("b")
    primary, backup = Exchange(0.05, Start("p")), Exchange(0.05, late)
    start, _ = race.first_to_start(primary, backup, delay=0.0)
    assert start.name == "p" and late.closed  # both done in one turn: the primary came first


def test_a_failing_backup_gives_way_to_the_primary() -> None:
    refused = Start("b", ok=False)
    primary, backup = Exchange(0.1, Start("p")), Exchange(0.01, refused)
    start, verdict = race.first_to_start(primary, backup, delay=0.02)
    assert (start.name, verdict, refused.closed) == ("p", "primary", True)
    primary, backup = Exchange(0.1, Start("p")), Exchange(0.01, UpstreamUnreachable("down"))
    assert race.first_to_start(primary, backup, delay=0.02)[1] == "primary"


def test_a_failing_primary_gives_way_to_the_backup() -> None:
    answer = Start("p", ok=False)
    primary, backup = Exchange(0.05, answer), Exchange(0.1, Start("b"))
    start, verdict = race.first_to_start(primary, backup, delay=0.01)
    assert (start.name, verdict, answer.closed) == ("b", "backup", True)


def test_when_both_fail_the_primary_outcome_is_reported() -> None:
    answer = Start("p", ok=False)
    primary, backup = Exchange(0.05, answer), Exchange(0.01, Start("b", ok=False))
    start, verdict = race.first_to_start(primary, backup, delay=0.01)
    assert (start, verdict, answer.closed) == (answer, "failed", False)
    primary = Exchange(0.05, UpstreamUnreachable("primary down"))
    backup = Exchange(0.01, UpstreamUnreachable("backup down"))
    with pytest.raises(UpstreamUnreachable, match="primary down"):
        race.first_to_start(primary, backup, delay=0.01)


def test_a_declined_backup_leaves_the_primary_alone() -> None:
    primary = Exchange(0.1, Start("p"))
    start, verdict = race.first_to_start(primary, lambda: None, delay=0.01)
    assert (start.name, verdict) == ("p", "not_sent")


def test_a_primary_failing_before_the_delay_is_final() -> None:
    primary, backup = Exchange(0.01, UpstreamUnreachable("down")), Exchange(0, Start("b"))
    with pytest.raises(UpstreamUnreachable):
        race.first_to_start(primary, backup, delay=1.0)
    assert backup.calls == 0


def test_a_killed_race_kills_both_exchanges() -> None:
    primary, backup = Exchange(5.0, Start("p")), Exchange(5.0, Start("b"))
    racing = gevent.spawn(race.first_to_start, primary, backup, 0.01)
    gevent.sleep(0.1)
    racing.kill(block=True)
    assert (primary.killed, backup.killed) == (1, 1)
