"""A ``/v1/messages`` stream's tool calls held until the message's finish, so a cut never
shows the caller half a call: app/upstream/hold.py's rule, for Anthropic's named events. No
I/O here.

With ``hold_tool_calls`` (the upstream's, in the upstreams file), a message stream that may
be continued relays nothing from the ``content_block_start`` of a block that is neither text
nor thinking (a ``tool_use`` block, or another tool's) until the message's finish (its
``message_delta``): then the held events go, in their order, with it. A cut before then drops
them (``drop``): the caller has the text before the calls, whose block the translation or
the provider ended already, and the continuation writes the calls again, whole, as the
blocks after it (app/upstream/message_splice.py). The calls are held together until the
finish, as on the chat door, for the same reason: a call shown whole before a cut could not
be handed back to the continuation.

What passes while calls are held: comments and ``ping`` events (the connection kept alive),
and an ``error`` event, which ends the stream (the held part dropped before it). Anything
else is held with the calls.

What it costs: off, nothing. On, a look at each event's name, and each block start's data
parsed for its block's type.
"""

from __future__ import annotations

import json

from app.request.events import is_error_event
from app.upstream.hold import ToolHold
from app.upstream.message_splice import MessageTranscript
from app.upstream.transcript import Transcript
from llmgate_wire import sse

_NOT_CALLS = ("text", "thinking", "redacted_thinking")


def _opens(event: sse.Event) -> bool:
    """Whether an event begins a tool call's block."""
    if event.event != "content_block_start" or event.data is None:
        return False
    try:
        data = json.loads(event.data)
    except ValueError:
        return False
    block = data.get("content_block") if isinstance(data, dict) else None
    return isinstance(block, dict) and block.get("type") not in _NOT_CALLS


class MessageToolHold(ToolHold):
    """One message stream's held tool calls (see the module docstring); ``on`` False: it
    holds none."""

    def take(self, batch: list[sse.Event]) -> list[sse.Event]:
        if not self.on:
            return batch
        out: list[sse.Event] = []
        for event in batch:
            if event.data is None or event.event == "ping":
                out.append(event)
            elif self.held:
                if is_error_event(event):
                    self.held = []
                    out.append(event)
                    continue
                self.held.append(event)
                if event.event in ("message_delta", "message_stop"):
                    out += self.held
                    self.held = []
            elif _opens(event):
                self.held.append(event)
            else:
                out.append(event)
        return out

    def drop(self) -> Transcript:
        lost = MessageTranscript()
        lost.read(self.held)
        self.held = []
        return lost
