"""A continued stream on the ``/v1/messages`` door: Anthropic's named events read back at a
cut, and a continuation's events as the rest of the caller's one message. No I/O here.

The continuation (app/upstream/continuation.py) reads the door's dialect: what an
``anthropic`` upstream sends as it is, or what the translation of another kind's events
made of them (app/upstream/translation.py). Each upstream call is its own message; the
caller reads one.

``MessageTranscript`` reads what the caller had (the chat door's ``Transcript``, its rules
and its ``blocker``, for named events): the message's id and model (``message_start``), the
text of its text blocks, the blocks begun and the one still open at the cut, whether it
showed thinking (a thinking block), a tool call (a ``tool_use`` block, or any block that is
neither text nor thinking) or its finish (``message_delta``, ``message_stop``). Each
``content_block_delta`` is one output event. Its usage is never whole before the finish
(Anthropic's counts come in ``message_start`` and the final ``message_delta``): the cut
call's is always estimated.

``MessageSplice`` turns each event of the continuation into the next of the caller's:

- its ``message_start`` is dropped (the caller had one: the message keeps its id and model);
- its content blocks go on from the caller's: when the cut was inside a text block and the
  continuation begins with text, that text goes on in the same block (the continuation's
  ``content_block_start`` dropped); when the cut was inside another block, that block is
  ended first; the continuation's block indexes are shifted to follow;
- after a prefill, which could not carry the answer's trailing whitespace, the
  continuation's leading whitespace is dropped (the caller has it already);
- after an instruction to go on, the continuation's repeat of the answer's end is dropped
  (``Trim``, app/upstream/overlap.py: its text is held until the repeat is known, and let
  go of, trimmed, at the first event that is not more of its text);
- its ``message_delta`` carries the usage of every call (docs/streams.md): its
  ``input_tokens`` each call's prompt (the cut calls' estimated as the chat door's are: the
  continuation's less the output events shown), its ``output_tokens`` every output once.
  The continuation's ``message_start`` usage is merged under it: the ``message_delta`` then
  carries the prompt's counts too, and a reader that lays it over ``message_start``'s (the
  gateway's own, the SDKs) has the sum, not the cut call's prompt alone.

The events changed are written anew (compact JSON); the others (``ping``, ``message_stop``,
``error``, anything not a JSON object) pass as they came.
"""

from __future__ import annotations

import json
from typing import Any

from app.request.events import json_object
from app.upstream.splice import Before, Splice, add_usage
from app.upstream.transcript import Transcript
from llmgate_wire import sse

_THINKING = ("thinking", "redacted_thinking")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def named(kind: str, data: dict[str, Any]) -> sse.Event:
    """One of Anthropic's named events, written anew."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    raw = b"event: " + kind.encode() + b"\ndata: " + payload.encode() + b"\n\n"
    return sse.Event(raw, payload, event=kind)


class MessageTranscript(Transcript):
    """The message as its caller read it (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = 0  # content blocks begun: the next one's index
        self.open: tuple[int, str] | None = None  # the block open at the end: index, type

    def _chunk(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start":
            message = _dict(data.get("message"))
            if self.id is None:
                self.id, self.model = message.get("id"), message.get("model")
        elif kind == "content_block_start":
            block = _dict(data.get("content_block"))
            index = _index(data.get("index"))
            index = self.blocks if index is None else index
            self.blocks = max(self.blocks, index + 1)
            what = str(block.get("type"))
            self.open = (index, what)
            if what in _THINKING:
                self.thinking = True
            elif what != "text":
                self.tool_call = True
            elif isinstance(block.get("text"), str) and block["text"]:
                self.text.append(block["text"])
        elif kind == "content_block_delta":
            self._delta(_dict(data.get("delta")))
        elif kind == "content_block_stop":
            if self.open is not None and self.open[0] == _index(data.get("index")):
                self.open = None
        elif kind in ("message_delta", "message_stop"):
            self.finished = True

    def _delta(self, delta: dict[str, Any]) -> None:
        what = delta.get("type")
        if what == "text_delta":
            if isinstance(delta.get("text"), str):
                self.text.append(delta["text"])
        elif what in ("thinking_delta", "signature_delta"):
            self.thinking = True
        elif what == "input_json_delta":
            self.tool_call = True
        else:
            return  # citations and the like: said of the text, not output of their own
        self.outputs += 1


class MessageSplice(Splice):
    """One continuation's events into the caller's message (see the module docstring)."""

    def __init__(
        self,
        transcript: MessageTranscript,
        before: Before,
        relayed_space: bool = False,
        trim: bool = False,
    ):
        super().__init__(transcript, before, relayed_space, trim)
        self.m = transcript
        self._shift: int | None = None  # the continuation's block index to the caller's
        self._started: dict[str, Any] = {}  # the continuation's message_start usage
        self._text_at = 0  # the caller's index of the text block a held text goes in

    def _event(self, event: sse.Event) -> list[sse.Event]:
        data = json_object(event.data)
        kind = data.get("type") if data is not None else None
        if data is None or not isinstance(kind, str):
            return [event]
        if self._trim is not None and self._trim.held and kind not in ("ping", "message_start"):
            delta = _dict(data.get("delta"))
            if kind != "content_block_delta" or delta.get("type") != "text_delta":
                return [*self._let_go(), *self._named(kind, data, event)]
        return self._named(kind, data, event)

    def _named(self, kind: str, data: dict[str, Any], event: sse.Event) -> list[sse.Event]:
        if kind == "message_start":
            self._started = _dict(_dict(data.get("message")).get("usage"))
            return [] if self.m.id is not None else [event]
        if kind == "content_block_start":
            return self._block_start(data)
        if kind in ("content_block_delta", "content_block_stop"):
            return self._in_block(kind, data)
        if kind == "message_delta":
            usage = {**self._started, **_dict(data.get("usage"))}
            data["usage"] = add_usage(self._before(usage), usage)
            return [named(kind, data)]
        return [event]

    def _before(self, continued: dict[str, Any]) -> dict[str, Any]:
        """The cut calls' usage: each one's prompt the continuation's less the output events
        shown (its prompt has the answer so far in it), every output event a token."""
        b = self.before
        prompt = _index(continued.get("input_tokens"))
        each = max(0, prompt - b.outputs) if prompt is not None else 0
        return {"input_tokens": each * b.calls, "output_tokens": b.outputs}

    def _first(self, index: int, text: bool) -> tuple[list[sse.Event], bool]:
        """Where the continuation's first block goes: the caller's open text block (True:
        its start is dropped), else the next block, after the one open, ended."""
        opened, out = self.m.open, list[sse.Event]()
        if opened is not None and opened[1] == "text" and text:
            self._shift = opened[0] - index
            return out, True
        if opened is not None:
            stop = {"type": "content_block_stop", "index": opened[0]}
            out.append(named("content_block_stop", stop))
        self._shift = self.m.blocks - index
        return out, False

    def _block_start(self, data: dict[str, Any]) -> list[sse.Event]:
        index = _index(data.get("index")) or 0
        block = _dict(data.get("content_block"))
        out: list[sse.Event] = []
        if self._shift is None:
            out, merged = self._first(index, block.get("type") == "text")
            if merged:
                return out
        data["index"] = index + (self._shift or 0)
        return [*out, named("content_block_start", data)]

    def _in_block(self, kind: str, data: dict[str, Any]) -> list[sse.Event]:
        index = _index(data.get("index")) or 0
        out: list[sse.Event] = []
        if self._shift is None:  # a block that did not start: taken for the open one's
            out, _ = self._first(index, True)
        delta = _dict(data.get("delta"))
        data["index"] = index + (self._shift or 0)
        if self._skip_space and delta.get("type") == "text_delta":
            text = str(delta.get("text") or "").lstrip()
            delta["text"], self._skip_space = text, not text
            if not text:
                return out
        if self._trim is not None and not self._trim.done and delta.get("type") == "text_delta":
            self._text_at = data["index"]
            delta["text"] = self._trim.feed(str(delta.get("text") or ""))
            if not delta["text"]:
                return out  # held: it may yet be the start of a repeat
        return [*out, named(kind, data)]

    def _let_go(self) -> list[sse.Event]:
        """The held start of an instructed continuation's text, trimmed of its repeat of
        the answer, let go of as the stream says something else."""
        assert self._trim is not None
        text = self._trim.feed("", end=True)
        if not text:
            return []
        delta = {"type": "text_delta", "text": text}
        data = {"type": "content_block_delta", "index": self._text_at, "delta": delta}
        return [named("content_block_delta", data)]
