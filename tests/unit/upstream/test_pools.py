"""The upstream pools' spares (app/upstream/pools.py): how many a pool opens behind a call
that had to open a connection on its way. A real listening socket on loopback is the
upstream; its own count of accepted connections is the independent figure."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import gevent
import pytest

from app.upstream import pools

# The server's ends of the connections accepted so far, kept open (a closed one would make
# the pool take its connection for dropped), and the pools and the connections taken from
# them: all closed with the listener, whatever the test found.
SERVER_ENDS: list[socket.socket] = []
OPENED: list = []


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()
        while OPENED:
            OPENED.pop().close()
        while SERVER_ENDS:
            SERVER_ENDS.pop().close()


def accepted(listener: socket.socket) -> int:
    """The connections waiting in the listener's queue (the kernel finished each handshake),
    taken: how many the pool opened since the last count."""
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        SERVER_ENDS.append(conn)
        count += 1


def pool_on(listener: socket.socket, ratio: float, maxsize: int = 100) -> tuple[Any, list]:
    spares: list[int] = []
    cls = pools.pool_classes(None, spare_ratio=ratio, on_spare=lambda: spares.append(1))["http"]
    pool = cls("127.0.0.1", listener.getsockname()[1], maxsize=maxsize, block=False)
    OPENED.append(pool)
    return pool, spares


def taken(pool, n: int) -> list:
    """``n`` connections taken from the pool, as calls take them."""
    conns = [pool._get_conn() for _ in range(n)]
    OPENED.extend(conns)
    return conns


def calls_at_once(pool, n: int) -> list:
    """``n`` calls holding a connection each, none given back: each found the pool empty
    and connected on its way, as a call does at its first request."""
    conns = taken(pool, n)
    for conn in conns:
        conn.connect()
    return conns


def test_spares_are_counted_over_the_busiest_moment_not_the_calls_left(listener) -> None:
    pool, spares = pool_on(listener, 0.5)
    conns = calls_at_once(pool, 20)
    # Most of the burst ends before the spares' greenlet runs: their connections go back
    # idle. They are not headroom over the 20 the moment had in use: 10 spares on top.
    for conn in conns[:15]:
        pool._put_conn(conn)
    gevent.sleep(0.1)
    assert accepted(listener) == 30
    assert len(spares) == 10
    assert pool.pool.qsize() == 100 - 5  # 25 idle, 70 free places; 5 still in use
    # A burst as busy as the last plus its spares finds every connection ready.
    for conn in conns[15:]:
        pool._put_conn(conn)
    again = taken(pool, 30)
    assert all(conn.sock is not None for conn in again)
    gevent.sleep(0.1)
    assert accepted(listener) == 0 and len(spares) == 10


def test_a_busier_moment_raises_the_level_and_no_spares_without_a_ratio(listener) -> None:
    pool, spares = pool_on(listener, 0.5)
    first = calls_at_once(pool, 4)
    gevent.sleep(0.1)
    assert accepted(listener) == 6 and len(spares) == 2
    # Six in use (the four and both spares) and four more opened on their way: ten at the
    # busiest, fifteen held after.
    more = taken(pool, 2) + calls_at_once(pool, 4)
    gevent.sleep(0.1)
    assert accepted(listener) == 4 + 5 and len(spares) == 7
    assert len(first + more) == 10

    plain, none = pool_on(listener, 0.0)
    conns = calls_at_once(plain, 5)
    gevent.sleep(0.1)
    assert accepted(listener) == 5 and none == [] and len(conns) == 5


def test_spares_stay_within_the_pool_size(listener) -> None:
    pool, spares = pool_on(listener, 1.0, maxsize=12)
    conns = calls_at_once(pool, 10)
    gevent.sleep(0.1)
    # Ten spares wanted, two free places.
    assert accepted(listener) == 12 and len(spares) == 2 and len(conns) == 10
