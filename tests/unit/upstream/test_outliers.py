"""Each attempt's result for its upstream's breaker (app/upstream/outliers.py): no sockets, a fake
clock."""

from __future__ import annotations

import pytest

from app.upstream.breaker import BreakerPolicy
from app.upstream.outliers import CANCELLED, FAILED, OK, RATE_LIMITED, Outliers, result_at_status

POLICY = BreakerPolicy(failures_to_open=3, window=10, window_min=6, cooldown_s=5)


@pytest.mark.parametrize(
    ("status", "result"),
    [(500, FAILED), (502, FAILED), (503, FAILED), (429, RATE_LIMITED), (400, OK), (404, OK),
     (307, OK), (200, None), (204, None)],
)  # fmt: skip
def test_an_answer_is_judged_at_its_status_unless_it_is_a_2xx(status: int, result) -> None:
    assert result_at_status(status) == result


def _outliers(changes: list[tuple[str, str]], now: list[float]) -> Outliers:
    return Outliers(
        ["a", "b"], POLICY, lambda: now[0], on_state=lambda n, s: changes.append((n, s))
    )


def test_failures_open_one_upstream_and_each_change_is_announced_once() -> None:
    changes: list[tuple[str, str]] = []
    now = [0.0]
    outliers = _outliers(changes, now)
    for _ in range(3):
        outliers.start("a")
        outliers.record("a", FAILED)
    assert outliers.states() == {"a": "open", "b": "closed"}
    assert changes == [("a", "open")]
    now[0] = 5.0
    allowed = outliers.refresh()
    assert allowed("a") and allowed("b") and changes[-1] == ("a", "half_open")
    assert outliers.start("a")  # the probe
    assert not outliers.refresh()("a")
    outliers.record("a", OK, probe=True)
    assert changes == [("a", "open"), ("a", "half_open"), ("a", "closed")]


def test_rate_limited_answers_never_open_a_breaker() -> None:
    outliers = _outliers([], [0.0])
    for _ in range(POLICY.window):
        outliers.start("a")
        outliers.record("a", RATE_LIMITED)
    assert outliers.states()["a"] == "closed"


def test_a_cancelled_probe_lets_the_next_call_probe() -> None:
    now = [0.0]
    outliers = _outliers([], now)
    for _ in range(3):
        outliers.record("a", FAILED)
    now[0] = 6.0
    assert outliers.start("a")  # the probe
    assert not outliers.start("a")  # a call in panic beside it: not the probe
    outliers.record("a", CANCELLED)  # that one's end frees no slot
    assert not outliers.refresh()("a")
    outliers.record("a", CANCELLED, probe=True)
    assert outliers.refresh()("a") and outliers.states()["a"] == "half_open"


def test_cancelled_calls_are_no_failures() -> None:
    outliers = _outliers([], [0.0])
    for _ in range(POLICY.window):
        outliers.start("a")
        outliers.record("a", CANCELLED)
    assert outliers["a"].consecutive == 0 and outliers["a"].recent == ()


def test_an_unknown_result_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown attempt result"):
        _outliers([], [0.0]).record("a", "timeout")
