"""A Chat Completions stream as an Anthropic Messages stream (the ``/v1/messages`` door over
an OpenAI upstream). No I/O here: bytes in, bytes out, each Anthropic event in the
``feed()`` that completes the chunk it comes from.

The chunks come in the canonical shape of chat.py's docstring, and may also hold SSE
comments (the gateway's heartbeats), ``usage: null`` members, several fields in one delta and
the fragments of several tool calls interleaved. Each becomes Anthropic's named events
(``event: <type>`` and ``data: {"type": <type>, ...}``):

- the first chunk: ``message_start`` (the chunk's model, else the one given; the usage the
  prompt's estimate, to be corrected by ``message_delta``);
- ``reasoning_content`` (or ``reasoning``, as some servers name it): a thinking block's
  ``thinking_delta``; a ``thinking_blocks`` signature its ``signature_delta``, which ends the
  block (a signature is a thinking block's last member); a redacted thinking block whole;
- ``content`` (and OpenAI's ``refusal`` text): a text block's ``text_delta``;
- each new tool call index: a ``tool_use`` block, then its fragments as ``input_json_delta``.
  A text or thinking block ends when a block of another kind begins; tool_use blocks stay
  open to the finish, since their fragments may interleave, and Anthropic's blocks are told
  apart by index, so several open at once are still read right;
- the finish reason ends every open block (in index order) and is kept for the
  ``message_delta`` (answer_to_anthropic.stop_reason); a chunk's ``usage`` is kept, the latest
  replacing the one before (the counts are cumulative: some servers put them on every
  chunk, most on a last chunk of their own); ``[DONE]`` is the one ``message_delta``, after
  every block ended, with the stop reason and the latest usage (answer_to_anthropic.usage), then
  ``message_stop``. With no usage from the upstream (a server that ignores
  ``stream_options.include_usage``) the ``message_delta`` carries estimates: the prompt's
  as given, and the output's a quarter of the bytes of text, thinking and tool arguments
  relayed, rounded up (the rule the prompt's estimate follows); ``usage_reported`` says
  which it was;
- a comment is a ``ping``; an error event is Anthropic's ``error`` event, and the stream's
  end: nothing is written after it.

A thinking text sent twice in one delta, as ``reasoning_content`` and inside
``thinking_blocks`` (some servers do), is written once. Events that are none of these
(another JSON, a data that is not JSON) are skipped. ``close()`` writes nothing: a stream
that ended with ``[DONE]`` has already been written whole, and one cut short stays cut (no
``message_stop``), for the caller to see the cut.
"""

from __future__ import annotations

import json
from typing import Any

from app.dialects import chat
from app.dialects.answer_to_anthropic import error_event, stop_reason, stream_error_type, usage
from llmgate_wire import sse

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def event(type: str, **members: Any) -> bytes:
    """One of Anthropic's named events: the name again as the data's ``type``."""
    data = chat.dumps({"type": type, **members})
    return b"event: " + type.encode() + b"\ndata: " + data + b"\n\n"


class ChatToStream:
    """One Chat Completions stream's bytes in (``feed``, any split), the Anthropic Messages
    stream's out."""

    def __init__(self, *, message_id: str, model: str, input_tokens: int) -> None:
        self.message_id, self.model, self.input_tokens = message_id, model, input_tokens
        self._decoder = sse.Decoder()
        self._started = False  # message_start written
        self._ended = False  # message_stop or error written: nothing follows
        self._usage: dict[str, Any] | None = None  # the upstream's latest usage
        self._relayed = 0  # bytes of text, thinking and tool arguments written so far
        self._blocks = 0  # blocks begun: the next one's index
        self._open: tuple[str, int] | None = None  # the open text or thinking block
        self._tools: dict[int, int] = {}  # open tool_use blocks: chat index -> block index
        self._tool_calls = False  # the answer made tool calls
        self._finish: str | None = None

    @property
    def usage_reported(self) -> bool:
        """True once the upstream's own usage came (the final ``message_delta`` carries it);
        False while the output's count is the door's estimate."""
        return self._usage is not None

    def feed(self, data: bytes) -> bytes:
        out = []
        for item in self._decoder.feed(data):
            if not self._ended:
                out.append(self._translate(item))
        return b"".join(out)

    def close(self) -> bytes:
        self._decoder.close()
        return b""

    def _translate(self, item: sse.Event) -> bytes:
        if item.is_comment:
            return PING
        if item.data is None:
            return b""
        if item.is_done:
            return self._done()
        try:
            value = json.loads(item.data)
        except ValueError:
            return b""
        if not isinstance(value, dict):
            return b""
        if "error" in value and "choices" not in value:
            self._ended = True
            error = value["error"]
            message = error.get("message") if isinstance(error, dict) else error
            # The type is given: the status would only name one when it is not.
            return error_event(500, str(message or "The upstream failed"), stream_error_type(error))
        return self._chunk(value)

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        out = [] if self._started else [self._message_start(chunk.get("model"))]
        for choice in _list(chunk.get("choices")):
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # the door asks one choice
            delta = choice.get("delta")
            if isinstance(delta, dict):
                out += self._delta(delta)
            if choice.get("finish_reason"):
                self._finish = str(choice["finish_reason"])
                out.append(self._stop_all())
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]  # cumulative: the latest is the count so far
        return b"".join(out)

    def _message_start(self, model: Any) -> bytes:
        self._started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) and model else self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return event("message_start", message=message)

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        out = []
        reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
        if reasoning:
            out.append(self._thinking(reasoning))
        for block in _list(delta.get("thinking_blocks")):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "redacted_thinking":
                out.append(self._redacted(block.get("data", "")))
            elif block.get("type") == "thinking":
                if not reasoning and _text(block.get("thinking")):
                    out.append(self._thinking(block["thinking"]))
                if _text(block.get("signature")):
                    out.append(self._signature(block["signature"]))
        for name in ("content", "refusal"):
            if _text(delta.get(name)):
                out.append(self._text(delta[name]))
        for call in _list(delta.get("tool_calls")):
            if isinstance(call, dict):
                out.append(self._tool(call))
        return out

    def _begin(self, block: dict[str, Any]) -> tuple[int, bytes]:
        """A new block after the open text or thinking block ends: its index and start."""
        end = self._stop_open()
        index, self._blocks = self._blocks, self._blocks + 1
        return index, end + event("content_block_start", index=index, content_block=block)

    def _into(self, kind: str, block: dict[str, Any]) -> tuple[int, bytes]:
        """The open block of ``kind`` (a text or thinking block), begun when another is."""
        if self._open is not None and self._open[0] == kind:
            return self._open[1], b""
        index, start = self._begin(block)
        self._open = (kind, index)
        return index, start

    def _thinking(self, text: str) -> bytes:
        self._relayed += _size(text)
        index, start = self._into("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        delta = {"type": "thinking_delta", "thinking": text}
        return start + event("content_block_delta", index=index, delta=delta)

    def _signature(self, signature: str) -> bytes:
        index, start = self._into("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        delta = {"type": "signature_delta", "signature": signature}
        return start + event("content_block_delta", index=index, delta=delta) + self._stop_open()

    def _redacted(self, data: Any) -> bytes:
        index, start = self._begin({"type": "redacted_thinking", "data": data})
        return start + event("content_block_stop", index=index)

    def _text(self, text: str) -> bytes:
        self._relayed += _size(text)
        index, start = self._into("text", {"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        return start + event("content_block_delta", index=index, delta=delta)

    def _tool(self, call: dict[str, Any]) -> bytes:
        k = call.get("index")
        k = k if isinstance(k, int) else 0  # one call at a time when a server gives none
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        start = b""
        if k not in self._tools:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"{self.message_id}_{k}",
                "name": function.get("name") or "",
                "input": {},
            }
            self._tools[k], start = self._begin(block)
            self._tool_calls = True
        fragment = _text(function.get("arguments"))
        if not fragment:
            return start
        self._relayed += _size(fragment)
        delta = {"type": "input_json_delta", "partial_json": fragment}
        return start + event("content_block_delta", index=self._tools[k], delta=delta)

    def _stop_open(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open = self._open[1], None
        return event("content_block_stop", index=index)

    def _stop_all(self) -> bytes:
        """Every open block ended, in index order."""
        indexes = sorted(self._tools.values())
        if self._open is not None:
            indexes = sorted([*indexes, self._open[1]])
        self._open, self._tools = None, {}
        return b"".join(event("content_block_stop", index=i) for i in indexes)

    def _done(self) -> bytes:
        """The end: every block ended, the one ``message_delta`` (the stop reason, the
        upstream's latest usage or the estimates), ``message_stop``."""
        out = b"" if self._started else self._message_start(None)
        if self._usage is not None:
            counts = usage(self._usage)
        else:
            counts = {"input_tokens": self.input_tokens, "output_tokens": -(-self._relayed // 4)}
        delta = {"stop_reason": stop_reason(self._finish, self._tool_calls), "stop_sequence": None}
        self._ended = True
        out += self._stop_all() + event("message_delta", delta=delta, usage=counts)
        return out + event("message_stop")


def _text(value: Any) -> str:
    """A delta's string member, "" when it is absent, null or not a string."""
    return value if isinstance(value, str) else ""


def _size(text: str) -> int:
    """The bytes ``text`` takes in UTF-8 (surrogates a JSON escape let in count as theirs)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _list(value: Any) -> list[Any]:
    """A delta's list member, [] when it is absent, null or not a list."""
    return value if isinstance(value, list) else []
