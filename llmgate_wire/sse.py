"""Server-sent events codec. No I/O here: bytes in, events out.

The decoder follows the WHATWG event-stream grammar (HTML Living Standard, 9.2.5): lines end
with CR, LF or CRLF; a blank line dispatches the event; a line starting with ":" is a
comment; "field: value" loses one leading space of the value; a leading UTF-8 BOM is dropped.

It is also byte-faithful: every event keeps the exact bytes it came from (``Event.raw``), so
the relay can forward what the upstream sent without re-encoding it, and the concatenation
of every event's ``raw`` plus ``Decoder.close()`` equals the input, whatever the chunking.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Event:
    """One dispatched event: its fields and the exact bytes it was decoded from."""

    raw: bytes
    data: str | None = None
    event: str | None = None
    id: str | None = None
    retry: int | None = None
    comments: tuple[str, ...] = ()

    @classmethod
    def of_data(cls, raw: bytes, data: str) -> Event:
        """``Event(raw=raw, data=data)``, made in a fifth of the time: a frozen dataclass
        sets each of its six fields through ``object.__setattr__``, where this puts the two
        given in the instance's dict and leaves the others to the class's defaults. The
        decoder makes one per token of every stream (tests/unit/wire/test_sse_events.py
        holds the two equal, field by field)."""
        event = object.__new__(cls)
        fields = event.__dict__
        fields["raw"], fields["data"] = raw, data
        return event

    @property
    def is_comment(self) -> bool:
        """True for an event made only of comments (a heartbeat): it carries no data."""
        return self.data is None and self.event is None and self.id is None

    @property
    def is_done(self) -> bool:
        return self.data == DONE

    def json(self) -> Any:
        """The data field parsed as JSON (raises ValueError when it is not JSON)."""
        if self.data is None:
            raise ValueError("event has no data")
        return json.loads(self.data)


class EventTooLarge(ValueError):
    """An event grew past the decoder's ``max_event_bytes``: the stream cannot go on.

    ``events`` holds the complete events decoded before it, in order, so none is lost.
    """

    def __init__(self, limit: int, events: list[Event]) -> None:
        super().__init__(f"an event is larger than {limit} bytes")
        self.limit = limit
        self.events = events


_EOL_BYTES = (b"\n", b"\r")


class Decoder:
    """Incremental decoder: ``feed()`` chunks as they arrive, get complete events back.

    A CR at the end of a chunk ends its line at once (so an event is never held back waiting
    for the next chunk); an LF at the start of the next chunk is then the second half of that
    CRLF and is carried, byte-exact, at the front of the next event's ``raw``.

    Linear in its input: bytes are appended to one buffer and every byte is searched for a
    line end once, however the stream is chunked (a long line arriving in small reads is not
    rescanned from its start). With ``max_event_bytes``, an event (its raw bytes, complete or
    still arriving) larger than that raises ``EventTooLarge``; nothing else in the input can
    make the decoder raise.
    """

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self.max_event_bytes = max_event_bytes
        self._buf = bytearray()
        self._event_start = 0  # offset in _buf where the current event's raw bytes begin
        self._scan = 0  # offset in _buf of the next unread line
        self._searched = 0  # _buf[_scan:_searched] holds no line end: search on from here
        self._found = [-1, -1]  # where the next LF / CR was found (-1: not found yet)
        self._looked = [0, 0]  # how far the buffer was searched for LF / CR without finding
        self._skip_lf = False
        self._bom_checked = False
        self._fields: dict[str, Any] = {}
        self._data: list[str] = []
        self._comments: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if (
            not self._buf
            and self._bom_checked
            and not self._skip_lf
            and chunk.endswith(b"\n\n")
            and b"\r" not in chunk
        ):
            if chunk.startswith(b"data: ") and chunk.find(b"\n") == len(chunk) - 2:
                return [self._one_data_event(chunk)]
            return self._feed_whole(chunk)
        self._buf += chunk
        if not self._bom_checked:
            if len(self._buf) < len(_BOM) and _BOM.startswith(self._buf):
                return []
            self._bom_checked = True
            if self._buf.startswith(_BOM):
                self._scan = self._searched = len(_BOM)
        events: list[Event] = []
        while True:
            if self._skip_lf:
                if self._scan >= len(self._buf):
                    break
                if self._buf[self._scan] == 0x0A:
                    self._scan += 1
                self._searched = self._scan
                self._skip_lf = False
            line_end, next_start = self._find_eol()
            if line_end < 0:
                self._searched = len(self._buf)
                break
            line = bytes(self._buf[self._scan : line_end])
            # A lone CR as the last byte so far: an LF first in the next chunk completes it.
            self._skip_lf = next_start == len(self._buf) == line_end + 1 and (
                self._buf[line_end] == 0x0D
            )
            self._scan = self._searched = next_start
            if line:
                self._take_line(line)
            else:
                event = self._dispatch()
                if self.max_event_bytes is not None and len(event.raw) > self.max_event_bytes:
                    raise EventTooLarge(self.max_event_bytes, events)
                events.append(event)
        self._compact()
        if self.max_event_bytes is not None and len(self._buf) > self.max_event_bytes:
            raise EventTooLarge(self.max_event_bytes, events)
        return events

    def _feed_whole(self, chunk: bytes) -> list[Event]:
        """The usual chunk: whole events with LF line ends and nothing buffered before it.
        The same events as the general path, without buffering or searching twice."""
        events: list[Event] = []
        start = pos = 0
        while pos < len(chunk):
            eol = chunk.index(b"\n", pos)  # there is one: the chunk ends with a blank line
            if eol == pos:
                event = self._event(chunk[start : eol + 1])
                if self.max_event_bytes is not None and len(event.raw) > self.max_event_bytes:
                    raise EventTooLarge(self.max_event_bytes, events)
                events.append(event)
                start = eol + 1
            else:
                self._take_line(chunk[pos:eol])
            pos = eol + 1
        return events

    def _one_data_event(self, chunk: bytes) -> Event:
        """The most usual chunk of all: one event of one ``data:`` line (a token), decoded
        as ``_feed_whole`` decodes it (the prefix is ASCII, so the value decodes alone)."""
        if self.max_event_bytes is not None and len(chunk) > self.max_event_bytes:
            raise EventTooLarge(self.max_event_bytes, [])
        return Event.of_data(chunk, chunk[6:-2].decode("utf-8", errors="replace"))

    @classmethod
    def event_of(cls, raw: bytes) -> Event | None:
        """The one whole event ``raw`` is, byte for byte; None when it is anything else
        (several events, none, an unfinished one). The raw bytes of the events decoded and
        the unfinished rest are always the input, so one event and no rest is ``raw``."""
        decoder = cls()
        events = decoder.feed(raw)
        if len(events) != 1 or decoder.close():
            return None
        return events[0]

    def close(self) -> bytes:
        """End of stream: return the bytes of an unfinished event (not dispatched, per spec)."""
        rest = bytes(self._buf[self._event_start :])
        self.__init__(self.max_event_bytes)  # type: ignore[misc]
        return rest

    def _find_eol(self) -> tuple[int, int]:
        """(end of line, start of next line) or (-1, -1) when no full line is buffered."""
        lf = self._next(0)
        cr = self._next(1)
        if lf < 0 and cr < 0:
            return -1, -1
        if cr < 0 or 0 <= lf < cr:
            return lf, lf + 1
        if cr + 1 < len(self._buf) and self._buf[cr + 1] == 0x0A:
            return cr, cr + 2
        return cr, cr + 1

    def _next(self, which: int) -> int:
        """Offset of the next LF (0) or CR (1) at or after ``_searched``, or -1. Remembers
        where it found one, or how far it looked, so no byte is searched twice (``find`` is
        memchr-fast; a regex over both bytes is several times slower)."""
        found = self._found[which]
        if found >= self._searched:
            return found
        start = max(self._searched, self._looked[which])
        found = self._buf.find(_EOL_BYTES[which], start)
        self._found[which] = found
        if found < 0:
            self._looked[which] = len(self._buf)
        return found

    def _take_line(self, raw: bytes) -> None:
        """One non-blank line, UTF-8 decoded with replacement (9.2.5: the stream is decoded
        before it is parsed; an invalid byte becomes U+FFFD, it does not end the stream)."""
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            self._comments.append(line[1:].lstrip(" "))
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name in ("event", "id"):
            if name == "id" and "\0" in value:
                return
            self._fields[name] = value
        elif name == "retry" and value.isascii() and value.isdigit():
            # Only ASCII digits count (str.isdigit alone accepts "²", which int() refuses);
            # a value too long for int() is ignored like any other invalid one.
            with contextlib.suppress(ValueError):
                self._fields["retry"] = int(value)

    def _dispatch(self) -> Event:
        event = self._event(bytes(self._buf[self._event_start : self._scan]))
        self._event_start = self._scan
        return event

    def _event(self, raw: bytes) -> Event:
        """The event the fields taken so far make, with its ``raw`` bytes; fields reset."""
        event = Event(
            raw=raw,
            data="\n".join(self._data) if self._data else None,
            event=self._fields.get("event"),
            id=self._fields.get("id"),
            retry=self._fields.get("retry"),
            comments=tuple(self._comments),
        )
        self._fields, self._data, self._comments = {}, [], []
        return event

    def _compact(self) -> None:
        if self._event_start:
            del self._buf[: self._event_start]
            self._scan -= self._event_start
            self._searched -= self._event_start
            for i in (0, 1):
                self._found[i] = max(-1, self._found[i] - self._event_start)
                self._looked[i] = max(0, self._looked[i] - self._event_start)
            self._event_start = 0


def encode(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    """Encode one event with LF line endings; multi-line data becomes several data lines."""
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.extend(f"data: {part}" for part in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def encode_json(obj: Any) -> bytes:
    return encode(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))


def comment(text: str = "ping") -> bytes:
    """A comment event: clients (the OpenAI SDK included) skip it; proxies see traffic."""
    return f": {text}\n\n".encode()


DONE_EVENT = encode(DONE)


_ID_LINE = b"id: "


def with_id(raw: bytes, event_id: str) -> bytes:
    """An event's bytes with an ``id:`` line in front (a resumable stream's, docs/streams.md).
    A leading line end (the second half of a CRLF split across reads) is dropped: in front of
    it the id line would end an event of its own."""
    return b"%s%s\n%s" % (_ID_LINE, event_id.encode(), raw.lstrip(b"\r\n"))


def split_id(raw: bytes) -> tuple[bytes, bytes]:
    """(the leading ``id:`` line, the event without it): ``(b"", raw)`` when it has none."""
    if not raw.startswith(_ID_LINE):
        return b"", raw
    cut = raw.find(b"\n") + 1
    return raw[:cut], raw[cut:]
