"""Counters, the request log and fail-once bookkeeping: the simulator's only mutable state.

Every connection runs in a greenlet of one OS thread and gevent switches only at I/O, so a
plain ``+= 1`` cannot interleave with another; there are no locks on purpose.
"""

from __future__ import annotations

import base64
import hashlib
from collections import Counter, deque
from typing import Any

from .dialects import Route, classify
from .prompt_cache import Use

LOG_SIZE = 100


class Stats:
    """What happened since start or the last reset, as ``GET /sim/stats`` reports it."""

    def __init__(self) -> None:
        self.connections_open = 0
        self.connections_unused = 0  # open and no request yet: a client's spare, say
        self.epoch = 0  # resets so far: what a count made before the last one belongs to
        self.reset()

    def reset(self) -> None:
        """Zero everything except the open connections' counts, which describe the present."""
        self.epoch += 1
        self.connections_accepted = 0
        self.requests = 0
        self.tokens = 0  # prompt and completion tokens generated (for the rate-limit headers)
        self.requests_by_path: Counter[str] = Counter()
        self.requests_by_dialect: Counter[str] = Counter()  # openai, anthropic, gemini
        self.requests_by_route: Counter[str] = Counter()  # "<dialect> <path template>"
        self.streams_started = 0
        self.streams_completed = 0
        self.streams_abandoned = 0
        self.requests_abandoned = 0
        self.faults_injected = 0
        self.log: deque[dict[str, Any]] = deque(maxlen=LOG_SIZE)
        self._failures: Counter[str] = Counter()
        # Per account (group_of its key): what its prompt cache did (prompt_cache.py).
        self.prompt_cache: dict[str, Counter[str]] = {}

    def record(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: Any,
        raw: bytes = b"",
        *,
        route: Route | None = None,
    ) -> None:
        """Count a request, under its path, its dialect and its route, and keep it for
        ``/sim/requests``: the body parsed as JSON (or None), and the exact bytes received,
        base64 (a gateway must forward them unchanged)."""
        route = route or classify(path)
        self.requests += 1
        self.requests_by_path[path] += 1
        self.requests_by_dialect[route.dialect] += 1
        self.requests_by_route[f"{route.dialect} {route.name}"] += 1
        self.log.append(
            {
                "method": method,
                "path": path,
                "query": query,
                "headers": headers,
                "body": body,
                "raw_body": base64.b64encode(raw).decode("ascii"),
            }
        )

    def cache_used(self, group: str, use: Use) -> None:
        """One generated answer's prompt, by what its account's prompt cache did with it:
        read, written (as reported: Anthropic's only), and the rest."""
        counts = self.prompt_cache.setdefault(group, Counter())
        counts["requests"] += 1
        counts["read"] += use.read
        counts["written"] += use.written
        counts["written_1h"] += use.written_1h
        counts["uncached"] += use.uncached

    def take_failure(self, key: str, times: int) -> bool:
        """True while fewer than ``times`` requests with ``key`` have been failed."""
        if self._failures[key] >= times:
            return False
        self._failures[key] += 1
        return True

    def snapshot(self) -> dict[str, Any]:
        return {
            "connections_accepted": self.connections_accepted,
            "connections_open": self.connections_open,
            "connections_unused": self.connections_unused,
            "requests": self.requests,
            "tokens": self.tokens,
            "requests_by_path": dict(self.requests_by_path),
            "requests_by_dialect": dict(self.requests_by_dialect),
            "requests_by_route": dict(self.requests_by_route),
            "streams_started": self.streams_started,
            "streams_completed": self.streams_completed,
            "streams_abandoned": self.streams_abandoned,
            "requests_abandoned": self.requests_abandoned,
            "faults_injected": self.faults_injected,
            "prompt_cache": {group: dict(counts) for group, counts in self.prompt_cache.items()},
        }

    def requests_log(self) -> list[dict[str, Any]]:
        return list(self.log)


def group_of(credential: str) -> str:
    """An account's name in the counters: a digest of its key (never the key), "-" for none."""
    return hashlib.sha256(credential.encode()).hexdigest()[:12] if credential else "-"
