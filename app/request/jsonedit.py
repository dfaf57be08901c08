"""Edits to one top-level member of a JSON object, every other byte kept. No I/O here.

Providers' prompt caches key on the exact bytes of the prompt prefix: a body that goes
upstream re-serialised (keys reordered, spaces dropped, ``\\u00e9`` for ``é``) can cost the
caller its cache discount. Where the gateway must change a body (drop its own ``cache``
object, rename an aliased model), it cuts or splices the bytes of that one member and leaves
the rest as the caller wrote them.

Members are found with the standard library's own JSON grammar (``json.JSONDecoder`` reads
each key and skips each value), so strings holding braces, quotes or escapes cannot mislead
the scan. Input that is not a JSON object in UTF-8 raises ``ValueError``: the caller decides
what to do then (the gateway re-encodes, as it did before).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")  # RFC 8259 section 2: the four whitespace characters
_DECODER = json.JSONDecoder()
_BOM = "\ufeff"


@dataclass(frozen=True)
class Member:
    """One top-level member: the key, where its key starts and where its value lies."""

    key: str
    start: int  # index of the key's opening quote
    value_start: int
    value_end: int  # just past the value


def members(text: str) -> list[Member]:
    """The top-level members of the JSON object ``text``, in order (duplicates included)."""
    pos = _skip(text, len(_BOM) if text.startswith(_BOM) else 0)
    if not text.startswith("{", pos):
        raise ValueError("not a JSON object")
    pos = _skip(text, pos + 1)
    found: list[Member] = []
    if text.startswith("}", pos):
        return _closed(text, pos, found)
    while True:
        if not text.startswith('"', pos):
            raise ValueError(f"expected a key at {pos}")
        key, after = _DECODER.raw_decode(text, pos)
        colon = _skip(text, after)
        if not text.startswith(":", colon):
            raise ValueError(f"expected ':' at {colon}")
        value_start = _skip(text, colon + 1)
        _, value_end = _DECODER.raw_decode(text, value_start)
        found.append(Member(key, pos, value_start, value_end))
        pos = _skip(text, value_end)
        if text.startswith("}", pos):
            return _closed(text, pos, found)
        if not text.startswith(",", pos):
            raise ValueError(f"expected ',' or '}}' at {pos}")
        pos = _skip(text, pos + 1)


def _skip(text: str, pos: int) -> int:
    match = _WS.match(text, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _closed(text: str, brace: int, found: list[Member]) -> list[Member]:
    if _skip(text, brace + 1) != len(text):
        raise ValueError("data after the JSON object")
    return found


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None


def without_member(raw: bytes, key: str) -> bytes:
    """``raw`` without every top-level member named ``key``; ``raw`` itself when it has none.

    A member is cut with the comma and whitespace that tie it to the next member (or, for
    the last one, to the previous member), so what is left is still the caller's formatting.
    """
    text = _decode(raw)
    found = members(text)
    if not any(m.key == key for m in found):
        return raw
    cuts: list[tuple[int, int, str]] = []
    n, i = len(found), 0
    while i < n:
        if found[i].key != key:
            i += 1
            continue
        j = i  # a run of members to remove: i..j
        while j + 1 < n and found[j + 1].key == key:
            j += 1
        if j + 1 < n:
            cuts.append((found[i].start, found[j + 1].start, ""))
        elif i > 0:
            cuts.append((found[i - 1].value_end, found[j].value_end, ""))
        else:
            cuts.append((found[i].start, found[j].value_end, ""))
        i = j + 1
    return _spliced(text, cuts)


def with_value(raw: bytes, key: str, value: bytes) -> bytes:
    """``raw`` with the value of every top-level member ``key`` replaced by the JSON text
    ``value``; ``raw`` itself when there is no such member."""
    text = _decode(raw)
    replacement = _decode(value)
    spans = [(m.value_start, m.value_end, replacement) for m in members(text) if m.key == key]
    return _spliced(text, spans) if spans else raw


def with_member(raw: bytes, key: str, value: bytes) -> bytes:
    """``raw`` with member ``key`` set to the JSON text ``value``: replaced where it is
    (``with_value``), else added after the last member, the rest untouched."""
    text = _decode(raw)
    found = members(text)
    if any(m.key == key for m in found):
        return with_value(raw, key, value)
    member = json.dumps(key) + ":" + _decode(value)
    if found:
        at = found[-1].value_end
        return _spliced(text, [(at, at, "," + member)])
    at = text.index("{") + 1
    return _spliced(text, [(at, at, member)])


def _spliced(text: str, edits: list[tuple[int, int, str]]) -> bytes:
    """``text`` with each ``(start, end, new)`` span replaced; spans in order, disjoint."""
    out: list[str] = []
    at = 0
    for start, end, new in edits:
        out += [text[at:start], new]
        at = end
    out.append(text[at:])
    # Decoding valid UTF-8 and encoding it again gives the same bytes: the untouched runs
    # are byte for byte what the caller sent.
    return "".join(out).encode("utf-8")


def find_member(raw: bytes, key: str) -> bytes | None:
    """The JSON text of the last top-level member ``key`` (the one json.loads keeps)."""
    text = _decode(raw)
    found = [m for m in members(text) if m.key == key]
    if not found:
        return None
    return text[found[-1].value_start : found[-1].value_end].encode("utf-8")


def without_member_of(raw: bytes, body: dict[str, Any], name: str) -> bytes:
    """The caller's bytes with only the member ``name`` cut out (the provider's prompt cache
    keys on the exact prompt bytes, so nothing else may move). JSON that is not UTF-8
    (json.loads also reads UTF-16 and UTF-32) is re-encoded from ``body``."""
    try:
        return without_member(raw, name)
    except ValueError:
        return json.dumps({k: v for k, v in body.items() if k != name}).encode()
