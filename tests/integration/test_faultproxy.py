"""The fault proxy itself (tests/support/faultproxy.py), protocol-agnostic: an echo server, a
byte source or a byte sink on loopback behind it.

Every condition is measured in bytes on the wire and generous time bounds: a lower bound
shows the fault happened, an upper bound (plus SLACK) that it happened once, not piled up.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from tests.support.faultproxy import FaultProxy

MiB = 1024 * 1024
SLACK = 0.5  # added to upper duration bounds: generous, never a tight timing assert

Handler = Callable[[socket.socket], None]
T = TypeVar("T")


class Server:
    """A loopback TCP server running ``handler(conn)`` in a thread per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self.handler, args=(conn,), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        self.listener.close()
        self.thread.join(2)
        for conn in self.conns:
            conn.close()


def echo(conn: socket.socket) -> None:
    try:
        while data := conn.recv(65536):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class Source:
    """Sends ``payload`` on each connection, then closes it and notes when."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.closed_at = 0.0

    def __call__(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(self.payload)
        conn.close()
        self.closed_at = time.monotonic()


class Sink:
    """Reads a connection to its end: the bytes, when the first came, when and how it ended."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.first_at = self.end_at = 0.0
        self.end = ""
        self.done = threading.Event()

    def __call__(self, conn: socket.socket) -> None:
        self.end = read_to_end(conn, self.data, self)
        self.end_at = time.monotonic()
        conn.close()
        self.done.set()


def read_to_end(sock: socket.socket, into: bytearray, sink: Sink | None = None) -> str:
    """Read until EOF or an error; return ``"eof"`` or the error's class name."""
    try:
        while data := sock.recv(MiB):
            if sink is not None and not into:
                sink.first_at = time.monotonic()
            into += data
    except OSError as exc:
        return type(exc).__name__
    return "eof"


@pytest.fixture
def behind_proxy() -> Iterator[Callable[[Handler], FaultProxy]]:
    made: list[tuple[Server, FaultProxy]] = []

    def make(handler: Handler) -> FaultProxy:
        server = Server(handler)
        made.append((server, FaultProxy("127.0.0.1", server.port).start()))
        return made[-1][1]

    yield make
    for server, proxy in made:
        proxy.stop()
        server.close()


@pytest.fixture
def echo_proxy(behind_proxy) -> FaultProxy:
    return behind_proxy(echo)


def connect(proxy: FaultProxy, timeout: float = 2) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def timed(call: Callable[[], T]) -> tuple[T, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


def round_trip(sock: socket.socket, payload: bytes) -> tuple[bytes, float]:
    start = time.monotonic()
    sock.sendall(payload)
    got = bytearray()
    while len(got) < len(payload):
        got += sock.recv(MiB)
    return bytes(got), time.monotonic() - start


def mismatch(got: bytes | bytearray, want: bytes) -> str:
    """ "" when equal, else a short account (pytest's own diff of megabytes takes minutes)."""
    if got == want:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    where = f"first difference at byte {at}" if at is not None else "one is a prefix of the other"
    return f"{len(got)} bytes instead of {len(want)}: {where}"


def proxy_cpu_seconds(proxy: FaultProxy) -> float:
    thread = next(t for t in threading.enumerate() if t.name == f"faultproxy:{proxy.port}")
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


# -- the modes ------------------------------------------------------------------------------
def test_proxy_passes_bytes_and_half_closes(echo_proxy: FaultProxy) -> None:
    with connect(echo_proxy) as sock:
        payload = os.urandom(3 * MiB)
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            got += sock.recv(MiB)
        sender.join()
        assert not mismatch(got, payload)
        sock.shutdown(socket.SHUT_WR)  # the echo server sees EOF and closes its side
        assert sock.recv(10) == b""


def test_proxy_latency_delays_each_reply_chunk(echo_proxy: FaultProxy) -> None:
    with connect(echo_proxy) as sock:
        echo_proxy.latency(0.5)
        sock.sendall(b"ping")
        reply, took = timed(lambda: sock.recv(10))
        assert reply == b"ping" and 0.45 < took < 0.5 + SLACK
        echo_proxy.pass_through()
        sock.sendall(b"pong")
        reply, took = timed(lambda: sock.recv(10))
        assert reply == b"pong" and took < 0.4


def test_proxy_stall_reads_and_never_answers(echo_proxy: FaultProxy) -> None:
    echo_proxy.stall()
    with connect(echo_proxy) as sock:
        sock.settimeout(0.3)
        sock.sendall(b"hello")
        with pytest.raises(TimeoutError):
            sock.recv(10)


def test_proxy_reset_and_down(echo_proxy: FaultProxy) -> None:
    with connect(echo_proxy) as sock:
        sock.sendall(b"a")
        assert sock.recv(10) == b"a"
        echo_proxy.reset()
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
    # New connections are accepted, then reset (a loaded machine may see the RST in connect).
    with pytest.raises(ConnectionResetError), connect(echo_proxy) as sock:
        sock.sendall(b"b")
        sock.recv(10)
    echo_proxy.down()
    with pytest.raises(ConnectionRefusedError):
        connect(echo_proxy)
    echo_proxy.pass_through()  # listens again on the same port
    with connect(echo_proxy) as sock:
        sock.sendall(b"c")
        assert sock.recv(10) == b"c"


def test_stall_is_a_blackhole_that_holds_fins_until_it_ends(echo_proxy: FaultProxy) -> None:
    """A FIN is no answer either: the echo server would close at once if it heard it."""
    with connect(echo_proxy, timeout=0.5) as before:
        assert round_trip(before, b"a")[0] == b"a"
        echo_proxy.stall()
        with connect(echo_proxy, timeout=0.5) as during:
            for sock in (before, during):
                sock.sendall(b"lost")
                sock.shutdown(socket.SHUT_WR)
            for sock in (before, during):
                with pytest.raises(TimeoutError):
                    sock.recv(10)
            echo_proxy.pass_through()
            # The held FIN reaches the echo server, which closes; the stall-born link ends.
            for sock in (before, during):
                assert sock.recv(10) == b""


# -- latency per direction ------------------------------------------------------------------
def test_latency_each_way_is_added_once_per_chunk_in_order(echo_proxy: FaultProxy) -> None:
    with connect(echo_proxy) as sock:
        echo_proxy.latency(0.2, to_target=0.2)
        reply, took = round_trip(sock, b"ping")
        assert reply == b"ping" and 0.38 <= took < 0.4 + SLACK
        # Ten chunks 50 ms apart: each waits 0.4 s from its own arrival, not behind the others
        # (piled up, the last would come after 10 x 0.2 s).
        start = time.monotonic()
        for n in range(10):
            sock.sendall(b"%d" % n)
            time.sleep(0.05)
        got = bytearray()
        while len(got) < 10:
            got += sock.recv(10)
        took = time.monotonic() - start
        assert got == b"0123456789" and 0.8 <= took < 0.85 + SLACK


def test_latency_to_target_delays_what_the_target_receives(behind_proxy) -> None:
    sink = Sink()
    proxy = behind_proxy(sink)
    proxy.latency(0.0, to_target=0.3)
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"request")
        sock.shutdown(socket.SHUT_WR)
        assert sink.done.wait(3)
    assert sink.data == b"request" and sink.end == "eof"
    assert 0.28 <= sink.first_at - start < 0.3 + SLACK


def test_connect_latency_delays_a_new_connections_first_flight(echo_proxy: FaultProxy) -> None:
    echo_proxy.latency(0.1, to_target=0.1)
    with connect(echo_proxy) as before:
        round_trip(before, b"accepted before")  # the proxy has accepted it
        echo_proxy.connect_latency(0.3)
        reply, took = round_trip(before, b"old")
        assert reply == b"old" and took < 0.4  # only connections accepted from now on wait
    with connect(echo_proxy) as sock:
        # The handshake's round trip, then the request's: 0.3 + 0.1 + 0.1.
        reply, took = round_trip(sock, b"first")
        assert reply == b"first" and 0.48 <= took < 0.5 + SLACK
        reply, took = round_trip(sock, b"reused")
        assert reply == b"reused" and 0.18 <= took < 0.4
    with connect(echo_proxy) as sock:
        # A client busy after connect() (loading certificates) would have started that work
        # only once the handshake was done: the round trip still comes after it, not during.
        time.sleep(0.3)
        reply, took = round_trip(sock, b"late")
        assert reply == b"late" and 0.48 <= took < 0.5 + SLACK


def test_lowering_latency_keeps_order(echo_proxy: FaultProxy) -> None:
    with connect(echo_proxy) as sock:
        echo_proxy.latency(0.5)
        sock.sendall(b"a")
        time.sleep(0.1)
        echo_proxy.pass_through()
        sock.sendall(b"b")  # echoed at once, but waits behind "a"
        got, took = timed(lambda: sock.recv(10))
        assert got.startswith(b"a") and took >= 0.25
        assert got + (b"" if len(got) == 2 else sock.recv(10)) == b"ab"


# -- bandwidth ------------------------------------------------------------------------------
def test_bandwidth_to_client(behind_proxy) -> None:
    payload = os.urandom(100_000)
    proxy = behind_proxy(Source(payload))
    proxy.bandwidth(200_000)
    got = bytearray()
    start = time.monotonic()
    with connect(proxy) as sock:
        assert read_to_end(sock, got) == "eof"
    took = time.monotonic() - start
    assert not mismatch(got, payload)
    assert 0.4 <= took < 3


def test_bandwidth_to_target(behind_proxy) -> None:
    sink = Sink()
    proxy = behind_proxy(sink)
    proxy.bandwidth(None, to_target=200_000)
    payload = os.urandom(100_000)
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        assert sink.done.wait(5)
    assert not mismatch(sink.data, payload)
    assert 0.4 <= sink.end_at - start < 3


def test_bandwidth_for_10_mb_sleeps_between_sends(behind_proxy) -> None:
    payload = os.urandom(10_000_000)
    proxy = behind_proxy(Source(payload))
    proxy.bandwidth(5_000_000)
    cpu_before = proxy_cpu_seconds(proxy)
    got = bytearray()
    start = time.monotonic()
    with connect(proxy, timeout=5) as sock:
        assert read_to_end(sock, got) == "eof"
    took = time.monotonic() - start
    cpu = proxy_cpu_seconds(proxy) - cpu_before
    assert not mismatch(got, payload)
    assert 1.9 <= took < 2 + 3 * SLACK
    assert cpu < 0.5, f"the proxy thread used {cpu:.2f} s of CPU in {took:.2f} s"


def test_bandwidth_switched_on_and_off_mid_transfer(behind_proxy) -> None:
    payload = os.urandom(1_000_000)
    proxy = behind_proxy(Source(payload))
    proxy.bandwidth(100_000)  # 10 s for the whole payload
    got = bytearray()
    with connect(proxy) as sock:
        start = time.monotonic()
        while time.monotonic() - start < 0.5:
            got += sock.recv(MiB)
        assert 20_000 <= len(got) <= 100_000
        proxy.bandwidth(None)
        assert read_to_end(sock, got) == "eof"
    assert not mismatch(got, payload)
    assert time.monotonic() - start < 0.5 + 2 * SLACK


# -- reset after N bytes --------------------------------------------------------------------
def test_reset_after_bytes_to_client(behind_proxy) -> None:
    payload = os.urandom(5000)
    proxy = behind_proxy(Source(payload))
    proxy.reset_after(1000, "to_client")
    got = bytearray()
    with connect(proxy) as sock:
        time.sleep(0.2)  # the RST is already there: the 1000 bytes are still read first
        assert read_to_end(sock, got) == "ConnectionResetError"
    assert not mismatch(got, payload[:1000])


def test_reset_after_bytes_waits_until_they_are_received(behind_proxy) -> None:
    """The last bytes wait in the proxy's send queue while the client's buffer is full: an
    immediate RST would throw them away."""
    payload = os.urandom(2 * MiB)
    proxy = behind_proxy(Source(payload))
    proxy.reset_after(MiB, "to_client")
    got = bytearray()
    with connect(proxy) as sock:
        time.sleep(0.3)  # the client does not read yet: its receive buffer fills up
        assert read_to_end(sock, got) == "ConnectionResetError"
    assert not mismatch(got, payload[:MiB])


def test_reset_after_the_request_was_sent(behind_proxy) -> None:
    sink = Sink()
    proxy = behind_proxy(sink)
    request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    proxy.reset_after(len(request), "to_target")
    with connect(proxy) as sock:
        sock.sendall(request)
        assert read_to_end(sock, bytearray()) == "ConnectionResetError"
        assert sink.done.wait(3)
    assert sink.data == request and sink.end == "ConnectionResetError"


def test_reset_after_total_bytes_counts_both_ways_from_when_set(
    echo_proxy: FaultProxy,
) -> None:
    with connect(echo_proxy) as sock:
        assert round_trip(sock, b"x" * 700)[0] == b"x" * 700  # before the limit: not counted
        echo_proxy.reset_after(1000)
        sock.sendall(b"y" * 600)  # 600 bytes to the target leave 400 for the echo
        got = bytearray()
        assert read_to_end(sock, got) == "ConnectionResetError"
    assert got == b"y" * 400


# -- slow close -----------------------------------------------------------------------------
def test_slow_close_to_client(behind_proxy) -> None:
    source = Source(b"bye")
    proxy = behind_proxy(source)
    proxy.slow_close(0.3)
    with connect(proxy) as sock:
        got, took = timed(lambda: sock.recv(10))
        assert got == b"bye" and took < 0.25  # the bytes are not held, only the FIN
        assert sock.recv(10) == b""
        eof_at = time.monotonic()
    assert 0.28 <= eof_at - source.closed_at < 0.3 + SLACK


def test_slow_close_to_target(behind_proxy) -> None:
    sink = Sink()
    proxy = behind_proxy(sink)
    proxy.slow_close(0.0, to_target=0.3)
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"hi")
        sock.shutdown(socket.SHUT_WR)
        assert sink.done.wait(3)
    assert sink.data == b"hi" and sink.end == "eof"
    assert sink.first_at - start < 0.25 and 0.28 <= sink.end_at - start < 0.3 + SLACK


# -- everything at once, then nothing -------------------------------------------------------
def test_pass_through_clears_every_condition(echo_proxy: FaultProxy) -> None:
    echo_proxy.latency(0.3, to_target=0.3)
    echo_proxy.bandwidth(1000, to_target=1000)
    echo_proxy.reset_after(10)
    echo_proxy.slow_close(1.0, to_target=1.0)
    echo_proxy.connect_latency(1.0)
    assert echo_proxy.mode == "latency"
    echo_proxy.pass_through()
    with connect(echo_proxy) as sock:
        payload = os.urandom(200_000)
        reply, took = round_trip(sock, payload)
        assert not mismatch(reply, payload)
        assert took < 0.3
        sock.shutdown(socket.SHUT_WR)
        eof, took = timed(lambda: sock.recv(10))
        assert eof == b"" and took < 0.3
