"""The wait a server asks for before a retry, read from its headers. No I/O; the wall clock
is passed in (an HTTP date is an instant, the wait is that instant minus now).

``retry-after-ms`` (milliseconds, the OpenAI API's own header) wins over ``retry-after``
(RFC 9110 section 10.2.3: seconds, or an HTTP date). A wait in the past is 0; an unreadable
value is no answer (None), never an error: the caller falls back to its own backoff.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Mapping


def parse_retry_after(
    headers: Mapping[str, str], now: Callable[[], float] = time.time
) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())
