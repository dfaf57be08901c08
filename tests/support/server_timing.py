"""Reading the gateway's Server-Timing (app/request/stages.py): the header's stages, and a
stream's comment line with its relay time (at the head of its end event's block, or a
block of its own after its last bytes when it has none: app/edge/finish.py), which tests
that compare a stream's bytes take off first (it differs from one answer to the next by
design, as the header does)."""

from __future__ import annotations

import re

# A stream's relay comment: ``: server-timing: relay;dur=<ms>, relay-max;dur=<ms>``.
RELAY_COMMENT = re.compile(rb": server-timing: relay;dur=([0-9.]+), relay-max;dur=([0-9.]+)\n\n?")


def stages(value: str) -> dict[str, float]:
    """A Server-Timing value's metrics, by name, in ms (a metric without ``dur`` is 0)."""
    found: dict[str, float] = {}
    for metric in value.split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        durations = [float(p[4:]) for p in params if p.startswith("dur=")]
        found[name] = durations[0] if durations else 0.0
    return found


def relay_of(body: bytes) -> tuple[bytes, dict[str, float] | None]:
    """A stream's bytes without its relay comment, and the comment's figures in ms (None:
    the stream has none). A stream says it once."""
    found = list(RELAY_COMMENT.finditer(body))
    if not found:
        return body, None
    assert len(found) == 1, f"{len(found)} relay comments in one stream"
    match = found[0]
    relay = {"relay": float(match.group(1)), "relay-max": float(match.group(2))}
    return body[: match.start()] + body[match.end() :], relay
