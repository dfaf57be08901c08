"""Retry budgets: how many retries an outage may add. No I/O here.

Two limits, both on top of ``LLMGATE_RETRIES`` and the deadline (app/upstream/retry.py):

- **Across requests** (``RetryBudget``, Envoy's retry budget): per worker, the retries in
  flight may be at most ``LLMGATE_RETRY_BUDGET_PERCENT`` of the requests in flight, and
  ``LLMGATE_RETRY_BUDGET_MIN`` are always allowed. A request in flight is an
  ``Attempts.open`` call in progress; a retry in flight is an attempt beyond the first (a
  retry or a failover) from the moment it is granted - its backoff wait included - until
  the next attempt is decided or the call ends. When every upstream answers 503, most
  requests get one attempt instead of ``1 + LLMGATE_RETRIES``: an outage does not triple the
  load on a provider that is already shedding it.
- **Per caller** (``caller_retry_count`` / ``gateway_retries``): the OpenAI SDKs number their
  own retries in ``x-stainless-retry-count`` (0 on the first try). A caller already retrying
  gets that many fewer gateway retries, so the SDK's and the gateway's retries do not
  multiply.

The budget is plain counters: one per worker, touched only by that worker's greenlets, which
switch only at I/O - never between a check and its increment.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

STAINLESS_RETRY_COUNT = "x-stainless-retry-count"
_MAX_COUNT_DIGITS = 6  # a retry number longer than this is not a retry number


class RetryBudget:
    """Requests and retries in flight in one worker, and whether one more retry fits."""

    def __init__(self, percent: float = 20.0, minimum: int = 3) -> None:
        if not 0 <= percent <= 100 or minimum < 0:
            raise ValueError("percent must be in [0, 100] and minimum >= 0")
        self.percent = percent
        self.minimum = minimum
        self.requests = 0  # Attempts.open calls in progress
        self.retries = 0  # granted attempts beyond the first, in progress

    def allows_one_more(self) -> bool:
        """Whether one more retry stays within max(minimum, percent of the requests)."""
        wanted = self.retries + 1
        return wanted <= self.minimum or wanted * 100 <= self.percent * self.requests

    def request(self) -> RetryClaim:
        """Count a request in flight until its ticket is closed (use it as a context
        manager: it is closed however the block ends, a killed greenlet included)."""
        self.requests += 1
        return RetryClaim(self)


class RetryClaim:
    """One request's hold on the budget: itself, and at most one retry at a time."""

    def __init__(self, budget: RetryBudget) -> None:
        self.budget = budget
        self.holds_retry = False
        self.closed = False

    def retry(self) -> bool:
        """Ask for the next attempt beyond the first. The previous one (if any) ended: its
        slot is given back first, so a request never holds more than one. False: the budget
        is spent, do not retry."""
        if self.closed:
            raise RuntimeError("ticket already closed")
        self._give_back_retry()
        if not self.budget.allows_one_more():
            return False
        self.budget.retries += 1
        self.holds_retry = True
        return True

    def close(self) -> None:
        """The request left Attempts.open: give back everything. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._give_back_retry()
        self.budget.requests -= 1

    def _give_back_retry(self) -> None:
        if self.holds_retry:
            self.holds_retry = False
            self.budget.retries -= 1

    def __enter__(self) -> RetryClaim:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def caller_retry_count(headers: Mapping[str, str]) -> int | None:
    """The caller's own retry number from ``x-stainless-retry-count`` (any case), or None when
    absent or not a plain non-negative integer (a bad value is ignored, never an error)."""
    for name, value in headers.items():
        if name.lower() == STAINLESS_RETRY_COUNT:
            value = value.strip()
            if value.isascii() and value.isdigit() and len(value) <= _MAX_COUNT_DIGITS:
                return int(value)
            return None
    return None


def gateway_retries(configured: int, caller_count: int | None) -> int:
    """The retries the gateway may still make for a caller on its ``caller_count``-th retry:
    ``LLMGATE_RETRIES`` less what the caller already did, never below 0."""
    if caller_count is None:
        return configured
    return max(0, configured - caller_count)
