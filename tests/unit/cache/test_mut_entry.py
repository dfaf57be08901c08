"""The stored entry's byte format, pinned (app/cache/entry.py).

An `LGE1` entry is read by every worker and every gateway instance sharing the Memcached,
including two releases side by side, and its size counts against
LLMGATE_CACHE_MAX_ENTRY_BYTES and the stored-bytes metric. The format, as documented in
app/cache/entry.py: `LGE1`, then the zlib stream (default level, 6) of the entry as compact
JSON (no insignificant whitespace, non-ASCII text as UTF-8 rather than \\u escapes) with the
fields created, compute_s, ttl, status, content_type, body and events.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable

import pytest

from app.cache.entry import Entry, EntryError

TEXT = "こんにちは, 世界: ça va"  # non-ASCII, and ", " / ": " inside a string


def _payload(entry: Entry) -> bytes:
    data = entry.to_bytes()
    assert data[:4] == b"LGE1"
    return zlib.decompress(data[4:])


def test_a_body_entry_is_compact_utf8_json_behind_the_magic() -> None:
    body = json.dumps({"content": TEXT}, ensure_ascii=False).encode()
    entry = Entry(1000.5, 0.25, 60, 200, "application/json", body=body)
    doc = {
        "created": 1000.5,
        "compute_s": 0.25,
        "ttl": 60,
        "status": 200,
        "content_type": "application/json",
        "body": body.decode(),
        "events": None,
    }
    compact = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    assert _payload(entry) == compact
    assert entry.to_bytes() == b"LGE1" + zlib.compress(compact, 6)


def test_a_stream_entry_keeps_its_events_as_utf8_text() -> None:
    events = (f"data: {TEXT}\n\n".encode(), b"data: [DONE]\n\n")
    payload = _payload(Entry(1.0, 2.0, 3, 200, "text/event-stream", events=events))
    assert TEXT.encode() in payload  # not \\u-escaped: about a third of the size for CJK
    assert json.loads(payload)["events"] == [e.decode() for e in events]
    assert Entry.from_bytes(b"LGE1" + zlib.compress(payload)).events == events


def test_an_entry_must_hold_exactly_one_of_body_and_events() -> None:
    for kwargs in ({}, {"body": b"x", "events": (b"y",)}):
        with pytest.raises(EntryError, match=r"^an entry holds either a body or events$"):
            Entry(0.0, 0.0, 1, 200, "", **kwargs)  # type: ignore[arg-type]


def test_unreadable_bytes_say_why_they_are_a_miss() -> None:
    # The message goes to the log line "cache entry unreadable, treated as a miss: ...".
    with pytest.raises(EntryError, match=r"^not an llmgate entry$"):
        Entry.from_bytes(b"pickle")
    with pytest.raises(EntryError, match=r"^unreadable entry: ") as caught:
        Entry.from_bytes(b"LGE1" + b"x" * 10)
    assert re.search(r"zlib|decompress", str(caught.value))
    missing = zlib.compress(json.dumps({"created": 1}).encode())
    with pytest.raises(EntryError, match=r"^unreadable entry: 'body'$"):
        Entry.from_bytes(b"LGE1" + missing)


def test_made_calls_make_once_per_form_while_keep_says_keep() -> None:
    """What a replay makes of an entry (app/cache/replay.py: its events in a route's shape,
    its body) is made the first time it is asked for and kept on the entry, unless ``keep``
    says not to keep that value (too large, say); a ``make`` that raises keeps nothing."""
    entry = Entry(1.0, 2.0, 3, 200, "application/json", body=b"{}")
    calls: list[str] = []

    def make(value: str) -> Callable[[], str]:
        def made() -> str:
            calls.append(value)
            return value

        return made

    assert entry.made("a", make("A"), lambda v: v == "A") == "A"
    assert entry.made("a", make("other"), lambda v: True) == "A"  # kept: not made again
    assert entry.made("b", make("B"), lambda v: v == "A") == "B"  # not kept ...
    assert entry.made("b", make("B2"), lambda v: False) == "B2"  # ... so made again
    assert calls == ["A", "B", "B2"]
    with pytest.raises(ZeroDivisionError):
        entry.made("c", lambda: 1 // 0, lambda v: True)
    assert entry.made("c", make("C"), lambda v: True) == "C"
    assert entry == Entry(1.0, 2.0, 3, 200, "application/json", body=b"{}")  # not compared
