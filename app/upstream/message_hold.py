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

from app.request.events import json_object
from app.upstream.hold import ToolHold
from app.upstream.message_splice import MessageTranscript
from llmgate_wire import sse

_NOT_CALLS = ("text", "thinking", "redacted_thinking")


def _opens(event: sse.Event) -> bool:
    """Whether an event begins a tool call's block."""
    if event.event != "content_block_start":
        return False
    block = (json_object(event.data) or {}).get("content_block")
    return isinstance(block, dict) and block.get("type") not in _NOT_CALLS


class MessageToolHold(ToolHold):
    """One message stream's held tool calls (see the module docstring); ``on`` False: it
    holds none."""

    _transcript = MessageTranscript

    def _passes(self, event: sse.Event) -> bool:
        return event.data is None or event.event == "ping"

    def _opens(self, event: sse.Event) -> bool:
        return _opens(event)

    def _closes(self, event: sse.Event) -> bool:
        return event.event in ("message_delta", "message_stop")
