"""Waiting for a chunked event stream's next data without taking any of it: what a stream of
the caller's own does between heartbeats (app/patches/chunked_reads.py, ``wait_readable``).

Over a real socket pair with gevent's sockets, an upstream writes a chunked stream cut at
every kind of place (inside a size line, between the CRLF ending a chunk and the next size
line, inside data) with pauses longer than the wait; the reader waits, reads when told it
can, and must end with exactly the bytes sent and never be told the read cannot wait
(BUFFERED, when the reader arms no timer around it) when it would."""

from __future__ import annotations

import http.client
import itertools
import random
import struct
import time
from typing import Any, cast

import gevent
import pytest
from gevent import socket

from app.core.timers import Alarm
from app.patches import chunked_reads

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
WAIT_S = 0.02


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@pytest.mark.parametrize(
    ("seen", "chunk_left", "enough"),
    [
        (b"", None, False),
        (b"1a\r", None, False),  # a size line not whole yet
        (b"1a\r\n", None, False),  # whole, but no data after it: read1 would wait for some
        (b"1a\r\nd", None, True),
        (b"\r\n", 0, False),  # only the CRLF that ends the last chunk (the usual case)
        (b"\r\n1a\r\n", 0, False),
        (b"\r\n1a\r\nd", 0, True),
        (b"\r\n0\r\n\r\n", 0, True),  # the last chunk, and the CRLF that ends the body
        (b"x", 5, True),  # inside a chunk's data: any byte will do
        (b"", 5, False),
    ],
)
def test_what_read1_needs_buffered(seen: bytes, chunk_left: int | None, enough: bool) -> None:
    assert chunked_reads.enough_buffered(seen, chunk_left) is enough


def _read_through(pieces: list[bytes], pause: float) -> tuple[bytes, int, dict[int, int]]:
    """Send ``pieces`` with ``pause`` between them (longer than a wait); read the body as a
    stream of the caller's own does. The body read, the waits that said "not yet", and, by
    what the wait said (ARRIVED, BUFFERED), the reads that took longer than half a pause
    although told the data was there (the read is never interrupted: that could lose
    bytes, which is what the waits must not)."""
    ours, theirs = socket.socketpair()

    def upstream() -> None:
        for piece in pieces:
            theirs.sendall(piece)
            gevent.sleep(pause)
        theirs.close()

    writer = gevent.spawn(upstream)
    resp = http.client.HTTPResponse(ours)
    resp.begin()
    assert resp.chunked and chunked_reads.chunked_beneath(cast(Any, _Raw(resp))) is resp
    alarm = Alarm(WAIT_S)
    body, not_yet = b"", 0
    slow = {chunked_reads.ARRIVED: 0, chunked_reads.BUFFERED: 0}
    told = dict.fromkeys(slow, 0)
    while True:
        ready = chunked_reads.wait_readable(resp, alarm)
        if ready == chunked_reads.NOT_YET:
            not_yet += 1
            continue
        told[ready] += 1
        began = time.monotonic()
        data = resp.read1(65536)
        slow[ready] += time.monotonic() - began > pause / 2
        if not data:
            break
        body += data
    writer.join(5)
    alarm.close()
    ours.close()
    assert told[chunked_reads.BUFFERED] > 0  # the usual case: each chunk came whole
    return body, not_yet, slow


EVENTS = [b"data: %d %s\n\n" % (i, b"x" * (i * 7 % 40)) for i in range(30)]
WIRE = HEAD + b"".join(_chunk(e) for e in EVENTS) + b"0\r\n\r\n"


def test_between_whole_chunks_a_wait_says_not_yet_and_ready_never_lies() -> None:
    """Each event a chunk of its own, as providers write them: after each, the buffer holds
    the CRLF that ends it, and the wait must still see the pause."""
    pieces = [HEAD, *(_chunk(e) for e in EVENTS[:12]), b"0\r\n\r\n"]
    body, not_yet, slow = _read_through(pieces, pause=0.25)
    assert body == b"".join(EVENTS[:12])
    assert not_yet >= 12  # every pause seen as one: a heartbeat's turn
    assert slow == {chunked_reads.ARRIVED: 0, chunked_reads.BUFFERED: 0}


def test_cut_anywhere_a_wait_takes_nothing_and_nothing_is_lost() -> None:
    """Cut at random places (inside size lines, between a chunk's CRLF and the next line,
    inside data): whatever the waits said, the body read is exactly the one sent. (A read
    told ARRIVED may still wait for the rest of a line that arrived in parts: the rare case
    bench/HISTORY.md's "A call of its own" names; one told BUFFERED never does, for it runs
    without a timer.)"""
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(len(HEAD) + 1, len(WIRE)), 60))
    bounds = [0, len(HEAD), *cuts, len(WIRE)]
    pieces = [WIRE[a:b] for a, b in itertools.pairwise(bounds)]
    body, not_yet, slow = _read_through(pieces, pause=WAIT_S * 2.5)
    assert body == b"".join(EVENTS)
    assert not_yet >= len(pieces) // 2
    assert slow[chunked_reads.BUFFERED] == 0


def test_a_size_line_in_three_parts_is_read_as_one_that_can_wait() -> None:
    """A size line that arrives in three parts: once its second part is in, the socket had
    data but the line is still not whole, so the read that follows waits for the third.
    The wait must say ARRIVED (its reader then arms the idle timer around that read), never
    BUFFERED."""
    data = b"data: " + b"x" * 18 + b"\n\n"
    assert len(data) == 0x1A
    pieces = [HEAD, b"1", b"a", b"\r\n" + data + b"\r\n0\r\n\r\n"]
    body, _, slow = _read_through(pieces, pause=WAIT_S * 2.5)
    assert body == data
    assert slow == {chunked_reads.ARRIVED: 1, chunked_reads.BUFFERED: 0}


class _Raw:
    """What ``chunked_beneath`` reads of urllib3's response: its http.client one."""

    def __init__(self, fp: http.client.HTTPResponse) -> None:
        self._fp = fp
        self.headers: dict[str, str] = {}


def test_a_reset_is_left_to_the_read_to_report() -> None:
    """The upstream resets the connection after a chunk: the wait says "go on" rather than
    raise, so the read meets the reset and it is reported as the upstream's (a reset, not
    a bug of ours)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    ours = socket.create_connection(server.getsockname())
    theirs, _ = server.accept()
    server.close()
    theirs.sendall(HEAD + _chunk(b"data: a\n\n"))
    resp = http.client.HTTPResponse(ours)
    resp.begin()
    assert resp.read1(65536) == b"data: a\n\n"
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    theirs.close()  # with a zero linger: a reset, not an end
    gevent.sleep(0.05)
    alarm = Alarm(5)
    assert chunked_reads.wait_readable(resp, alarm) == chunked_reads.ARRIVED
    with pytest.raises((OSError, http.client.HTTPException)):
        resp.read1(65536)
    alarm.close()
    ours.close()


class _CountingSocket:
    """A gevent socket's own socket, counting the reads it refused as would-block (each a
    system call and an exception on a stream's way)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.would_block = 0

    def recv_into(self, *args: Any) -> int:
        try:
            return cast(int, self._real.recv_into(*args))
        except BlockingIOError:
            self.would_block += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_wait_after_a_whole_chunk_reads_nothing_before_the_socket_is_readable() -> None:
    """Each event a chunk of its own, a pause between them: once the CRLF that ends a chunk
    is taken, the buffer is empty, and the wait waits on the socket's watcher before its
    read, so no read is refused as would-block (gevent's read would try first, then wait);
    the body is the one sent, and each wait still says the data is there (BUFFERED)."""
    ours, theirs = socket.socketpair()
    pieces = [HEAD, *(_chunk(e) for e in EVENTS[:10]), b"0\r\n\r\n"]
    resp = http.client.HTTPResponse(ours)
    theirs.sendall(pieces[0] + pieces[1])
    resp.begin()
    counting = _CountingSocket(ours._sock)
    ours._sock = counting
    alarm = Alarm(5.0)

    def upstream() -> None:
        for piece in pieces[2:]:
            gevent.sleep(0.01)
            theirs.sendall(piece)

    writer = gevent.spawn(upstream)
    body, told = b"", []
    while True:
        told.append(chunked_reads.wait_readable(resp, alarm))
        data = resp.read1(65536)
        if not data:
            break
        body += data
    writer.join(5)
    alarm.close()
    ours._sock = counting._real
    ours.close()
    theirs.close()
    assert body == b"".join(EVENTS[:10])
    assert counting.would_block == 0
    assert set(told) == {chunked_reads.BUFFERED}


def test_only_gevents_own_socket_wait_is_waited_on_first() -> None:
    """The wait before a read is gevent's own (its sockets' ``_wait``, the one its reads use
    after a refused read); a socket class that waits otherwise, or is not gevent's, is read
    as before. A TLS socket is asked for its decrypted bytes first."""
    import socket as std_socket

    from gevent import ssl

    class WaitsOtherwise(socket.socket):
        def _wait(self, watcher: Any, timeout_exc: Any = None) -> None:
            raise AssertionError("not gevent's wait")

    waits = chunked_reads._waits_of
    assert waits(socket.socket) == chunked_reads._PLAIN
    assert waits(ssl.SSLSocket) == chunked_reads._TLS
    assert waits(std_socket.socket) == waits(WaitsOtherwise) == chunked_reads._NO_WAIT
