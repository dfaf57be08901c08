"""Gateway keys and their limits, per call: authenticate, admit, and settle afterwards.

``Access.admit`` runs before any upstream work: the caller's key (app/keyring.py), what it
may use, and its limits counted in the shared counters (app/limits.py). It returns a
``Grant`` that holds what the call took (a request, a stream slot, a token reservation),
the headers the answer carries (OpenAI's ``x-ratelimit-*``), and ``settle()``, which the end
of the call runs once with the answer's ``usage``.

The keys file is re-read when it changes: each worker looks at its modification time at
most every ``CHECK_EVERY_S`` seconds, on a call, so a revoked key stops working everywhere
within that time (SIGHUP reloads still work: new workers read the file). A file that no
longer parses is ignored, loudly, and the keys in force stay in force.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from app import jsonedit, limits
from app.errors import LimitsUnavailable, RateLimited
from app.keyring import GatewayKey, KeyRing, KeysFileError, load
from app.limits import Counters, Window

log = logging.getLogger("llmgate.access")
CHECK_EVERY_S = 0.25
_WARN_EVERY_S = 10.0


class KeySource:
    """The key ring of a file, re-read when the file changes."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._stamp: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self.reload_errors = 0
        self.ring = self._read()  # at start a bad file is an error: it stops the worker

    def current(self) -> KeyRing:
        now = self._clock()
        if now - self._checked >= CHECK_EVERY_S:
            self._checked = now
            try:
                stamp = _stamp(self.path)
            except OSError:
                stamp = None
            if stamp != self._stamp:
                try:
                    self.ring = self._read()
                    log.info("keys file %s re-read: %d keys", self.path, len(self.ring.keys))
                except (OSError, KeysFileError) as exc:
                    self._stamp = stamp  # do not re-read it on every call until it changes
                    self.reload_errors += 1
                    log.error("keys file not re-read, the keys in force stay: %s", exc)
        return self.ring

    def _read(self) -> KeyRing:
        stamp = _stamp(self.path)
        with open(self.path, encoding="utf-8") as f:
            ring = load(f.read(), path=self.path)
        self._stamp = stamp
        return ring


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@dataclass
class Grant:
    """What one call took from its key's limits, until ``settle()`` gives back the rest."""

    key: GatewayKey
    headers: list[tuple[str, str]] = field(default_factory=list)
    reserved: int = 0
    token_windows: list[Window] = field(default_factory=list)
    stream_window: Window | None = None
    settled: bool = False


class Access:
    """The gate of one worker: keys from ``source``, limits in ``counters``."""

    def __init__(
        self,
        source: KeySource,
        counters: Counters,
        *,
        fail_open: bool = True,
        deadline_s: float = 600.0,
        on_usage: Callable[[GatewayKey, int, dict[str, Any] | None], None] | None = None,
        on_counter_error: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.counters = counters
        self.fail_open = fail_open
        self.deadline_s = deadline_s
        self._on_usage = on_usage
        self._on_counter_error = on_counter_error
        self._clock = clock
        self._warned = float("-inf")

    def authenticate(self, headers: list[tuple[str, str]]) -> GatewayKey:
        """The caller's key, or InvalidApiKey (401). First, before the body is even read."""
        return self.source.current().authenticate(headers, self._clock())

    def admit(
        self, key: GatewayKey, model: str | None, body: Mapping[str, Any] | None, *, stream: bool
    ) -> Grant:
        """The call's grant, or the error to answer with: 403, 400, 429 (or 503 when the
        counters are down and limits fail closed)."""
        now = self._clock()
        if model is not None or body is not None:
            key.check_request(model, body)
        grant = Grant(key)
        taken: list[tuple[str, int]] = []  # given back if a later limit refuses the call
        try:
            if stream and key.max_streams:
                window = limits.streams(self.deadline_s)
                count = self._take(key.name, window, 1, now, taken)
                if count is not None and count > key.max_streams:
                    raise RateLimited(
                        f"The key {key.name!r} has {key.max_streams} streams open already.",
                        kind="requests",
                        retry_after_s=1,
                    )
                grant.stream_window = window if count is not None else None
            if key.requests_per_minute:
                window = limits.minute("requests", now)
                count = self._take(key.name, window, 1, now, taken)
                if count is not None:
                    remaining = max(0, key.requests_per_minute - count)
                    reset = window.reset_s(now)
                    if count > key.requests_per_minute:
                        raise RateLimited(
                            f"Rate limit reached for key {key.name!r}: "
                            f"{key.requests_per_minute} requests per minute.",
                            kind="requests",
                            retry_after_s=int(reset + 0.999),
                        )
                    grant.headers += _trio("requests", key.requests_per_minute, remaining, reset)
            grant.reserved = key.reservation(body)
            self._take_tokens(grant, now, taken)
        except BaseException:
            for counter, delta in taken:
                self.counters.decr(counter, delta)
            raise
        return grant

    def _take_tokens(self, grant: Grant, now: float, taken: list[tuple[str, int]]) -> None:
        key, want = grant.key, grant.reserved
        budgets = [
            (limits.minute("tokens", now), key.tokens_per_minute, False),
            (limits.day(now), key.tokens_per_day, True),
            (limits.month(now), key.tokens_per_month, True),
        ]
        for window, limit, quota in budgets:
            if not limit:
                continue
            used = self._take(key.name, window, want, now, taken)
            if used is None:
                continue
            grant.token_windows.append(window)
            # Refused: a call that would cross the limit, or any once it is reached.
            if used > limit or (want == 0 and used >= limit):
                per = {"tokens": "minute", "tokens_day": "day", "tokens_month": "month"}
                raise RateLimited(
                    f"Token limit reached for key {key.name!r}: {limit} tokens per "
                    f"{per[window.what]} ({used - want} used, {want} asked for).",
                    kind="tokens",
                    retry_after_s=int(window.reset_s(now) + 0.999),
                    quota=quota,
                )
            if window.what == "tokens":
                reset = window.reset_s(now)
                grant.headers += _trio("tokens", limit, max(0, limit - used), reset)

    def _take(
        self, name: str, window: Window, delta: int, now: float, taken: list[tuple[str, int]]
    ) -> int | None:
        """Add ``delta`` to the key's counter of ``window``: its new value, or None when the
        counters are down and limits fail open (LimitsUnavailable when they fail closed)."""
        counter = window.key(name)
        value = self.counters.incr(counter, delta, window.ttl(now))
        if value is None:
            if self._on_counter_error is not None:
                self._on_counter_error()
            if now - self._warned >= _WARN_EVERY_S:
                self._warned = now
                state = "open: calls pass uncounted" if self.fail_open else "closed: calls refused"
                log.warning("limit counters unreachable; limits fail %s", state)
            if not self.fail_open:
                raise LimitsUnavailable("Limits cannot be checked right now; retry shortly.")
            return None
        if delta:
            taken.append((counter, delta))
        return value

    def settle(self, grant: Grant, usage: dict[str, Any] | None, billed: bool) -> None:
        """The call is over: count its real tokens (none when nothing was billed, a cache hit
        say) in place of the reservation, and free its stream slot. Runs once. A billed call
        whose usage never came (the caller left mid-stream, before the usage chunk) keeps its
        reservation: leaving early must not make a call free."""
        if grant.settled:
            return
        grant.settled = True
        spent = 0
        if billed:
            spent = _total_tokens(usage) if usage else grant.reserved
        delta = spent - grant.reserved
        for window in grant.token_windows:
            if delta > 0:
                self.counters.incr(window.key(grant.key.name), delta, window.ttl(self._clock()))
            elif delta < 0:
                self.counters.decr(window.key(grant.key.name), -delta)
        if grant.stream_window is not None:
            self.counters.decr(grant.stream_window.key(grant.key.name), 1)
        if self._on_usage is not None:
            self._on_usage(grant.key, spent, usage if billed else None)

    def usage(self) -> dict[str, Any]:
        """Every key's counts in the current windows, with its limits (GET /admin/usage)."""
        now = self._clock()
        ring = self.source.current()
        windows = [
            limits.minute("requests", now),
            limits.minute("tokens", now),
            limits.day(now),
            limits.month(now),
            limits.streams(self.deadline_s),
        ]
        wanted = [w.key(k.name) for k in ring.keys for w in windows]
        counts = self.counters.read(wanted) if wanted else {}
        keys = []
        for k in ring.keys:
            got = {w.what: (counts or {}).get(w.key(k.name), 0) for w in windows}
            keys.append(
                {
                    "name": k.name,
                    "revoked": k.revoked,
                    "requests_this_minute": got["requests"],
                    "tokens_this_minute": got["tokens"],
                    "tokens_today": got["tokens_day"],
                    "tokens_this_month": got["tokens_month"],
                    "streams_open": got["streams"],
                    "limits": {
                        "requests_per_minute": k.requests_per_minute,
                        "tokens_per_minute": k.tokens_per_minute,
                        "max_streams": k.max_streams,
                        "tokens_per_day": k.tokens_per_day,
                        "tokens_per_month": k.tokens_per_month,
                    },
                }
            )
        return {"counters_available": counts is not None, "keys": keys}


def _trio(what: str, limit: int, remaining: int, reset_s: float) -> list[tuple[str, str]]:
    return [
        (f"x-ratelimit-limit-{what}", str(limit)),
        (f"x-ratelimit-remaining-{what}", str(remaining)),
        (f"x-ratelimit-reset-{what}", limits.reset_text(reset_s)),
    ]


def _total_tokens(usage: dict[str, Any] | None) -> int:
    if not usage:
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool):
        return max(0, total)
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "input_tokens",
                                     "output_tokens")]  # fmt: skip
    return sum(p for p in parts if isinstance(p, int) and not isinstance(p, bool) and p > 0)


def is_usage_chunk(chunk: bytes) -> dict[str, Any] | None:
    """The usage of a chat/completions stream's usage chunk (``"choices": []`` and a usage
    object), None for any other bytes. Cheap for the chunks that are not it."""
    if not chunk.startswith(b"data: {") or b'"usage"' not in chunk:
        return None
    try:
        doc = json.loads(chunk[6:])
    except ValueError:
        return None
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if doc.get("choices") == [] and isinstance(usage, dict):
        return usage
    return None


def without_usage_chunk(
    batches: Iterator[list[bytes]], on_usage: Callable[[dict[str, Any]], None]
) -> Iterator[list[bytes]]:
    """A stream without its usage chunk, for a caller who did not ask for it (the gateway
    asked the upstream for it, to count the key's tokens): the usage goes to ``on_usage``."""
    for batch in batches:
        kept = []
        for chunk in batch:
            usage = is_usage_chunk(chunk)
            if usage is None:
                kept.append(chunk)
            else:
                on_usage(usage)
        if kept:
            yield kept


def with_usage_requested(raw: bytes, body: Mapping[str, Any]) -> bytes:
    """The caller's body asking for ``stream_options.include_usage``, every other byte kept
    (app/jsonedit.py); the body itself when it already asks or cannot be edited."""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return raw
    wanted = {**options, "include_usage": True} if isinstance(options, dict) else None
    try:
        if wanted is not None:
            return jsonedit.with_value(raw, "stream_options", json.dumps(wanted).encode())
        return jsonedit.with_member(raw, "stream_options", b'{"include_usage":true}')
    except ValueError:
        return raw
