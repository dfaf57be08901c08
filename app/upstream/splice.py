"""A continuation's events as the rest of the chat stream its caller is reading. No I/O here.

A continuation (app/upstream/continuation.py) is another upstream call, with its own message:
its own id, its own opening role chunk, its own usage. ``Splice`` turns each of its chunks into
the next chunk of the caller's one stream:

- each keeps the cut stream's ``id``, ``created`` and ``model``;
- the role chunk that opens the continuation is dropped (the caller had one), and so is any
  chunk left with nothing to say;
- after a prefill, which could not carry the answer's trailing whitespace, the
  continuation's leading whitespace is dropped (the caller has it already);
- after an instruction to go on, the continuation's repeat of the answer's end is dropped
  (``Trim``, app/upstream/overlap.py: its text is held until the repeat is known);
- the usage is the sum of every upstream call's (docs/streams.md): each usage the
  continuation reports, plus the cut calls' (``Before``).

The chunks are written anew (compact JSON), not relayed byte for byte: they are not the
upstream's. An event that is not a JSON object passes as it came.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.request.events import json_object
from app.upstream.overlap import Trim
from app.upstream.transcript import Transcript
from llmgate_wire import sse


def add_usage(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two usage objects summed: their counts added, member by member (nested ones too);
    a member only one has is kept as it is."""
    out = dict(a)
    for name, value in b.items():
        mine = out.get(name)
        if isinstance(value, dict) and isinstance(mine, dict):
            out[name] = add_usage(mine, value)
        elif _count(value) and _count(mine):
            out[name] = mine + value
        elif mine is None:
            out[name] = value
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Before:
    """The usage of the upstream calls cut before this continuation, for the sum: what the
    stream reported when it reported it whole (``known``: a running usage on its last
    output chunk), else an estimate made from the continuation's own usage: one output
    token per output chunk shown, and each cut call's prompt the continuation's less the
    answer so far (the continuation sent the prompt again, with that answer in it)."""

    calls: int  # upstream calls cut so far
    outputs: int  # the output chunks the caller was shown
    known: Mapping[str, Any] | None = None

    @property
    def estimated(self) -> bool:
        return self.known is None

    def of(self, continued: Mapping[str, Any]) -> dict[str, Any]:
        """The cut calls' usage, beside the continuation's ``continued``."""
        if self.known is not None:
            return dict(self.known)
        prompt = continued.get("prompt_tokens")
        each = max(0, prompt - self.outputs) if isinstance(prompt, int) and _count(prompt) else 0
        tokens = each * self.calls
        return {
            "prompt_tokens": tokens,
            "completion_tokens": self.outputs,
            "total_tokens": tokens + self.outputs,
        }


class Splice:
    """One continuation's chunks into the caller's stream (see the module docstring)."""

    def __init__(
        self,
        transcript: Transcript,
        before: Before,
        relayed_space: bool = False,
        trim: bool = False,
    ):
        self.t = transcript
        self.before = before
        # The answer so far ended in whitespace a prefill left out: the continuation's own
        # leading whitespace is not relayed (until its first other character).
        self._skip_space = relayed_space
        # The continuation was asked by an instruction: its repeat of the answer is not.
        self._trim = Trim(transcript.answer) if trim else None

    def events(self, batch: list[sse.Event]) -> list[sse.Event]:
        out: list[sse.Event] = []
        for event in batch:
            out += self._event(event)
        return out

    def _event(self, event: sse.Event) -> list[sse.Event]:
        if event.data == sse.DONE and self._trim is not None and self._trim.held:
            return [*self._rest(self._trim.feed("", end=True)), event]  # no finish came
        if event.data is None or event.data == sse.DONE:
            return [event]
        data = json_object(event.data)
        if data is None:
            return [event]
        chunk = self._chunk(data)
        return [] if chunk is None else [_written(chunk)]

    def _rest(self, text: str) -> list[sse.Event]:
        """A chunk of its own for held ``text`` let go of at the end."""
        t, choice = self.t, {"index": 0, "delta": {"content": text}, "finish_reason": None}
        chunk = {"id": t.id, "object": "chat.completion.chunk", "created": t.created}
        return [_written({**chunk, "model": t.model, "choices": [choice]})] if text else []

    def _chunk(self, data: dict[str, Any]) -> dict[str, Any] | None:
        t = self.t
        for name, value in (("id", t.id), ("created", t.created), ("model", t.model)):
            if value is not None and name in data:
                data[name] = value
        if isinstance(data.get("usage"), dict):
            data["usage"] = add_usage(self.before.of(data["usage"]), data["usage"])
        choices = data.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return data
        delta.pop("role", None)
        content = delta.get("content")
        if self._skip_space and isinstance(content, str) and content:
            delta["content"] = content = content.lstrip()
            self._skip_space = not content
        if self._trim is not None and not self._trim.done:
            said = content if isinstance(content, str) else ""
            ends = choice.get("finish_reason") is not None or data.get("usage") is not None
            ends = ends or any(name != "content" for name in delta)  # a call, thinking...
            content = self._trim.feed(said, end=ends)
            if content or "content" in delta:
                delta["content"] = content
        if content == "":
            del delta["content"]
        if delta or choice.get("finish_reason") is not None or data.get("usage") is not None:
            return data
        return None  # nothing left of it: the role chunk


def _written(chunk: dict[str, Any]) -> sse.Event:
    payload = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
    return sse.Event(b"data: " + payload.encode() + b"\n\n", payload)
