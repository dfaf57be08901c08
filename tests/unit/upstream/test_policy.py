"""Retry policy and deadlines, with the clock and the random source pinned."""

from __future__ import annotations

import email.utils

import pytest

from app.upstream.retry import Deadline, RetryPolicy
from llmgate_wire.retry_after import parse_retry_after


def test_full_jitter_backoff_grows_and_caps() -> None:
    policy = RetryPolicy(retries=10, backoff=0.5, backoff_max=8.0)
    ceilings = []
    for _ in range(7):
        policy = policy.increment()
        ceilings.append(policy.backoff_delay(rand=lambda: 1.0))
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert policy.backoff_delay(rand=lambda: 0.0) == 0.0


def test_retries_stop_when_exhausted() -> None:
    policy = RetryPolicy(retries=2).increment()
    assert policy.delay_for_connect_error(lambda: 0.5) is not None
    policy = policy.increment().increment()  # three attempts made
    assert policy.exhausted
    assert policy.delay_for_connect_error(lambda: 0.5) is None
    assert policy.delay_for_status(502, {}, lambda: 0.5) is None


@pytest.mark.parametrize("status", [400, 401, 404, 409, 500, 501])
def test_statuses_that_may_have_billed_or_are_permanent_are_not_retried(status: int) -> None:
    assert RetryPolicy().increment().delay_for_status(status, {"retry-after": "1"}) is None


def test_retry_after_is_honoured_and_capped() -> None:
    policy = RetryPolicy(retry_after_max=20).increment()
    assert policy.delay_for_status(429, {"Retry-After": "3"}) == 3.0
    assert policy.delay_for_status(503, {"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    # A wait longer than we are willing to hold the caller: hand the answer back instead.
    assert policy.delay_for_status(429, {"retry-after": "60"}) is None


def test_429_without_retry_after_gets_one_quick_retry_only() -> None:
    first = RetryPolicy(retries=5).increment()
    assert first.delay_for_status(429, {}, lambda: 1.0) == 0.5
    assert first.increment().delay_for_status(429, {}, lambda: 1.0) is None
    # A proxy's 502/504 keeps the normal backoff schedule.
    assert first.increment().delay_for_status(502, {}, lambda: 1.0) == 1.0


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
    date = email.utils.formatdate(1000.0 + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=lambda: 1000.0) == 30.0
    assert parse_retry_after({"retry-after": "-5"}) == 0.0


def test_deadline_counts_down_and_never_goes_negative() -> None:
    clock = iter([100.0, 103.0, 200.0])
    deadline = Deadline.start(10.0, now=lambda: next(clock))
    assert deadline.remaining(now=lambda: next(clock)) == 7.0
    assert deadline.expired(now=lambda: next(clock))


def test_an_attempt_more_keeps_every_other_setting() -> None:
    import dataclasses

    assert [f.name for f in dataclasses.fields(RetryPolicy)] == [
        "retries", "backoff", "backoff_max", "retry_after_max", "attempt"
    ]  # fmt: skip
    policy = RetryPolicy(retries=7, backoff=0.25, backoff_max=3.0, retry_after_max=9.0)
    after = policy.increment().increment()
    assert after == dataclasses.replace(policy, attempt=2)
