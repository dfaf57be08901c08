"""Resumable streams' names: stream ids, event ids, the headers, and the Memcached keys of a
stream's log. No I/O here.

A stream id is 144 random bits (24 URL-safe characters): unguessable. Its log's keys are a
hash of the id *and* its owner (the caller's gateway key, or with keys off its credential's
tenant hash, app/request/headers.py), so a caller who does not own a stream computes keys that
hold nothing: an unknown, expired, made-up and foreign id all read as the same miss, and the
404 says the same for each (no oracle). An event's id is ``<stream id>:<n>``, ``n`` counting
the answer's events from 1 (docs/streams.md).
"""

from __future__ import annotations

import hashlib
import re
import secrets

ASK_HEADER = "X-LLMGate-Resumable"  # the request asks; the response answers yes or no
STREAM_HEADER = "X-LLMGate-Stream-ID"
LAST_EVENT_ID = "Last-Event-ID"
# Why a stream that asked is not resumable (the answer's X-LLMGate-Resumable: no; reason=).
DISABLED, LOG_MEMORY, BUDGET = "disabled", "log_memory", "budget"
JOINED_LATE = "joined_late"  # coalesced onto a stream whose first events are no longer kept
CACHED = "cached"  # the answer came from the cache
STORE = "store"  # Memcached did not take the log's first item (down, or just restarted)

_KEY_PREFIX = "llmgate:rs:"
_YES = ("true", "1", "yes")
_STREAM_ID = re.compile(r"[A-Za-z0-9_-]{24}")
_MAX_EVENT_NUMBER = 10**9


def new_stream_id() -> str:
    return secrets.token_urlsafe(18)


def is_stream_id(value: str) -> bool:
    return _STREAM_ID.fullmatch(value) is not None


def event_id(stream_id: str, n: int) -> str:
    return f"{stream_id}:{n}"


def parse_event_id(value: str) -> tuple[str, int] | None:
    """(stream id, n) of a ``Last-Event-ID``; None when it is not one of ours."""
    stream_id, sep, number = value.strip().rpartition(":")
    if not sep or not is_stream_id(stream_id) or not number.isdigit() or len(number) > 9:
        return None
    n = int(number)
    return (stream_id, n) if n < _MAX_EVENT_NUMBER else None


def parse_after(value: str | None) -> int | None:
    """``?after=`` of GET /v1/streams/{id}: a count of events (None: malformed)."""
    if value is None or value == "":
        return 0
    return int(value) if value.isdigit() and len(value) <= 9 else None


def asked(headers: list[tuple[str, str]]) -> bool:
    """Whether the request asks for a resumable stream (``X-LLMGate-Resumable: true``)."""
    wanted = ASK_HEADER.lower()
    return any(k.lower() == wanted and v.strip().lower() in _YES for k, v in headers)


def last_event_id(headers: list[tuple[str, str]]) -> str | None:
    wanted = LAST_EVENT_ID.lower()
    return next((v for k, v in headers if k.lower() == wanted), None)


def granted_headers(stream_id: str, window_s: int) -> list[tuple[str, str]]:
    return [(ASK_HEADER, f"yes; window={window_s}"), (STREAM_HEADER, stream_id)]


def refused_headers(reason: str) -> list[tuple[str, str]]:
    return [(ASK_HEADER, f"no; reason={reason}")]


def log_key(owner: str, stream_id: str) -> str:
    """The key of a stream's log meta; its chunks are ``chunk_key(log_key, i)``."""
    digest = hashlib.sha256(b"llmgate-resume\n%s\n%s" % (owner.encode(), stream_id.encode()))
    return _KEY_PREFIX + digest.hexdigest()


def chunk_key(key: str, i: int) -> str:
    return f"{key}:c{i}"


def resumed_key(key: str) -> str:
    """Set by each resume: the stream's writer does not stop a stream someone came back to."""
    return key + ":r"


def deleted_key(key: str) -> str:
    """Set by DELETE /v1/streams/{id}: the writer stops a stream its caller left."""
    return key + ":x"
