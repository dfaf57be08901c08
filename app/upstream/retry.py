"""Retry and deadline policy as small immutable values. No I/O, no clock reads of its own.

A retry is allowed only when the upstream cannot have started billable work or said to come
back: a connection that never opened, or a 429 / 502 / 503 / 504 answer, or Anthropic's 529
(overloaded: on the /v1/messages door an Anthropic upstream's answer is relayed as it is,
not turned into a 503). It happens only
before any byte reached the caller and only when the wait fits in what is left of the
request's deadline. The clock and the random source are passed in, so tests pin both.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llmgate_wire.retry_after import parse_retry_after

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504, 529})


@dataclass(frozen=True)
class Deadline:
    """A point in monotonic time; ``remaining()`` is never negative."""

    at: float
    budget: float

    @classmethod
    def start(cls, budget: float, now: Callable[[], float] = time.monotonic) -> Deadline:
        return cls(at=now() + budget, budget=budget)

    def remaining(self, now: Callable[[], float] = time.monotonic) -> float:
        return max(0.0, self.at - now())

    def expired(self, now: Callable[[], float] = time.monotonic) -> bool:
        return self.remaining(now) <= 0.0


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 2
    backoff: float = 0.5
    backoff_max: float = 8.0
    retry_after_max: float = 20.0
    attempt: int = 0  # attempts already made

    def increment(self) -> RetryPolicy:
        """The policy after one more attempt (built directly: ``dataclasses.replace`` is
        4 us of its generic walk, once a call; tests/unit/upstream/test_policy.py holds
        every field kept)."""
        return RetryPolicy(
            self.retries, self.backoff, self.backoff_max, self.retry_after_max, self.attempt + 1
        )

    @property
    def exhausted(self) -> bool:
        return self.attempt > self.retries

    def backoff_delay(self, rand: Callable[[], float] = random.random) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]."""
        ceiling = min(self.backoff_max, self.backoff * (2 ** max(0, self.attempt - 1)))
        return rand() * ceiling

    def delay_for_status(
        self,
        status: int,
        headers: Mapping[str, str],
        rand: Callable[[], float] = random.random,
        now: Callable[[], float] = time.time,
    ) -> float | None:
        """Seconds to wait before retrying an upstream answer, or None: do not retry."""
        if status not in RETRYABLE_STATUSES or self.exhausted:
            return None
        after = parse_retry_after(headers, now)
        if after is not None:
            return after if after <= self.retry_after_max else None
        if status == 503 or status == 429:
            # Without retry-after a 429/503 may be a quota verdict, not a blip: one quick
            # jittered retry is cheap, more would hammer a provider that is shedding load.
            return self.backoff_delay(rand) if self.attempt <= 1 else None
        return self.backoff_delay(rand)

    def delay_for_connect_error(self, rand: Callable[[], float] = random.random) -> float | None:
        return None if self.exhausted else self.backoff_delay(rand)
