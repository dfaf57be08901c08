"""The parts of an answer as a flight carries it: its head, its clean end, where it comes
from, and the one way a listener stops early (its caller left). No I/O here."""

from __future__ import annotations

from dataclasses import dataclass

from app.request.affinity import Routing

# Where an answer comes from (a flight's ``source``): its own upstream call, a stored entry,
# or another process's call it waits for under the cache lease.
UPSTREAM, CACHE, LEASE = "upstream", "cache", "lease"


class ClientGone(Exception):
    """The caller closed its connection; nobody is left to answer."""


@dataclass(frozen=True)
class Head:
    status: int
    headers: list[tuple[str, str]]
    attempts: int
    body: bytes | None  # None: an event stream follows
    upstream: str = ""  # the configured name of the upstream that answered
    # A whole body's usage is an estimate a translation wrote: the upstream reported none
    # (app/upstream/translation.py), so the call is billed its reservation.
    usage_estimated: bool = False
    routing: Routing | None = None  # how its upstreams were ordered (app/upstream/attempts.py)
    # Seconds of the answering attempt spent opening its connection (0.0: one was reused).
    connect_s: float = 0.0


@dataclass(frozen=True)
class Finished:
    leftover: bytes  # bytes of an unterminated last event, if any
    # The stream's usage is an estimate a translation wrote (the upstream reported none).
    usage_estimated: bool = False
