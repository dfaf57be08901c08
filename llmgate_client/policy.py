"""Timeout, deadline and retry policy as small immutable values. No I/O, no clock reads here:
every function that needs the time takes ``now`` so tests can pass any instant.

The rules:

- ``Timeout.connect`` bounds one TCP/TLS connect; ``Timeout.read`` is an *idle* timeout, the
  longest silence allowed between two reads (time to first byte included); ``Timeout.total``
  is a deadline for the whole call: waiting for a pooled connection, every attempt, every
  backoff sleep and, for a stream, reading it to the end. Each blocking step is given
  ``min(its own timeout, time left)``, so a call ends by the deadline plus one scheduling
  tick, whatever the number of retries.
- A retry happens only when the server cannot have started work (the connection was never
  made) or said it did not (429, 502, 503, 504, or ``x-should-retry: true``), never when it
  said ``x-should-retry: false``, never after a stream began, and only if the wait fits in the
  time left. The wait is the server's ``retry-after-ms`` / ``retry-after`` when given, else
  full-jitter exponential backoff: ``uniform(0, min(backoff_max, backoff_initial * 2**n))``.
- A resumable stream that drops reconnects (``ResumePolicy``): the first reconnect at once,
  the next ones after the same full-jitter backoff, at most ``attempts`` in a row without a
  new event between them, and never past the stream's deadline (llmgate_client/resume.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgate_wire.retry_after import parse_retry_after

RETRY_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class Timeout:
    """Three knobs, in seconds. ``total=None`` means no deadline (idle/connect still apply)."""

    connect: float = 5.0
    read: float = 120.0
    total: float | None = 300.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "total"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"Timeout.{name} must be > 0, got {value!r}")

    @classmethod
    def from_value(cls, value: float | Timeout | None) -> Timeout:
        """A ``Timeout`` as given; a number is a total deadline that also caps the others."""
        if isinstance(value, Timeout):
            return value
        if value is None:
            return cls(total=None)
        seconds = float(value)
        return cls(connect=min(cls.connect, seconds), read=min(cls.read, seconds), total=seconds)


@dataclass(frozen=True)
class Deadline:
    """An absolute instant on the monotonic clock, or ``None`` for no deadline."""

    at: float | None

    @classmethod
    def after(cls, seconds: float | None, now: float) -> Deadline:
        return cls(None if seconds is None else now + seconds)

    def remaining(self, now: float) -> float | None:
        return None if self.at is None else self.at - now

    def expired(self, now: float) -> bool:
        return self.at is not None and now >= self.at

    def cap(self, seconds: float, now: float) -> float:
        """``seconds`` shortened to the time left (never below a millisecond)."""
        left = self.remaining(now)
        return seconds if left is None else max(0.001, min(seconds, left))

    def earliest(self, other: Deadline) -> Deadline:
        if self.at is None:
            return other
        if other.at is None:
            return self
        return self if self.at <= other.at else other


@dataclass(frozen=True)
class RetryPolicy:
    """How many times to retry and how long to wait. ``max_retries=0`` disables retries."""

    max_retries: int = 2
    backoff_initial: float = 0.5
    backoff_max: float = 8.0
    retry_after_max: float = 60.0
    statuses: frozenset[int] = field(default=RETRY_STATUSES)

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")

    @classmethod
    def from_value(cls, value: int | RetryPolicy | None) -> RetryPolicy:
        if isinstance(value, RetryPolicy):
            return value
        return cls(max_retries=int(value or 0))

    def backoff(self, retry: int, rand: float) -> float:
        """Full jitter for the ``retry``-th retry (1-based); ``rand`` is uniform in [0, 1)."""
        ceiling = min(self.backoff_max, self.backoff_initial * 2 ** max(0, retry - 1))
        return rand * ceiling

    def is_retryable(self, *, status: int | None, headers: Mapping[str, str]) -> bool:
        """Whether this outcome may be retried at all (``status=None``: never connected)."""
        verdict = headers.get("x-should-retry", "").strip().lower()
        if verdict == "false":
            return False
        if status is None or verdict == "true":
            return True
        return status in self.statuses

    def delay(
        self,
        *,
        attempt: int,
        status: int | None,
        headers: Mapping[str, str],
        rand: float,
        now_epoch: float,
    ) -> float | None:
        """Seconds to wait before the next attempt, or ``None`` to give up.

        ``attempt`` is the number of attempts made so far; ``headers`` have lower-case names;
        ``now_epoch`` (wall clock) only serves an HTTP-date ``retry-after``.
        """
        if attempt > self.max_retries or not self.is_retryable(status=status, headers=headers):
            return None
        asked = retry_after(headers, now_epoch)
        if asked is None:
            return self.backoff(attempt, rand)
        # A server asking for more patience than we allow is a "no", not a hint to ignore.
        return asked if asked <= self.retry_after_max else None


def retry_after(headers: Mapping[str, str], now_epoch: float) -> float | None:
    """The server's requested wait in seconds: ``retry-after-ms``, else ``retry-after`` as
    seconds or an HTTP-date (RFC 9110 section 10.2.3). ``None`` when absent or unreadable.
    The parser is ``llmgate_wire``'s, the one the gateway uses for its upstream's answers."""
    return parse_retry_after(headers, now=lambda: now_epoch)


@dataclass(frozen=True)
class ResumePolicy:
    """How a dropped resumable stream reconnects; ``Client(resume=False)`` turns resuming off.

    ``attempts`` bounds the reconnects in a row that bring no new event (a stream that keeps
    moving may drop and resume any number of times, within its deadline).
    """

    attempts: int = 4
    backoff_initial: float = 0.25
    backoff_max: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("ResumePolicy.attempts must be >= 1 (resume=False turns it off)")

    @classmethod
    def from_value(cls, value: bool | ResumePolicy | None) -> ResumePolicy | None:
        """``True``: the defaults; ``False``/``None``: no resuming."""
        if isinstance(value, ResumePolicy):
            return value
        return cls() if value else None

    def delay(self, tries: int, rand: float) -> float:
        """The wait before a reconnect when ``tries`` were made since the last new event: none
        before the first (a recycled connection is the common drop), then full jitter."""
        if tries <= 0:
            return 0.0
        return rand * min(self.backoff_max, self.backoff_initial * 2 ** (tries - 1))
