"""What the worker knows of a request body the app did not read (app/edge/unread_body.py): how much
is left, whether an answer begins before it was read, and the half-close after the answer."""

from __future__ import annotations

import io
import socket
import time

import gevent
import gevent.socket
import pytest

from app.edge.unread_body import (
    DRAIN_MAX_BYTES,
    CountedBody,
    body_length,
    counting_the_body,
    linger,
)


def _chunked(data: bytes) -> io.BytesIO:
    """A chunked body as gunicorn hands it over: ``read(n)`` gives at most ``n`` bytes, and
    nothing once the last chunk was read."""
    return io.BytesIO(data)


def test_a_body_of_known_length_counts_down_to_its_end() -> None:
    size = DRAIN_MAX_BYTES + 10
    body = CountedBody(io.BytesIO(b"x" * size), size)
    assert body.large_rest_unread()
    body.read(9)
    assert body.large_rest_unread()  # one byte more than gunicorn may drop
    body.read(1)
    assert not body.large_rest_unread()  # the rest is small: gunicorn reads and drops it
    body.read(DRAIN_MAX_BYTES)
    assert not body.large_rest_unread()


def test_an_empty_body_has_nothing_unread() -> None:
    assert not CountedBody(io.BytesIO(b""), 0).large_rest_unread()


def test_a_chunked_body_is_unread_until_a_read_finds_its_end() -> None:
    body = CountedBody(_chunked(b"x" * 10), None)
    assert body.large_rest_unread()
    assert body.read(10) == b"x" * 10
    assert body.large_rest_unread()  # its end is not known until a read returns nothing
    assert body.read(10) == b""
    assert not body.large_rest_unread()


@pytest.mark.parametrize(
    "read_all",
    [
        lambda b: b.read(),
        lambda b: b.read(-1),
        lambda b: b.readlines(),
        lambda b: list(b),
        lambda b: [b.readline() for _ in range(3)],
    ],
    ids=["read()", "read(-1)", "readlines()", "iteration", "readline() to its end"],
)
def test_every_way_of_reading_a_chunked_body_to_its_end_counts(read_all) -> None:
    body = CountedBody(_chunked(b"a\nb\n"), None)
    read_all(body)
    assert not body.large_rest_unread()


def test_a_read_of_nothing_is_not_the_end() -> None:
    body = CountedBody(_chunked(b"x"), None)
    assert body.read(0) == b"" and body.readline(0) == b""
    assert body.large_rest_unread()


@pytest.mark.parametrize(
    ("environ", "length"),
    [
        ({"CONTENT_LENGTH": "12"}, 12),
        ({}, 0),
        ({"CONTENT_LENGTH": ""}, 0),
        ({"HTTP_TRANSFER_ENCODING": "chunked"}, None),
        ({"HTTP_TRANSFER_ENCODING": "gzip, Chunked"}, None),
        ({"CONTENT_LENGTH": "x"}, None),
    ],
)
def test_the_declared_length(environ, length) -> None:
    assert body_length(environ) == length


def _answer_after_reading(read: int):
    """A WSGI app that reads ``read`` bytes of its body, then answers."""

    def app(environ, start_response):
        environ["wsgi.input"].read(read)
        start_response("401 UNAUTHORIZED", [("Content-Type", "application/json")])
        return [b"{}"]

    return app


@pytest.mark.parametrize(("read", "told"), [(0, True), (100, True), (10 * DRAIN_MAX_BYTES, False)])
def test_an_answer_begun_with_a_large_rest_unread_is_told_before_it_starts(read, told) -> None:
    size = 2 * DRAIN_MAX_BYTES
    events: list[str] = []
    app = counting_the_body(_answer_after_reading(read), lambda environ: events.append("told"))
    environ = {"wsgi.input": io.BytesIO(b"x" * size), "CONTENT_LENGTH": str(size)}
    assert list(app(environ, lambda *a: events.append("started"))) == [b"{}"]
    assert events == (["told", "started"] if told else ["started"])


@pytest.fixture
def pair():
    ours, peer = gevent.socket.socketpair()
    yield ours, peer
    ours.close()
    peer.close()


def test_linger_ends_the_answer_with_a_fin_and_returns_when_the_peer_closes(pair) -> None:
    ours, peer = pair
    peer.settimeout(5)
    ours.sendall(b"the answer")
    peer.sendall(b"body the server never read" * 1000)
    lingering = gevent.spawn(linger, ours, 30)
    assert peer.recv(100) == b"the answer"
    assert peer.recv(100) == b""  # a FIN after the answer, no RST: nothing unread is left
    peer.close()
    lingering.join(timeout=5)
    assert lingering.dead and lingering.successful()


def test_linger_gives_up_after_its_time_on_a_peer_that_stays(pair) -> None:
    ours, _peer = pair
    started = time.monotonic()
    linger(ours, 0.2)
    assert 0.2 <= time.monotonic() - started < 5


def test_linger_on_a_connection_already_gone_returns_at_once(pair) -> None:
    ours, peer = pair
    peer.close()
    ours.close()
    linger(ours, 30)  # OSError on a closed socket: nothing to wait for


def test_linger_reads_what_arrives_meanwhile(pair) -> None:
    ours, peer = pair
    peer.settimeout(10)
    lingering = gevent.spawn(linger, ours, 30)
    for _ in range(50):  # far more than the socket buffers hold: linger must keep reading
        peer.sendall(b"y" * 65536)
    peer.shutdown(socket.SHUT_WR)
    lingering.join(timeout=10)
    assert lingering.dead
