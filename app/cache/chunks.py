"""A stored completion as the stream events it would have been sent as. No I/O here.

Text is streamed ``WORDS_PER_CHUNK`` words per chunk (a word keeps its trailing whitespace),
no chunk longer than ``MAX_CHUNK_CHARS`` characters; when per-token logprobs spell the text
exactly, one chunk per token instead, each with its own logprob entry. The normalisation
rules and the inverse direction live in ``app.cache.shapes``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import zip_longest
from typing import Any

from app.cache.shapes import (
    CHAT,
    CHAT_CHUNK,
    MESSAGE_KEYS,
    TEXT,
    Json,
    ShapeError,
    encode_chunk,
    header_of,
    need_dict,
    need_list,
    need_str,
)
from llmgate_wire import sse

WORDS_PER_CHUNK = 3
MAX_CHUNK_CHARS = 32
_WORD = re.compile(r"\s+|\S+\s*")  # leading whitespace alone, then words with what follows


def split_text(text: str) -> list[str]:
    """The pieces ``text`` is streamed in; ``"".join(split_text(t)) == t`` and ``""`` → []."""
    words = _WORD.findall(text)
    pieces: list[str] = []
    for start in range(0, len(words), WORDS_PER_CHUNK):
        group = "".join(words[start : start + WORDS_PER_CHUNK])
        pieces.extend(group[i : i + MAX_CHUNK_CHARS] for i in range(0, len(group), MAX_CHUNK_CHARS))
    return pieces


# --- object → stream ------------------------------------------------------------------------


def chat_to_events(completion: dict[str, Any], *, include_usage: bool) -> list[bytes]:
    """The SSE events a stream request would have got for this stored ``chat.completion``."""
    choices = _choices(completion, CHAT)
    return _frame(completion, CHAT_CHUNK, [_chat_parts(c) for c in choices], include_usage)


def completion_to_events(completion: dict[str, Any], *, include_usage: bool) -> list[bytes]:
    """The SSE events a stream request would have got for this stored ``text_completion``."""
    choices = _choices(completion, TEXT)
    return _frame(completion, TEXT, [_text_parts(c) for c in choices], include_usage)


def _choices(completion: Any, kind: str) -> list[Json]:
    if not isinstance(completion, dict) or completion.get("object") != kind:
        raise ShapeError(f"not a {kind} object")
    choices = need_list(completion.get("choices"), "choices")
    if not choices or not all(
        isinstance(c, dict) and isinstance(c.get("index"), int) for c in choices
    ):
        raise ShapeError("the object has no choices, or a choice without an index")
    return sorted(choices, key=lambda choice: choice["index"])


def _frame(completion: Json, obj: str, parts: list[list[Json]], include_usage: bool) -> list[bytes]:
    """One chunk per choice part, choices taking turns, then the usage chunk, then [DONE]."""
    base = header_of(completion, obj)
    # With include_usage OpenAI sends "usage": null on every chunk but the usage chunk.
    tail = {"usage": None} if include_usage else {}
    chunks = [{**base, "choices": [part], **tail} for part in _round_robin(parts)]
    if include_usage and completion.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return [encode_chunk(chunk) for chunk in chunks] + [sse.DONE_EVENT]


def _round_robin(lists: list[list[Json]]) -> Iterator[Json]:
    for row in zip_longest(*lists):
        yield from (part for part in row if part is not None)


def _chat_parts(choice: Json) -> list[Json]:
    """A choice as stream parts: role, extra text, content, refusal, calls, annotations, finish."""
    index, message = choice["index"], need_dict(choice.get("message"), "message")
    logprobs = choice.get("logprobs")
    lp = {} if logprobs is None else need_dict(logprobs, "logprobs")
    first: Json = {"role": need_str(message.get("role"), "role") or "assistant"}
    first_lp = None if logprobs is None else dict(lp)
    deltas: list[tuple[Json, Json | None]] = []
    for key, value in message.items():  # extra text fields (reasoning) come before the answer
        if key not in MESSAGE_KEYS and value is not None:
            deltas += [({key: piece}, None) for piece in split_text(need_str(value, key))]
    for key in ("content", "refusal"):
        text = message.get(key)
        first[key] = None if text is None else ""
        spelled = _spell(need_str(text, key), lp.get(key))
        if spelled is None:
            deltas += [({key: piece}, None) for piece in split_text(need_str(text, key))]
            continue
        if first_lp is not None:
            first_lp[key] = []  # the first part opens the list, each token part adds its entry
        deltas += [({key: t}, {"content": None, "refusal": None, key: e}) for t, e in spelled]
    deltas += [(delta, None) for delta in _call_deltas(message)]
    if message.get("annotations"):
        deltas.append(({"annotations": need_list(message["annotations"], "annotations")}, None))
    parts = [_part(index, first, first_lp)]
    parts += [_part(index, delta, part_lp) for delta, part_lp in deltas]
    return [*parts, _part(index, {}, None, _finish(choice))]


def _spell(text: str, entries: Any) -> list[tuple[str, list[Any]]] | None:
    """(token, [its logprob entry]) per entry when the tokens spell ``text`` exactly."""
    if not isinstance(entries, list) or not entries:
        return None
    tokens = [entry.get("token") if isinstance(entry, dict) else None for entry in entries]
    if not all(isinstance(t, str) for t in tokens) or "".join(map(str, tokens)) != text:
        return None
    return [(str(t), [entry]) for t, entry in zip(tokens, entries, strict=True)]


def _call_deltas(message: Json) -> list[Json]:
    """Tool calls as OpenAI streams them: id, type and name first, then argument fragments."""
    deltas: list[Json] = []
    for k, item in enumerate(need_list(message.get("tool_calls") or [], "tool_calls")):
        call = need_dict(item, "tool call")
        if call.get("type", "function") != "function" or not isinstance(call.get("id"), str):
            raise ShapeError("only function tool calls with an id can be streamed")
        function = need_dict(call.get("function"), "tool call function")
        name = need_str(function.get("name"), "name")
        opening = {"index": k, "id": call["id"], "type": "function"}
        deltas.append({"tool_calls": [{**opening, "function": {"name": name, "arguments": ""}}]})
        for piece in split_text(need_str(function.get("arguments"), "arguments")):
            deltas.append({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
    if message.get("function_call") is not None:
        function = need_dict(message["function_call"], "function_call")
        name = need_str(function.get("name"), "name")
        deltas.append({"function_call": {"name": name, "arguments": ""}})
        for piece in split_text(need_str(function.get("arguments"), "arguments")):
            deltas.append({"function_call": {"arguments": piece}})
    return deltas


def _part(index: int, delta: Json, logprobs: Json | None, finish: str | None = None) -> Json:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def _text_parts(choice: Json) -> list[Json]:
    """A legacy choice as stream parts; the last part has ``text: ""`` and the finish reason."""
    index, text = choice["index"], need_str(choice.get("text"), "text")
    logprobs = choice.get("logprobs")
    lp = None if logprobs is None else need_dict(logprobs, "logprobs")
    pieces, slices, last_lp = _spell_legacy(text, lp)
    parts = [
        {"text": piece, "index": index, "logprobs": part_lp, "finish_reason": None}
        for piece, part_lp in zip(pieces, slices, strict=True)
    ]
    last = {"text": "", "index": index, "logprobs": last_lp, "finish_reason": _finish(choice)}
    return [*parts, last]


def _spell_legacy(text: str, lp: Json | None) -> tuple[list[str], list[Any], Json | None]:
    """Pieces, their logprobs, the last part's logprobs: per token when the tokens spell the
    text and every list is parallel to them, else split_text and all logprobs on the last."""
    pieces = split_text(text)
    if lp is None:
        return pieces, [None] * len(pieces), None
    tokens = lp.get("tokens")
    lists = {key: value for key, value in lp.items() if value is not None}
    spelled = (
        isinstance(tokens, list)
        and all(isinstance(t, str) for t in tokens)
        and "".join(tokens) == text
        and all(isinstance(v, list) and len(v) == len(tokens) for v in lists.values())
    )
    if not spelled:
        return pieces, [None] * len(pieces), lp
    tokens = need_list(tokens, "tokens")
    slices = [{**lp, **{k: v[i : i + 1] for k, v in lists.items()}} for i in range(len(tokens))]
    return [str(t) for t in tokens], slices, {**lp, **{key: [] for key in lists}}


def _finish(choice: Json) -> str:
    reason = choice.get("finish_reason")
    if not isinstance(reason, str) or not reason:
        raise ShapeError(f"choice {choice.get('index')} has no finish_reason")
    return reason
