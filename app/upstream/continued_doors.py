"""How a stream is continued in its door's dialect: what reads it back at a cut, what splices a
continuation into it, what asks for the continuation. No I/O here.

A continuation (app/upstream/continuation.py) reads the stream its caller reads, in the
caller's dialect (the translation of another kind's events happens beneath it, each upstream
call its own: app/upstream/translation.py). The route's ``events`` say which:

- chat chunks (``/v1/chat/completions``): app/upstream/transcript.py, app/upstream/splice.py,
  the request edited by app/dialects/continuation.py, tool calls held whole by
  app/upstream/hold.py (``hold_tool_calls``);
- Anthropic's named events (``/v1/messages``): app/upstream/message_splice.py, the request
  edited by app/dialects/continuation_messages.py, tool calls held whole by
  app/upstream/message_hold.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.dialects.continuation import Partial, continued_chat
from app.dialects.continuation_messages import continued_message
from app.request.routes import NAMED, Route
from app.upstream.hold import ToolHold
from app.upstream.message_hold import MessageToolHold
from app.upstream.message_splice import MessageSplice, MessageTranscript
from app.upstream.splice import Before, Splice
from app.upstream.transcript import Transcript


@dataclass(frozen=True)
class Door:
    """How one door's streams are continued (see the module docstring)."""

    transcript: Callable[[], Transcript]
    splice: Callable[[Any, Before, bool, bool], Splice]  # (transcript, before, space, trim)
    request: Callable[[Mapping[str, Any], Partial, str], dict[str, Any]]
    hold: Callable[[bool], ToolHold]  # its tool calls held whole (``hold_tool_calls``)


CHAT_DOOR = Door(Transcript, Splice, continued_chat, ToolHold)
MESSAGES_DOOR = Door(MessageTranscript, MessageSplice, continued_message, MessageToolHold)


def door_of(route: Route) -> Door:
    """How ``route``'s streams are continued."""
    return MESSAGES_DOOR if route.events == NAMED else CHAT_DOOR
