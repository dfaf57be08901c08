"""A stored answer and its byte format. No I/O here.

An entry is one complete, successful answer: either the JSON body of a non-stream call or the
raw SSE events of a stream (replayed byte-faithfully, `[DONE]` included), with the moment it
was stored (for `Age` and `s-maxage`) and how long the upstream took to make it. Stored as
zlib-compressed JSON behind a magic prefix: never pickle, and anything unreadable is a miss.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

MAGIC = b"LGE1"
T = TypeVar("T")


class EntryError(ValueError):
    """Bytes that are not an entry of this version: the caller treats them as a miss."""


@dataclass(frozen=True)
class Entry:
    created: float  # Unix time it was stored
    compute_s: float  # upstream time it took to produce
    ttl: int  # seconds it may be served: enforced on read, whatever level holds a copy
    status: int
    content_type: str
    body: bytes | None = None  # a non-stream answer
    events: tuple[bytes, ...] | None = None  # a stream's raw events, [DONE] last
    # What serving it made from it (app/cache/replay.py), by form: an entry never changes,
    # and the store keeps the hottest ones decoded for their next hits (app/cache/store.py).
    _made: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.body is None) == (self.events is None):
            raise EntryError("an entry holds either a body or events")

    @property
    def is_stream(self) -> bool:
        return self.events is not None

    @property
    def size(self) -> int:
        """Bytes of the answer it holds (decoded)."""
        return len(self.body) if self.body is not None else sum(map(len, self.events or ()))

    def made(self, form: Hashable, make: Callable[[], T], keep: Callable[[T], bool]) -> T:
        """What ``make()`` returns, called only the first time this entry is asked for
        ``form`` when ``keep`` says to keep what it made (a ``make`` that raises, or a value
        not kept, is made again next time)."""
        try:
            return self._made[form]
        except KeyError:
            value = make()
            if keep(value):
                self._made[form] = value
            return value

    def age(self, now: float) -> float:
        return max(0.0, now - self.created)

    def expired(self, now: float) -> bool:
        return self.age(now) >= self.ttl

    def to_bytes(self) -> bytes:
        doc = {
            "created": self.created,
            "compute_s": self.compute_s,
            "ttl": self.ttl,
            "status": self.status,
            "content_type": self.content_type,
            "body": None if self.body is None else self.body.decode("utf-8"),
            "events": None if self.events is None else [e.decode("utf-8") for e in self.events],
        }
        raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        return MAGIC + zlib.compress(raw, 6)

    @classmethod
    def from_bytes(cls, data: bytes) -> Entry:
        if not data.startswith(MAGIC):
            raise EntryError("not an llmgate entry")
        try:
            doc = json.loads(zlib.decompress(data[len(MAGIC) :]))
            body, events = doc["body"], doc["events"]
            return cls(
                created=float(doc["created"]),
                compute_s=float(doc["compute_s"]),
                ttl=int(doc["ttl"]),
                status=int(doc["status"]),
                content_type=str(doc["content_type"]),
                body=None if body is None else body.encode("utf-8"),
                events=None if events is None else tuple(e.encode("utf-8") for e in events),
            )
        except (zlib.error, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EntryError(f"unreadable entry: {exc}") from None
