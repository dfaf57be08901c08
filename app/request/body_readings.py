"""What a request body's bytes decide, kept for the next identical request in this worker.

A call's plan (app/gateway.py) starts by reading its body: the JSON parsed within its limits,
its schema checked, the model's upstreams asked whether they serve it, the gateway's own
``cache`` object taken out of the bytes that go on. None of that depends on who sends the
bytes, or when: the route, the path and the bytes decide it, with the worker's settings and
upstreams, which do not change while it runs. So a body read once is not read again while
it is among the last ones read (``BodyReadings``): a repeat, the case a cache hit is made of,
starts from the same ``BodyReading``. The gateway keeps the readings of the calls its cache
may serve, and only those: without a cache the same bytes again are rare. What does depend
on the caller (its key, its grant, its tenant, its headers) is decided for each call, as
before, after the reading; the cache's plans made of a reading are kept on it by what else
decided them (app/cache/plan.py).

Only a body read whole and without error is kept: a refused one is refused again, each time
in full. A ``BodyReading`` is shared by every call that read the same bytes, so nothing may edit
its ``body`` (the plan's stages read it; translations build their own documents).

Bounded by count and by the bytes of the bodies kept; the oldest goes first. A body larger
than ``max_body`` is read each time: a large body is rarely repeated, and its parse is
small beside the call it asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.core.config import Settings
from app.request import jsonedit, schema
from app.request.routes import Route

# The defaults: about a megabyte of raw bodies a worker (and their parsed documents).
MAX_READINGS = 256
MAX_READING_BYTES = 1 << 20
MAX_BODY_KEPT = 64 << 10


@dataclass(eq=False)
class BodyReading:
    """One body as a route reads it: the validated document (read-only: shared), the bytes
    that go upstream, whether it asks for a stream; and what the cache made of it
    (app/cache/plan.py): its canonical form, and its plans by what else decides them (the
    query, the Cache-Control values, the tenant: no credential, the tenant is a hash)."""

    body: dict[str, Any]
    forward: bytes
    stream: bool
    canonical: bytes | None = None
    cache_plans: dict[tuple[str, tuple[str, ...], str], Any] = field(default_factory=dict)


def read_body(
    raw: bytes, route: Route, settings: Settings, serves: Callable[[str | None], None]
) -> BodyReading:
    """``raw`` as ``route`` reads it: parsed within the settings' limits, its schema
    checked, its model's upstreams asked (``serves`` raises when none serves it), the
    gateway's own ``cache`` object taken out of the bytes that go on (it never goes
    upstream). Raises the error the caller is answered with."""
    body = schema.parse_body(
        raw,
        max_depth=settings.max_json_depth,
        max_array_items=settings.max_json_array_items,
        max_containers=settings.max_json_containers,
    )
    schema.validate(route, body)
    serves(schema.model_of(body))
    forward = raw if "cache" not in body else jsonedit.without_member_of(raw, body, "cache")
    return BodyReading(body, forward, schema.wants_stream(body))


class BodyReadings:
    """The last bodies read in this worker, by route, path and bytes."""

    def __init__(
        self,
        max_readings: int = MAX_READINGS,
        max_bytes: int = MAX_READING_BYTES,
        max_body: int = MAX_BODY_KEPT,
    ) -> None:
        self.max_readings = max_readings
        self.max_bytes = max_bytes
        self.max_body = min(max_body, max_bytes)
        self._kept: dict[tuple[Route, str, bytes], BodyReading] = {}  # oldest first
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, route: Route, path: str, raw: bytes) -> BodyReading | None:
        """The reading of ``raw`` on ``route`` at ``path``, if it is among the last kept."""
        return self._kept.get((route, path, raw))

    def keep(self, route: Route, path: str, raw: bytes, reading: BodyReading) -> BodyReading:
        """``reading``, kept for the next identical body when it is small enough; the oldest
        readings go to make room."""
        if len(raw) > self.max_body or self.max_readings <= 0:
            return reading
        key = (route, path, raw)
        if key in self._kept:
            return self._kept[key]  # the first kept stays, and its bytes count once
        self._kept[key] = reading
        self._bytes += len(raw)
        while len(self._kept) > self.max_readings or self._bytes > self.max_bytes:
            oldest = next(iter(self._kept))
            del self._kept[oldest]
            self._bytes -= len(oldest[2])
        return reading
