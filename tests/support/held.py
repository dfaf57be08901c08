"""Hold thousands of streams from one thread: the one driver of many raw HTTP streams.

``HeldStreams`` opens streams over raw non-blocking sockets with one selector, so one
process holds 10,000 of them (``raise_fd_limit`` first: each is a descriptor). It reads
everything as it comes and keeps, per stream, when its head arrived, the longest silence
while it was held (head to first ``data:`` event: only pings fill it), and how it ended.
Requests carry ``Connection: close``, so a complete stream is ``[DONE]`` then the server's
close; a close or reset before ``[DONE]`` is a cut. Nothing here assumes what the server
is: the counts are of bytes on the wire.

``ManyStreams`` is the same driver told to stop reading each stream at its first data
event (``to_end=False``): the stream stays open, unread, until ``close_all`` closes every
socket in one quick loop (unread bytes make the kernel send an RST, as a killed caller
does).
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PING = b": ping"
# A stream to hold: three tokens once its first one comes (held silent, but for pings,
# by a long `x-sim-ttft-ms` of the caller's choosing).
HOLD_BODY = {
    "model": "sim-model",
    "stream": True,
    "max_tokens": 3,
    "messages": [{"role": "user", "content": "hold"}],
}
DATA = b"data: "
DONE = b"data: [DONE]"
# Enough of the previous read to find a marker split over two reads.
_TAIL = len(DONE) - 1


def raise_fd_limit(wanted: int) -> int:
    """Raise our soft descriptor limit toward ``wanted`` (never above the hard limit);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class Stream:
    request: bytes
    sock: socket.socket | None = None
    sent_at: float = 0.0
    head_at: float = 0.0  # the response head arrived
    status: int = 0
    first_data_at: float = 0.0  # the first data event: the hold is over
    last_at: float = 0.0  # the last read
    max_gap: float = 0.0  # longest silence from the head to the first data event
    max_data_gap: float = 0.0  # longest silence from the first data event to the end
    pings: int = 0
    done: bool = False  # [DONE] seen
    ended_at: float = 0.0
    error: str = ""  # "connect: …", "status: …", "cut: …", "timeout: …"
    head: bytes = b""
    tail: bytes = b""

    @property
    def held(self) -> bool:
        """Established (a 200 head) and not yet ended."""
        return self.status == 200 and not self.ended_at


@dataclass
class HeldStreams:
    """``add(requests)`` queues them; ``run`` connects them ``batch`` at a time (connect to
    head) and services every socket until ``until()`` or a deadline. ``to_end``: read each
    stream to its end; False: leave it unread once its first data event came."""

    host: str
    port: int
    batch: int = 200
    to_end: bool = True
    streams: list[Stream] = field(default_factory=list)
    peak_held: int = 0
    held_now: int = 0
    all_held_at: float = 0.0  # when every stream was established at once (0: never)
    ended: int = 0

    def __post_init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._todo: list[Stream] = []
        self._connecting = 0

    def add(self, requests: list[bytes]) -> None:
        fresh = [Stream(r) for r in requests]
        self.streams += fresh
        self._todo += reversed(fresh)

    def run(self, until: Callable[[], bool], deadline: float) -> None:
        """Service sockets until ``until()`` is true or ``deadline`` (monotonic) passes."""
        while not until() and time.monotonic() < deadline:
            while self._todo and self._connecting < self.batch:
                self._connect(self._todo.pop())
            for key, events in self.sel.select(0.05):
                self._service(key.data, events)

    @property
    def pending(self) -> int:
        """Streams not yet ended (queued, connecting, held or finishing)."""
        return len(self.streams) - self.ended

    @property
    def opening(self) -> int:
        """Streams queued or open that have neither ended nor had their first data event."""
        return sum(1 for s in self.streams if not s.ended_at and not s.first_data_at)

    def finish(self, why: str) -> None:
        """Close whatever is still open, marking each as an error ``why``."""
        for stream in self.streams:
            if not stream.ended_at:
                self._end(stream, f"timeout: {why}")
        self.sel.close()

    def close_all(self) -> None:
        """Close every socket in one quick loop, ended or not, and the selector."""
        for stream in self.streams:
            if stream.sock is not None:
                stream.sock.close()
        self.sel.close()

    # -- one socket ----------------------------------------------------------------------
    def _connect(self, stream: Stream) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        stream.sock, stream.sent_at = sock, time.monotonic()
        self._connecting += 1
        err = sock.connect_ex((self.host, self.port))
        if err not in (0, 115):  # 115: EINPROGRESS
            self._end(stream, f"connect: errno {err}")
            return
        self.sel.register(sock, selectors.EVENT_WRITE, stream)

    def _service(self, stream: Stream, events: int) -> None:
        assert stream.sock is not None
        try:
            if stream.request:
                sent = stream.sock.send(stream.request)
                stream.request = stream.request[sent:]
                if not stream.request:
                    self.sel.modify(stream.sock, selectors.EVENT_READ, stream)
                return
            data = stream.sock.recv(65536)
        except OSError as exc:
            phase = "connect" if not stream.status else "cut"
            self._end(stream, f"{phase}: {exc!r}")
            return
        now = time.monotonic()
        if not data:
            if stream.done:
                self._end(stream, "")
            else:
                self._end(
                    stream, "cut: closed before [DONE]" if stream.status else "connect: closed"
                )
            return
        if not stream.status:
            self._read_head(stream, data, now)
            return
        self._read_body(stream, data, now)

    def _read_head(self, stream: Stream, data: bytes, now: float) -> None:
        stream.head += data
        head, sep, rest = stream.head.partition(b"\r\n\r\n")
        if not sep:
            return
        self._connecting -= 1
        stream.head_at = stream.last_at = now
        try:
            stream.status = int(head.split(b" ", 2)[1])
        except (IndexError, ValueError):
            stream.status = -1
        stream.head = head
        if stream.status != 200:
            self._end(stream, f"status: {head[:60]!r}")
            return
        self.held_now += 1
        self.peak_held = max(self.peak_held, self.held_now)
        if self.held_now == len(self.streams) and not self.all_held_at:
            self.all_held_at = now
        if rest:
            self._read_body(stream, rest, now)

    def _read_body(self, stream: Stream, data: bytes, now: float) -> None:
        if not stream.first_data_at:
            stream.max_gap = max(stream.max_gap, now - stream.last_at)
        else:
            stream.max_data_gap = max(stream.max_data_gap, now - stream.last_at)
        stream.last_at = now
        seen = stream.tail + data
        stream.pings += seen.count(PING) - stream.tail.count(PING)
        if not stream.first_data_at and DATA in seen:
            stream.first_data_at = now
            if not self.to_end:  # read no more: the stream goes on unread
                assert stream.sock is not None
                self.sel.unregister(stream.sock)
        if DONE in seen:
            stream.done = True
        stream.tail = seen[-_TAIL:]

    def _end(self, stream: Stream, error: str) -> None:
        if stream.ended_at:
            return
        if stream.status == 200:
            self.held_now -= 1
        elif stream.sock is not None and not stream.head_at:
            self._connecting -= 1
        stream.ended_at = time.monotonic()
        self.ended += 1
        stream.error = error
        if stream.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(stream.sock)
            stream.sock.close()


class ManyStreams(HeldStreams):
    """Open many streams and read each to its first data event, then leave it open, unread.

    ``open(requests)`` connects them ``batch`` at a time and returns when every one has its
    first data event, failed, or ``timeout`` passed (a stream without one then fails).
    ``close_all()`` closes every socket.
    """

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port, to_end=False)

    def open(self, requests: Iterable[bytes], *, batch: int = 100, timeout: float = 60.0) -> None:
        self.batch = batch
        self.add(list(requests))
        self.run(lambda: not self.opening, time.monotonic() + timeout)
        for stream in self.streams:
            if not stream.ended_at and not stream.first_data_at:
                self._end(stream, "timeout: no first event before the timeout")

    @property
    def streaming(self) -> int:
        """Streams that had their first data event and have not failed."""
        return sum(1 for s in self.streams if s.first_data_at and not s.error)

    @property
    def failures(self) -> list[str]:
        return [s.error for s in self.streams if s.error]

    @property
    def conns(self) -> list[Socketed]:
        """The socket of each stream that was given one."""
        return [Socketed(s.sock) for s in self.streams if s.sock is not None]


@dataclass(frozen=True)
class Socketed:
    """A stream's socket (bench/load/cluster.py closes the ones of ``ManyStreams.conns``)."""

    sock: socket.socket
