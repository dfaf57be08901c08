"""One cached OpenAI answer, served in either shape. No I/O here: events and dicts in and out.

The rule: whatever shape an answer was stored in, the caller gets the shape it asked for.
A stored stream (its raw SSE events, ``data: [DONE]`` last) assembles into the object the
non-stream API would have returned; a stored non-stream object becomes the chunk events a
stream would have sent; a stored stream is adapted to the caller's
``stream_options.include_usage``. Input that is not a complete, successful answer of the
expected kind raises ``ShapeError``, which the caller treats as a cache miss.

What a round trip normalises (everything else survives exactly):

- ``usage`` is always a key: ``null`` when the stream carried no usage (the non-stream API
  always has the key; we cannot count tokens, so we do not pretend to).
- ``message`` always has ``role``, ``content`` and ``refusal``. Absent text is ``null``;
  ``""`` becomes ``null`` for a refusal, and for content when the message has tool calls, a
  function call or a refusal (what the non-stream API returns). A plain empty answer keeps
  ``content: ""``. ``annotations`` appears only when the stream carried some.
- How text is cut into chunks when a stored object is streamed: ``app.cache.chunks``.

Not converted, so a miss: audio output, non-function (custom) tool calls, delta fields that
are neither text nor known (``ShapeError`` rather than a silently incomplete answer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from llmgate_wire import sse

Json = dict[str, Any]

CHAT = "chat.completion"
CHAT_CHUNK = "chat.completion.chunk"
TEXT = "text_completion"  # legacy /v1/completions: the same object name streamed or not

OPTIONAL_HEADER = ("service_tier", "system_fingerprint")
MESSAGE_KEYS = {"role", "content", "refusal", "tool_calls", "function_call", "annotations"}


class ShapeError(ValueError):
    """Not a complete, successful answer of the expected kind: treat it as a cache miss."""


# --- stream → object ------------------------------------------------------------------------


def assemble_chat(events: Iterable[bytes]) -> dict[str, Any]:
    """The ``chat.completion`` a non-stream request would have got for this stored stream."""
    chunks = _chunks(events, CHAT_CHUNK)
    completion = _header(chunks, CHAT)
    choices = []
    for index, parts in _by_index(chunks).items():
        logprobs = _concat_lists(part.get("logprobs") for part in parts)
        if logprobs is not None:
            logprobs = {"content": None, "refusal": None, **logprobs}
        message = _assemble_message([need_dict(p.get("delta") or {}, "delta") for p in parts])
        choice = {"index": index, "message": message, "logprobs": logprobs}
        choices.append({**choice, "finish_reason": _finish_reason(index, parts)})
    completion["choices"] = choices
    completion["usage"] = _usage(chunks)
    return completion


def assemble_completion(events: Iterable[bytes]) -> dict[str, Any]:
    """The ``text_completion`` a non-stream legacy request would have got for this stream."""
    chunks = _chunks(events, TEXT)
    completion = _header(chunks, TEXT)
    choices = []
    for index, parts in _by_index(chunks).items():
        text = "".join(need_str(part.get("text"), "text") for part in parts)
        choice = {"text": text, "index": index}
        choice["logprobs"] = _concat_lists(part.get("logprobs") for part in parts)
        choices.append({**choice, "finish_reason": _finish_reason(index, parts)})
    completion["choices"] = choices
    completion["usage"] = _usage(chunks)
    return completion


def _chunks(events: Iterable[bytes], kind: str) -> list[Json]:
    """The JSON chunks before ``[DONE]``, each checked to be a ``kind`` chunk."""
    decoder = sse.Decoder()
    chunks: list[Json] = []
    for event in (event for raw in events for event in decoder.feed(raw)):
        if event.is_done:
            break
        if event.data is None:  # a comment (heartbeat) or an id-only event
            continue
        if event.event not in (None, "message"):
            raise ShapeError(f"unexpected {event.event!r} event in the stream")
        try:
            chunk = event.json()
        except ValueError as exc:
            raise ShapeError("event data is not JSON") from exc
        if not isinstance(chunk, dict) or chunk.get("error") is not None:
            raise ShapeError("the stream carries an error or a non-object event")
        if chunk.get("object") != kind or not isinstance(chunk.get("choices"), list):
            raise ShapeError(f"not a {kind} chunk: {chunk.get('object')!r}")
        chunks.append(chunk)
    else:
        raise ShapeError("the stream did not end with data: [DONE]")
    if not chunks:
        raise ShapeError("the stream has no chunks")
    return chunks


def _header(chunks: list[Json], obj: str) -> Json:
    """The first chunk's header; the optional fields take the first non-null value sent."""
    out = header_of(chunks[0], obj)
    for key in OPTIONAL_HEADER:
        values = [chunk[key] for chunk in chunks if key in chunk]
        if values:
            out[key] = next((value for value in values if value is not None), None)
    return out


def header_of(source: Json, obj: str) -> Json:
    """``id``, ``object``, ``created``, ``model`` and the optional header fields present."""
    if any(key not in source for key in ("id", "created", "model")):
        raise ShapeError("id, created or model is missing")
    head = {"id": source["id"], "object": obj, "created": source["created"]}
    head["model"] = source["model"]
    head.update({key: source[key] for key in OPTIONAL_HEADER if key in source})
    return head


def _by_index(chunks: list[Json]) -> dict[int, list[Json]]:
    """Each choice's parts in stream order, choices in index order (n > 1 interleaves)."""
    groups: dict[int, list[Json]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            if not isinstance(choice, dict) or not isinstance(choice.get("index"), int):
                raise ShapeError("a choice without an index")
            groups.setdefault(choice["index"], []).append(choice)
    if not groups:
        raise ShapeError("the stream has no choices")
    return dict(sorted(groups.items()))


def _finish_reason(index: int, parts: list[Json]) -> str:
    reasons = [part["finish_reason"] for part in parts if part.get("finish_reason") is not None]
    if not reasons:
        raise ShapeError(f"choice {index} never finished: a truncated stream")
    return need_str(reasons[-1], "finish_reason")


def _usage(chunks: list[Json]) -> Any:
    """The last non-null usage: the usage chunk, or wherever a compatible server put it."""
    return next((c["usage"] for c in reversed(chunks) if c.get("usage") is not None), None)


def _assemble_message(deltas: list[Json]) -> Json:
    role = "assistant"
    texts: dict[str, list[str]] = {}  # content, refusal, and extra text fields alike
    tools: dict[int, Json] = {}
    function_call: Json | None = None
    annotations: list[Any] | None = None
    for delta in deltas:
        for key, value in delta.items():
            if value is None:
                continue
            if key == "role":
                role = need_str(value, key)
            elif key == "tool_calls":
                _add_tool_calls(tools, value)
            elif key == "function_call":
                function_call = _add_function(function_call or {}, value)
            elif key == "annotations":
                annotations = (annotations or []) + need_list(value, key)
            else:
                texts.setdefault(key, []).append(need_str(value, key))
    joined = {key: "".join(parts) for key, parts in texts.items()}
    content, refusal = joined.pop("content", None), joined.pop("refusal", None) or None
    if content == "" and (tools or function_call or refusal):
        content = None
    message: Json = {"role": role, "content": content, "refusal": refusal, **joined}
    if annotations is not None:
        message["annotations"] = annotations
    if tools:
        missing = [index for index, call in tools.items() if call["id"] is None]
        if missing:
            raise ShapeError(f"tool calls {missing} have no id")
        message["tool_calls"] = [
            {**tools[i], "function": _joined(tools[i]["function"])} for i in sorted(tools)
        ]
    if function_call is not None:
        message["function_call"] = _joined(function_call)
    return message


_TOOL_CALL_KEYS = frozenset({"index", "id", "type", "function"})


def _add_tool_calls(tools: dict[int, Json], deltas: Any) -> None:
    """Merge tool-call fragments by their ``index``: name and arguments concatenate."""
    for delta in need_list(deltas, "tool_calls"):
        if not isinstance(delta, dict) or not isinstance(delta.get("index"), int):
            raise ShapeError("a tool call delta without an index")
        index = delta["index"]
        call = tools.setdefault(index, {"id": None, "type": "function", "function": {}})
        if call["id"] is None and delta.get("id") is not None:
            call["id"] = need_str(delta["id"], "tool call id")
        if delta.get("type") is not None:
            call["type"] = need_str(delta["type"], "tool call type")
            if call["type"] != "function":  # a custom tool call carries no `function`
                raise ShapeError(
                    f"tool call {index} is a {call['type']!r} call, not a function call"
                )
        extra = sorted(k for k, v in delta.items() if k not in _TOOL_CALL_KEYS and v is not None)
        if extra:
            raise ShapeError(f"tool call {index} has a field that is not converted: {extra[0]!r}")
        _add_function(call["function"], delta.get("function") or {})


def _add_function(acc: dict[str, list[str]], delta: Any) -> dict[str, list[str]]:
    """Collect name and argument fragments (joined once at the end: arguments can be long)."""
    for key in ("name", "arguments"):
        acc.setdefault(key, []).append(need_str(need_dict(delta, "function").get(key), key))
    return acc


def _joined(fragments: dict[str, list[str]]) -> Json:
    return {key: "".join(parts) for key, parts in fragments.items()}


def _concat_lists(parts: Iterable[Any]) -> Json | None:
    """Logprobs of a choice: each list-valued field concatenated; null when no part had any."""
    out: Json | None = None
    for part in parts:
        if part is None:
            continue
        out = {} if out is None else out
        for key, value in need_dict(part, "logprobs").items():
            if out.get(key) is None:
                out[key] = None if value is None else []
            if value is not None:
                out[key].extend(need_list(value, f"logprobs.{key}"))  # linear: streams are long
    return out


# --- stream → stream ------------------------------------------------------------------------


def replay_events(stored: Sequence[bytes], *, include_usage: bool) -> list[bytes]:
    """A stored stream (chat or legacy) adapted to the caller's ``include_usage``.

    Events are replayed byte for byte; only the usage chunk (``"choices": []`` with a usage)
    is dropped when not wanted. The ``"usage": null`` fields on the other chunks stay: the
    SDK's chunk type declares them, and removing them would mean re-encoding every event.
    When usage is wanted but was not stored, a usage chunk is synthesized only if the last
    choice chunk carried a usage (some compatible servers put it there); otherwise there is
    none, as when the upstream does not report usage. Only the tail is parsed: validate a
    stream with ``assemble_*`` when storing it.

    An entry holds one whole event per item, ``[DONE]`` last: then only the items of the tail
    are decoded, from the end (a hit replays a 50-event stream decoding three). Anything else
    is decoded whole, as it would have arrived.
    """

    def single(i: int) -> sse.Event:
        event = sse.Decoder.event_of(stored[i])
        if event is None:
            raise _NotOneEvent
        return event

    try:
        if stored and single(len(stored) - 1).is_done:
            return _replayed(list(stored), len(stored) - 1, single, include_usage)
    except _NotOneEvent:
        pass
    decoder = sse.Decoder()
    events = [event for raw in stored for event in decoder.feed(raw)]
    rest = decoder.close()
    done = next((i for i, event in enumerate(events) if event.is_done), None)
    if done is None:
        raise ShapeError("the stream did not end with data: [DONE]")
    kept = _replayed([event.raw for event in events], done, events.__getitem__, include_usage)
    return [*kept, rest] if rest else kept


class _NotOneEvent(Exception):
    """A stored item that is not exactly one whole event: decode the stream as it came."""


def _replayed(
    raws: list[bytes], done: int, event_at: Callable[[int], sse.Event], include_usage: bool
) -> list[bytes]:
    """``raws`` (one event each, ``[DONE]`` at ``done``) with the usage chunk as wanted;
    ``event_at(i)`` is the event decoded from ``raws[i]``."""
    usage_at, last = _usage_tail(event_at, done)
    if not include_usage:
        return [raw for i, raw in enumerate(raws) if i not in usage_at]
    if usage_at or last is None or last.get("usage") is None:
        return raws
    head = header_of(last, last.get("object", ""))
    synthesized = encode_chunk({**head, "choices": [], "usage": last["usage"]})
    return [*raws[:done], synthesized, *raws[done:]]


def _usage_tail(event_at: Callable[[int], sse.Event], done: int) -> tuple[set[int], Json | None]:
    """Indexes of the usage chunks before ``done``, and the last chunk that had choices;
    events are taken from ``done`` backwards, only as far as that chunk."""
    usage_at: set[int] = set()
    for i in range(done - 1, -1, -1):
        event = event_at(i)
        if event.data is None:
            continue
        try:
            chunk = event.json()
        except ValueError as exc:
            raise ShapeError("event data is not JSON") from exc
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            raise ShapeError("not a completion chunk")
        if chunk["choices"]:
            return usage_at, chunk
        if chunk.get("usage") is not None:
            usage_at.add(i)
    return usage_at, None


# --- checks ---------------------------------------------------------------------------------


def need_str(value: Any, what: str) -> str:
    """A text field: ``None`` counts as empty; anything but a string is a ShapeError."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ShapeError(f"{what} is not a string")
    return value


def need_dict(value: Any, what: str) -> Json:
    if not isinstance(value, dict):
        raise ShapeError(f"{what} is not an object")
    return value


def need_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ShapeError(f"{what} is not a list")
    return value


def encode_chunk(chunk: Json) -> bytes:
    try:
        return sse.encode_json(chunk)
    except (TypeError, ValueError) as exc:  # a lone surrogate cannot be UTF-8 encoded
        raise ShapeError(f"cannot encode the chunk: {exc}") from exc
