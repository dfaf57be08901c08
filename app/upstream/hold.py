"""A stream's tool calls held until they are whole, so a cut never shows the caller half a
call. No I/O here.

The rule: with ``hold_tool_calls`` (the upstream's, in the upstreams file) a chat stream that
may be continued (app/upstream/continuation.py) relays nothing from the first chunk that
carries a tool call until the answer's finish (its first choice's ``finish_reason``, or
``[DONE]``): then the held chunks go, in their order, with the finish. A cut before then
drops them (``drop``): the caller has only the text before the calls, the continuation is
asked to go on from that text, and it writes the calls again, whole. The held calls are
released together at the finish, not each when the next begins: a call relayed whole before
a cut could not be handed back to a continuation (no partial turn carries a tool call), so
the calls after it could not be continued either.

What passes while calls are held: comments (pings keep the connection alive) and an error
event, which ends the stream (the held part calls are dropped before it: the caller gets
the error, never half a call). Anything else (a malformed event the stream goes on after)
is held with the calls.

What it costs: off, nothing. On, a look for ``"tool_calls"`` or ``"function_call"`` in each
event's data (a substring search; a chunk that has it is parsed), and every held event
parsed once for its finish; the calls reach the caller only when the answer is whole.
"""

from __future__ import annotations

from typing import Any

from app.request.events import is_error_event, json_object
from app.upstream.transcript import Transcript
from llmgate_wire import sse


def _choice(data: str) -> dict[str, Any]:
    """The first choice of a chunk's data ({} when it has none, or is not a chunk)."""
    choices = (json_object(data) or {}).get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) and first.get("index", 0) == 0 else {}


def _opens(data: str) -> bool:
    """Whether a chunk carries (part of) a tool call."""
    if '"tool_calls"' not in data and '"function_call"' not in data:
        return False
    delta = _choice(data).get("delta")
    return isinstance(delta, dict) and bool(delta.get("tool_calls") or delta.get("function_call"))


def _closes(data: str) -> bool:
    """Whether a chunk ends the answer: ``[DONE]``, or its first choice's finish."""
    return data == sse.DONE or _choice(data).get("finish_reason") is not None


class ToolHold:
    """One stream's held tool calls (see the module docstring); ``on`` False: it holds none."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.held: list[sse.Event] = []

    def take(self, batch: list[sse.Event]) -> list[sse.Event]:
        """What of a read's events goes to the caller now (the rest is held)."""
        if not self.on:
            return batch
        out: list[sse.Event] = []
        for event in batch:
            if self._passes(event):
                out.append(event)
            elif self.held:
                if is_error_event(event):
                    self.held = []
                    out.append(event)
                    continue
                self.held.append(event)
                if self._closes(event):
                    out += self.held
                    self.held = []
            elif self._opens(event):
                if self._closes(event):  # a whole call in one chunk, with the finish
                    out.append(event)
                else:
                    self.held.append(event)
            else:
                out.append(event)
        return out

    def drop(self) -> Transcript:
        """The held events let go of (a cut): what they said, read for the usage sum."""
        lost = self._transcript()
        lost.read(self.held)
        self.held = []
        return lost

    # The dialect's: a chat stream's chunks here, Anthropic's named events in
    # app/upstream/message_hold.py.
    _transcript = Transcript

    def _passes(self, event: sse.Event) -> bool:
        """Whether an event goes on while calls are held (a comment)."""
        return event.data is None

    def _opens(self, event: sse.Event) -> bool:
        return _opens(event.data or "")

    def _closes(self, event: sse.Event) -> bool:
        return _closes(event.data or "")
