"""A closed-loop load generator on raw sockets: N callers, one thread, one epoll selector.

Each caller holds one keep-alive connection and sends its next request as soon as the last
answer ended, until ``count`` requests have been sent. Per request it records the time to
the first SSE ``data:`` line of the body (TTFT; streams) and to the end of the response
(total). It parses only what it must: the status line, Content-Length or the chunked
coding, ``Connection: close``.

Why not threads or an HTTP library: with 200 callers a thread pool of urllib3 clients spends
more CPU than the gateway it measures, and on 2 cores that CPU is taken from the gateway.
One selector loop costs a few tens of microseconds per response event. Whether it kept up is
measured, not assumed: ``Result.load`` is the loop's own CPU time over the run's wall time
(1.0 = one core busy, i.e. the generator was the bottleneck).
"""

from __future__ import annotations

import json
import math
import selectors
import socket
import time
from dataclasses import dataclass, field

RECV = 256 * 1024


def request_bytes(path: str, body: dict, headers: dict[str, str] | None = None) -> bytes:
    """A POST of ``body`` as JSON, keep-alive, ready to send as it is."""
    data = json.dumps(body).encode()
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: bench",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)  # seconds, 200 answers with a data line
    total: list[float] = field(default_factory=list)  # seconds, every 200 answer
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0  # this process's CPU seconds during the run
    # With ``keep`` (run's): that header's value of each 200 answer, with its total time.
    kept: list[tuple[float, str]] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return len(self.total) / self.wall if self.wall else 0.0

    @property
    def load(self) -> float:
        """The generator's CPU over wall time: 1.0 means it used a whole core."""
        return self.cpu / self.wall if self.wall else 0.0


def pct(samples: list[float], q: float) -> float:
    """The q-quantile of ``samples`` in ms (nearest rank); NaN for none."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


class _Response:
    """Incremental HTTP/1.1 response parser: just enough to find its end and its first data."""

    def __init__(self, keep: bytes = b"") -> None:
        self.keep = keep  # a header's name, lower case, whose value is kept (b"": none)
        self.kept = ""
        self.buf = b""
        self.status = 0
        self.head_done = False
        self.chunked = False
        self.remaining = -1  # Content-Length bytes left, or chunk bytes left
        self.close = False
        self.saw_data = False
        self.tail = b""  # the last bytes of body seen, to find "data:" split across reads
        self.done = False

    def feed(self, data: bytes) -> bool:
        """Take bytes; True once the response is complete. Bytes past its end are an error
        (callers never pipeline)."""
        self.buf += data
        if not self.head_done:
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return False
            self._head(head)
            self.buf = rest
        if self.chunked:
            return self._chunks()
        body, self.buf = self.buf[: self.remaining], self.buf[self.remaining :]
        self._body(body)
        self.remaining -= len(body)
        self.done = self.remaining == 0
        return self.done

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split(b" ", 2)[1])
        self.head_done = True
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and value.endswith(b"chunked"):
                self.chunked = True
            elif name == b"connection" and value == b"close":
                self.close = True
            elif self.keep and name == self.keep:
                self.kept = line.partition(b":")[2].strip().decode("latin-1")
        self.remaining = -1 if self.chunked else length

    def _chunks(self) -> bool:
        while True:
            if self.remaining < 0:  # at a chunk-size line
                line, sep, rest = self.buf.partition(b"\r\n")
                if not sep:
                    return False
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:  # last chunk: wait for the empty trailer line
                    if not rest.startswith(b"\r\n"):
                        return False
                    self.done = True
                    return True
                self.buf, self.remaining = rest, size
            body = self.buf[: self.remaining]
            self._body(body)
            self.remaining -= len(body)
            self.buf = self.buf[len(body) :]
            if self.remaining:
                return False
            if len(self.buf) < 2:  # the CRLF after the chunk's data
                self.remaining = 0
                return False
            self.buf = self.buf[2:]
            self.remaining = -1

    def _body(self, body: bytes) -> None:
        if not self.saw_data and body:
            seen = self.tail + body
            self.saw_data = b"data:" in seen
            self.tail = seen[-8:]


class _Caller:
    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.pending = b""
        self.started = 0.0
        self.first = 0.0
        self.resp = _Response()


def run(
    host: str,
    port: int,
    request: bytes,
    callers: int,
    count: int,
    *,
    timeout: float = 120.0,
    keep: str = "",
) -> Result:
    """Send ``count`` requests from ``callers`` concurrent connections; ``Result`` of all
    (``keep``: a header whose value each answer's ``Result.kept`` holds, e.g. Server-Timing)."""
    wanted = keep.lower().encode()
    sel = selectors.DefaultSelector()
    result = Result()
    sent = 0
    live = 0

    def start(caller: _Caller) -> None:
        nonlocal sent, live
        if caller.sock is None:
            sock = socket.socket()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            sock.connect_ex((host, port))
            caller.sock = sock
            sel.register(sock, selectors.EVENT_WRITE, caller)
        else:
            sel.modify(caller.sock, selectors.EVENT_WRITE, caller)
        caller.pending, caller.resp, caller.first = request, _Response(wanted), 0.0
        caller.started = time.perf_counter()
        sent += 1
        live += 1

    def drop(caller: _Caller) -> None:
        assert caller.sock is not None
        sel.unregister(caller.sock)
        caller.sock.close()
        caller.sock = None

    def finish(caller: _Caller, error: str = "") -> None:
        nonlocal live
        live -= 1
        resp = caller.resp
        if error or resp.status != 200:
            result.errors.append(error or f"HTTP {resp.status}")
        else:
            result.total.append(time.perf_counter() - caller.started)
            if wanted:
                result.kept.append((result.total[-1], resp.kept))
            if caller.first:
                result.ttft.append(caller.first - caller.started)
        if error or resp.close:
            drop(caller)
        if sent < count:
            start(caller)
        elif caller.sock is not None:
            drop(caller)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    end = time.monotonic() + timeout
    for caller in [_Caller() for _ in range(min(callers, count))]:
        start(caller)
    while live and time.monotonic() < end:
        for key, events in sel.select(1.0):
            caller = key.data
            sock = caller.sock
            try:
                if events & selectors.EVENT_WRITE:
                    n = sock.send(caller.pending)
                    caller.pending = caller.pending[n:]
                    if not caller.pending:
                        sel.modify(sock, selectors.EVENT_READ, caller)
                    continue
                data = sock.recv(RECV)
            except OSError as exc:
                finish(caller, f"socket: {exc!r}")
                continue
            if not data:
                finish(caller, "closed before the end of the response")
                continue
            done = caller.resp.feed(data)
            if not caller.first and caller.resp.saw_data:
                caller.first = time.perf_counter()
            if done:
                finish(caller)
    result.wall = time.perf_counter() - wall0
    result.cpu = time.process_time() - cpu0
    for key in list(sel.get_map().values()):
        result.errors.append("no answer before the timeout")
        key.fileobj.close()  # type: ignore[union-attr]
    sel.close()
    return result
