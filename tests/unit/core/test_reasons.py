"""app/core/reasons.py: the reason quoted in an upstream error reads as words, never as urllib3's
repr of one of app/upstream/pools.py's classes. Each failure is made for real on loopback (a refused
connect, a name that does not resolve, a close, a reset, a cut body, a read timeout) through
the gateway's own pool classes, so a new urllib3 that words its errors differently shows
here."""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import urllib3
from urllib3.exceptions import HTTPError

from app.core.reasons import reason
from app.patches import chunked_reads
from app.upstream import pools

# A class name followed by its arguments, or an object's default repr: what must not show.
CLASS_REPR = re.compile(r"\b[A-Z]\w*(Connection|Pool|Error|Read|Disconnected|Line)\w*\(|<\w")


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _answer(head: bytes, then: Callable[[socket.socket], None] = socket.socket.close):
    def behave(conn: socket.socket) -> None:
        conn.sendall(head)
        then(conn)

    return behave


def _late_reset(conn: socket.socket) -> None:
    time.sleep(0.05)
    _reset(conn)


BEHAVIOURS: dict[str, Callable[[socket.socket], None]] = {
    "closed": socket.socket.close,
    "reset": _reset,
    "not-http": _answer(b"SSH-2.0-OpenSSH\r\n\r\n"),
    "short-length": _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"),
    "short-chunk": _answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"),
    "reset-mid-body": _answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n", _late_reset
    ),
    "silent": lambda conn: time.sleep(1.0),
}


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    listeners: list[socket.socket] = []

    def start(behave: Callable[[socket.socket], None]) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:  # closed after the behaviour (a second close does nothing)
                    conn.recv(65536)
                    behave(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for listener in listeners:
        listener.close()


def _failure(url: str) -> BaseException:
    """What the gateway's pools raise for ``url``: at the connect, or reading the body the way
    the gateway does (chunked_reads.body_reader)."""
    manager = urllib3.PoolManager(retries=False)
    manager.pool_classes_by_scheme = pools.pool_classes(None)
    try:
        resp = manager.request(
            "GET", url, preload_content=False, timeout=urllib3.Timeout(connect=1, read=0.3)
        )
        read = chunked_reads.body_reader(resp)
        while read(65536):
            pass
    except (HTTPError, OSError, http.client.HTTPException) as exc:
        return exc
    finally:
        manager.clear()
    raise AssertionError(f"{url} did not fail")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_refused_connect_names_the_address_not_the_connection_class() -> None:
    port = _closed_port()
    exc = _failure(f"http://127.0.0.1:{port}/v1")
    assert "CountingHTTPConnection" in str(exc)  # what urllib3 itself says
    text = reason(exc)
    assert text.startswith(f"127.0.0.1:{port}: ") and "Connection refused" in text, text
    assert not CLASS_REPR.search(text), text


def test_a_name_that_does_not_resolve_is_named() -> None:
    text = reason(_failure("http://no-such-host.invalid/v1"))
    assert "no-such-host.invalid" in text and "resolve" in text, text
    assert not CLASS_REPR.search(text), text


@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        ("closed", "closed the connection without an answer"),
        ("reset", "Connection reset by peer"),
        ("not-http", "does not begin with an HTTP status line"),
        ("short-length", "the body ended early (3 bytes read, 7 more expected)"),
        ("short-chunk", "the body ended early (0 bytes read)"),
        ("reset-mid-body", "Connection reset by peer"),
        ("silent", "Read timed out"),
    ],
)
def test_each_broken_answer_reads_as_words(server, behaviour: str, words: str) -> None:
    address = server(BEHAVIOURS[behaviour])
    text = reason(_failure(f"http://{address}/v1"))
    assert words in text, text
    assert not CLASS_REPR.search(text), text


def test_tls_to_a_plain_server_drops_openssls_source_position(server) -> None:
    address = server(socket.socket.close)
    text = reason(_failure(f"https://{address}/v1"))
    assert text.startswith("[SSL") and "_ssl.c" not in text, text


def test_an_exception_without_a_message_is_named_in_words() -> None:
    """pymemcache raises MemcacheUnexpectedCloseError() with no text: the Memcached log line
    read "failed (); skipping it"."""
    from pymemcache.exceptions import MemcacheUnexpectedCloseError

    assert reason(MemcacheUnexpectedCloseError()) == "memcache unexpected close"
    assert reason(ConnectionRefusedError(111, "Connection refused")) == (
        "[Errno 111] Connection refused"
    )
