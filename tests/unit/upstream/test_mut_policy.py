"""Retry policy edges the mutation run found untested (app/upstream/retry.py and
llmgate_wire/retry_after.py).

Expected values come from the README's retry rules and RFC 9110 10.2.3 (Retry-After is
delay-seconds or an HTTP-date); the clock and the random source are always pinned.
"""

from __future__ import annotations

import email.utils

from app.upstream.retry import Deadline, RetryPolicy
from llmgate_wire.retry_after import parse_retry_after


def _fixed(value: float):
    return lambda: value


def test_a_deadline_remembers_its_budget() -> None:
    deadline = Deadline.start(30.0, now=_fixed(100.0))
    assert (deadline.at, deadline.budget) == (130.0, 30.0)


def test_a_deadline_with_time_left_is_not_expired() -> None:
    deadline = Deadline.start(10.0, now=_fixed(100.0))
    assert not deadline.expired(now=_fixed(109.5))  # half a second left
    assert deadline.remaining(now=_fixed(109.5)) == 0.5
    assert deadline.expired(now=_fixed(110.0))


def test_an_http_date_retry_after_is_measured_against_the_given_clock() -> None:
    when = email.utils.formatdate(1_000_007.0, usegmt=True)
    policy = RetryPolicy(retry_after_max=20).increment()
    # The policy reads "now" from the clock it is given, not from the system clock.
    assert policy.delay_for_status(503, {"Retry-After": when}, now=_fixed(1_000_000.0)) == 7.0


def test_a_retry_after_of_exactly_the_maximum_is_still_waited_out() -> None:
    # "honouring retry-after ... up to LLMGATE_RETRY_AFTER_MAX_S": the maximum is included.
    policy = RetryPolicy(retry_after_max=20.0).increment()
    assert policy.delay_for_status(429, {"retry-after": "20"}) == 20.0
    assert policy.delay_for_status(429, {"retry-after": "20.001"}) is None


def test_503_without_retry_after_gets_one_quick_retry_but_504_keeps_the_schedule() -> None:
    second = RetryPolicy(retries=5).increment().increment()  # two attempts made
    assert second.delay_for_status(503, {}, rand=_fixed(1.0)) is None
    assert second.delay_for_status(429, {}, rand=_fixed(1.0)) is None
    # 502 and 504 come from proxies and gateways: the normal backoff goes on.
    assert second.delay_for_status(504, {}, rand=_fixed(1.0)) == 1.0
    assert second.delay_for_status(502, {}, rand=_fixed(1.0)) == 1.0


def test_an_http_date_in_the_past_means_now_and_a_near_one_its_fraction() -> None:
    past = email.utils.formatdate(999_990.0, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=_fixed(1_000_000.0)) == 0.0
    soon = email.utils.formatdate(1_000_001.0, usegmt=True)
    assert parse_retry_after({"retry-after": soon}, now=_fixed(1_000_000.5)) == 0.5
