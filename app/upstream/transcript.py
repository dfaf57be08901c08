"""What a chat stream showed its caller so far, read back from its events when it is cut. No
I/O here.

A stream that may be continued (app/upstream/continuation.py) keeps the events it relayed, a
reference each, and reads them here only once it breaks (or, for a very long stream, in
steps: ``Transcript.read``): nothing is parsed while a stream goes well. It reads the caller's
dialect, Chat Completions chunks (the chat door's).

What it learns: the answer's text so far; its identity (the stream's ``id``, ``created`` and
model); how far it got (the output events it showed, whether it showed thinking, a tool call
or its finish, whether it has choices beyond the first); and the usage the upstream reported
on the way, if any. ``blocker`` says why the answer cannot be continued, if it cannot.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.request.events import json_object
from llmgate_wire import sse

# Why an answer cannot be continued (the ``outcome`` of llmgate_stream_continuations_total).
THINKING, TOOL_CALL, FINISHED, CHOICES = "thinking", "tool_call", "finished", "choices"


class Transcript:
    """The answer as a caller read it: ``read`` each relayed event once, in order."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.shown = 0  # events that carried data (comments are not counted)
        self.outputs = 0  # events that carried output (text, thinking, tool arguments)
        self.thinking = self.tool_call = self.finished = self.choices = False
        self.usage: dict[str, Any] | None = None  # the latest the upstream reported
        self.usage_at = -1  # the output events shown when it was (all of them: it is whole)
        self.id: Any = None
        self.created: Any = None
        self.model: Any = None

    @property
    def answer(self) -> str:
        return "".join(self.text)

    @property
    def blocker(self) -> str | None:
        """Why the answer cannot be continued (None: it can): it has several choices, or it
        showed its finish, thinking (which a continuation cannot carry on) or a tool call
        (the caller has part of one, or a whole call the model would have to answer)."""
        for why, shown in (
            (CHOICES, self.choices),
            (FINISHED, self.finished),
            (THINKING, self.thinking),
            (TOOL_CALL, self.tool_call),
        ):
            if shown:
                return why
        return None

    def read(self, events: Iterable[sse.Event]) -> None:
        for event in events:
            if event.data is None:
                continue
            self.shown += 1
            if event.data == sse.DONE:
                continue
            data = json_object(event.data)
            if data is not None:
                self._chunk(data)

    def _chunk(self, data: dict[str, Any]) -> None:
        if self.id is None:
            self.id, self.created = data.get("id"), data.get("created")
            self.model = data.get("model")
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.choices = True
                continue
            if choice.get("finish_reason") is not None:
                self.finished = True
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta)
        usage = data.get("usage")
        if isinstance(usage, dict):  # after its own output: a running usage counts it
            self.usage, self.usage_at = usage, self.outputs

    def _delta(self, delta: dict[str, Any]) -> None:
        output = False
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            output = True
        if delta.get("reasoning_content") or delta.get("reasoning") or delta.get("thinking_blocks"):
            self.thinking = output = True
        if delta.get("tool_calls") or delta.get("function_call"):
            self.tool_call = output = True
        if delta.get("refusal"):
            self.finished = output = True  # a refusal is not an answer to write on
        self.outputs += output
