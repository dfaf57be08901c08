"""HTTP/1.1 request parsing and response framing. No I/O here: bytes in, values out.

Just enough of RFC 9112 for a test upstream: a request line, header fields, a body framed by
Content-Length or by the chunked transfer coding, and pipelined requests left in the buffer
for the next call. Anything malformed is a ``ProtocolError`` carrying the status to answer
with before the connection is closed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from http import HTTPStatus

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"
_VERSIONS = frozenset({"HTTP/1.0", "HTTP/1.1"})


class ProtocolError(Exception):
    """The bytes are not an HTTP/1.x request we accept; answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Request:
    """One parsed request. Header names are lowercased and kept in arrival order."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    content_length: int = 0
    chunked: bool = False

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (lowercase), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def keep_alive(self) -> bool:
        # RFC 9112 section 9.3: 1.1 persists unless "close"; 1.0 only with "keep-alive".
        tokens = {t.strip().lower() for t in (self.header("connection") or "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    @property
    def expects_continue(self) -> bool:
        # RFC 9110 section 10.1.1: only an HTTP/1.1 client may wait for 100 Continue.
        expect = (self.header("expect") or "").lower()
        return self.version == "HTTP/1.1" and expect == "100-continue"


class RequestParser:
    """Incremental request parser: ``feed()`` bytes, then take requests with ``next_request()``."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head: Request | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending_head(self) -> Request | None:
        """The request whose head is parsed but whose body has not fully arrived yet."""
        return self._head

    def next_request(self) -> Request | None:
        """The next complete request, or None until more bytes are fed."""
        if self._head is None:
            # RFC 9112 section 2.2: ignore empty lines received before a request line.
            while self._buf[:2] == b"\r\n":
                del self._buf[:2]
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise ProtocolError(431, "request head too large")
                return None
            self._head = parse_head(bytes(self._buf[:end]))
            del self._buf[: end + 4]
        head = self._head
        if head.chunked:
            found = _dechunk(self._buf)
            if found is None:
                if len(self._buf) > MAX_BODY:
                    raise ProtocolError(413, "request body too large")
                return None
            body, used = found
        else:
            if len(self._buf) < head.content_length:
                return None
            used = head.content_length
            body = bytes(self._buf[:used])
        del self._buf[:used]
        self._head = None
        return replace(head, body=body)


def parse_head(raw: bytes) -> Request:
    """Parse a request line and header fields (without the blank line that ends them)."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise ProtocolError(400, f"malformed request line {lines[0][:80]!r}")
    method, target, version = parts
    if version not in _VERSIONS:
        raise ProtocolError(505, f"unsupported version {version[:20]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        # RFC 9112 section 5.1 and 5.2: no space before the colon, no obsolete line folding.
        if not sep or not name or name != name.strip():
            raise ProtocolError(400, f"malformed header line {line[:80]!r}")
        headers.append((name.lower(), value.strip(" \t")))
    length, chunked = _framing(headers)
    return Request(method, target, version, tuple(headers), b"", length, chunked)


def _framing(headers: list[tuple[str, str]]) -> tuple[int, bool]:
    """(Content-Length, chunked) of a request head."""
    encodings = [v.strip().lower() for k, v in headers if k == "transfer-encoding"]
    if encodings:
        codings = [c.strip() for c in ",".join(encodings).split(",")]
        if codings[-1] != "chunked":
            raise ProtocolError(400, "transfer-encoding without final chunked")
        # RFC 9112 section 6.3: Transfer-Encoding overrides Content-Length.
        return 0, True
    lengths = {v.strip() for k, v in headers if k == "content-length"}
    if not lengths:
        return 0, False
    text = lengths.pop()
    if lengths or not text.isdigit():
        raise ProtocolError(400, "invalid content-length")
    length = int(text)
    if length > MAX_BODY:
        raise ProtocolError(413, "request body too large")
    return length, False


def _dechunk(buf: bytearray) -> tuple[bytes, int] | None:
    """Decode a complete chunked body at the start of ``buf``: (body, bytes used) or None."""
    body = bytearray()
    pos = 0
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError(400, "malformed chunk size") from None
        pos = eol + 2
        if size == 0:
            break
        if len(buf) < pos + size + 2:
            return None
        if buf[pos + size : pos + size + 2] != b"\r\n":
            raise ProtocolError(400, "chunk not followed by CRLF")
        body += buf[pos : pos + size]
        pos += size + 2
    # Trailer fields end with an empty line; without trailers that line comes at once.
    if buf[pos : pos + 2] == b"\r\n":
        return bytes(body), pos + 2
    end = buf.find(b"\r\n\r\n", pos)
    if end < 0:
        return None
    return bytes(body), end + 4


def response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    """The status line and header block of a response, blank line included."""
    lines = [f"HTTP/1.1 {status} {_phrase(status)}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _phrase(status: int) -> str:
    """The reason phrase; 529 is Anthropic's own ("overloaded"), unknown to the registry."""
    if status == 529:
        return "Site Overloaded"
    return HTTPStatus(status).phrase


def chunk(data: bytes) -> bytes:
    """One chunk of the chunked transfer coding (RFC 9112 section 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)
