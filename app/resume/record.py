"""A resumable stream's log as Memcached holds it: a meta item and numbered chunks. No I/O.

The meta item (``log_key``, app/resume/ids.py) says what the stream is: its route, whether
the caller's usage chunk is taken out, the original request's trace context. The events are
in chunks ``<key>:c0``, ``c1``, ...: the writer (app/resume/writer.py) rewrites the last chunk
as events arrive and seals it once it holds ``SEAL_BYTES``, then starts the next, so a
stream of any length is a few items and a reader that found chunk ``i`` sealed knows chunk
``i + 1`` is coming. The last chunk of a stream that ended carries the end.

    chunk  := state record*  end?
    state  := b"o" (open: more may be added) | b"s" (sealed) | b"e" (ended: the end follows)
    record := b"<length>\\n" raw-event-bytes
    end    := b"!<length>\\n" JSON: {"kind": "finished", "leftover": "..."}
              | {"kind": "error", "status": 502, "error": {OpenAI error object}}
              | {"kind": "overflow"}  (the log outgrew its budget: no events after these)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.core.errors import GatewayError
from app.request.routes import BY_NAME, Route
from app.streams.answer import Finished

SEAL_BYTES = 32 * 1024
OPEN, SEALED, ENDED = b"o", b"s", b"e"
FINISHED, ERROR, OVERFLOW = "finished", "error", "overflow"


class Overflow(GatewayError):
    """The stream outgrew its resumable log: a resume cannot give the events past it."""

    status = 502
    type = "server_error"
    code = "resume_log_overflow"


class LogFault(GatewayError):
    """The log stopped growing before its stream's end could be read (its writer's worker
    stopped, or Memcached lost it)."""

    status = 502
    type = "server_error"
    code = "resume_log_lost"


@dataclass(frozen=True)
class Meta:
    route: Route  # kept by its name (app/request/routes.py)
    hide_usage: bool
    traceparent: str | None = None

    def encode(self) -> bytes:
        doc = {"route": self.route.name, "hide_usage": self.hide_usage, "tp": self.traceparent}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Meta | None:
        try:
            doc = json.loads(data)
            route, hide, tp = doc["route"], doc["hide_usage"], doc.get("tp")
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(route, str) or route not in BY_NAME or not isinstance(hide, bool):
            return None
        return cls(BY_NAME[route], hide, tp if isinstance(tp, str) else None)


def encode_chunk(events: list[bytes], state: bytes, end: dict[str, Any] | None = None) -> bytes:
    parts = [state]
    for raw in events:
        parts += [b"%d\n" % len(raw), raw]
    if end is not None:
        doc = json.dumps(end, separators=(",", ":")).encode()
        parts += [b"!%d\n" % len(doc), doc]
    return b"".join(parts)


@dataclass(frozen=True)
class Chunk:
    state: bytes
    events: list[bytes]
    end: Finished | GatewayError | None


def decode_chunk(data: bytes) -> Chunk | None:
    """The chunk, or None when the bytes are not one (a reader treats it as lost)."""
    state, at, events = data[:1], 1, []
    end: Finished | GatewayError | None = None
    if state not in (OPEN, SEALED, ENDED):
        return None
    while at < len(data):
        is_end = data[at : at + 1] == b"!"
        line_end = data.find(b"\n", at)
        digits = data[at + is_end : line_end]
        if line_end < 0 or not digits.isdigit():
            return None
        start, at = line_end + 1, line_end + 1 + int(digits)
        if at > len(data):
            return None
        if is_end:
            end = end_of(data[start:at])
            if end is None or at != len(data):
                return None
        else:
            events.append(data[start:at])
    if (state == ENDED) != (end is not None):
        return None
    return Chunk(state, events, end)


def end_record(end: Finished | GatewayError | None) -> dict[str, Any]:
    """The end as the log keeps it (None: the log outgrew its budget)."""
    if end is None:
        return {"kind": OVERFLOW}
    if isinstance(end, Finished):
        return {"kind": FINISHED, "leftover": end.leftover.decode("utf-8", "replace")}
    return {"kind": ERROR, "status": end.status, "error": end.to_body()["error"]}


def end_of(data: bytes) -> Finished | GatewayError | None:
    try:
        doc = json.loads(data)
        kind = doc["kind"]
    except (ValueError, KeyError, TypeError):
        return None
    if kind == FINISHED and isinstance(doc.get("leftover"), str):
        return Finished(doc["leftover"].encode())
    if kind == OVERFLOW:
        return Overflow(
            "The stream outgrew its resumable log (LLMGATE_RESUME_STREAM_BYTES); "
            "the events after these cannot be resumed."
        )
    if kind == ERROR and isinstance(doc.get("error"), dict) and isinstance(doc.get("status"), int):
        return _stored_error(doc["status"], doc["error"])
    return None


def _stored_error(status: int, error: dict[str, Any]) -> GatewayError:
    """The error the stream ended with, as it was: its status, message, type and code."""
    message = error.get("message")
    code, param = error.get("code"), error.get("param")
    return GatewayError(
        str(message) if message is not None else "",
        status=status,
        type=str(error.get("type") or "server_error"),
        code=code if isinstance(code, str) else None,
        param=param if isinstance(param, str) else None,
    )
