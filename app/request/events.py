"""What a route's stream means: how it ends, which events are output or errors. No I/O.

Chat and legacy completions streams are ``data:`` chunks ending with ``data: [DONE]``. An
Anthropic Messages stream (the /v1/messages door) is named events ending with
``message_stop`` (or an ``error`` event). A
Responses API stream is typed events (``event: response.output_text.delta`` plus a ``data:``
object repeating its ``type``) ending with a terminal event and no ``[DONE]``:
``response.completed``, ``response.incomplete``, ``response.failed``, or ``error``. Only
``response.completed`` is a complete, successful answer (the one a cache may keep); its
``response`` object is what the non-stream call returns.

The byte-level helpers (``event_type``, ``is_output_delta``) look only at an event's first
bytes: the metrics see every event of every stream, and must not parse each one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from llmgate_wire import sse

COMPLETED = "response.completed"
TERMINAL_TYPES = frozenset({COMPLETED, "response.incomplete", "response.failed", "error"})
# The events that carry generated output: time to first token is the first of these.
OUTPUT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.audio.delta",
        "response.audio.transcript.delta",
        "response.code_interpreter_call_code.delta",
        "response.mcp_call_arguments.delta",
    }
)
_PEEK = 256  # an event's name or type is within its first bytes
_EVENT_LINE = re.compile(rb"(?:^|[\r\n])event: ?([^\r\n]*)")
_TYPE_FIELD = re.compile(rb'^data: ?\{\s*"type"\s*:\s*"([^"\\]+)"', re.M)


@dataclass(frozen=True)
class StreamEnd:
    """How a route's stream says it is complete; ``expected`` names it in errors."""

    expected: str
    ends: Callable[[sse.Event], bool]


def json_object(data: str | None) -> dict[str, Any] | None:
    """An event's data as a JSON object; None when it has none, is not JSON, or is JSON but
    not an object (``[DONE]``, a number, a list)."""
    if data is None:
        return None
    try:
        found = json.loads(data)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def typed(event: sse.Event) -> str | None:
    """A Responses event's type: its ``event:`` field, else the ``type`` in its data."""
    if event.event not in (None, "message"):
        return event.event
    if event.data is None or '"type"' not in event.data[:_PEEK]:
        return None
    kind = (json_object(event.data) or {}).get("type")
    return kind if isinstance(kind, str) else None


DONE = StreamEnd("[DONE]", lambda event: event.data == sse.DONE)  # ``is_done``, inlined
TERMINAL = StreamEnd(
    "a terminal response event (response.completed, .incomplete, .failed or error)",
    lambda event: typed(event) in TERMINAL_TYPES,
)
MESSAGE_STOP = StreamEnd("message_stop", lambda event: event.event == "message_stop")


def completed_ok(events: list[sse.Event]) -> bool:
    """The stream ended as a complete answer: ``[DONE]`` last, ``response.completed``, or
    an Anthropic Messages stream's ``message_stop``."""
    last = next((e for e in reversed(events) if not e.is_comment), None)
    if last is None:
        return False
    return last.is_done or last.event == "message_stop" or typed(last) == COMPLETED


def completed_response(stored: Iterable[bytes]) -> dict[str, Any]:
    """The ``response`` object of a stored stream's ``response.completed`` event: what the
    non-stream call answers. ValueError when the stream has none."""
    decoder = sse.Decoder()
    for event in (event for raw in stored for event in decoder.feed(raw)):
        if typed(event) == COMPLETED:
            response = event.json().get("response")
            if isinstance(response, dict) and response.get("status") == "completed":
                return response
    raise ValueError("the stream has no response.completed event")


# --- bytes, for the metrics -------------------------------------------------------------------


def event_type(raw: bytes) -> str | None:
    """The type of the event whose raw bytes are ``raw``, from its first bytes only."""
    head = raw[:_PEEK]
    match = _EVENT_LINE.search(head) or _TYPE_FIELD.search(head)
    if match is None:
        return None
    return match.group(1).strip().decode("utf-8", "replace")


def is_output_delta(raw: bytes) -> bool:
    return b".delta" in raw[:_PEEK] and event_type(raw) in OUTPUT_DELTAS


def data_of(raw: bytes) -> Any:
    """The JSON of an event's ``data:`` lines (None when it has none or it is not JSON)."""
    try:
        for event in sse.Decoder().feed(raw if raw.endswith(b"\n\n") else raw + b"\n\n"):
            return event.json()
    except ValueError:
        return None
    return None


def malformed_chunk(data: str | None) -> bool:
    """Whether an event's data cannot be a chat chunk: it is neither ``[DONE]`` nor a JSON
    object's text, judged by its first and last characters only (no parse: each event of a
    stream that may be continued is looked at, app/upstream/continuation.py). A garbled or
    cut-short chunk, plain text, an array or a string are; an object that is not JSON
    inside its braces is not (it is read only at a cut, app/upstream/transcript.py), nor
    an empty one (a keep-alive)."""
    if not data:
        return False
    text = data.strip()
    return text != sse.DONE and not (text[:1] == "{" and text[-1:] == "}")


def is_error_event(event: sse.Event) -> bool:
    """An error event: named ``error``, or a data object whose ``error`` is an object (how
    OpenAI-compatible servers end a stream that failed)."""
    if event.event == "error":
        return True
    if not event.data or '"error"' not in event.data[:32]:
        return False
    try:
        return isinstance(event.json().get("error"), dict)
    except (ValueError, AttributeError):
        return False
