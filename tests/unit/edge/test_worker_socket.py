"""The worker's client socket: a write that fits goes in one send, a larger one still whole.
(The watcher that notices the caller leaving is tests/unit/streams/test_disconnect.py's.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import gevent
import gevent.socket
import pytest

from app.edge.worker import _OneSendSocket


class _Counted(_OneSendSocket):
    __slots__ = ()
    sends: list[int] = []  # one test at a time
    asked = 0

    def send(self, data, flags=0, **kw):
        sent = super().send(data, flags, **kw)
        _Counted.sends.append(sent)
        return sent

    def getsockopt(self, *args):
        _Counted.asked += 1
        return super().getsockopt(*args)


@pytest.fixture
def pair() -> Iterator[tuple[_Counted, gevent.socket.socket]]:
    a, peer = gevent.socket.socketpair()
    ours = _Counted(a.family, a.type, a.proto, a.detach())
    _Counted.sends, _Counted.asked = [], 0
    yield ours, peer
    ours.close()
    peer.close()


def test_a_write_that_fits_is_one_send_without_asking_the_buffer_size(pair) -> None:
    ours, peer = pair
    ours.sendall(b"data: {}\n\n")
    assert peer.recv(100) == b"data: {}\n\n"
    assert _Counted.sends == [10] and _Counted.asked == 0


def test_a_write_larger_than_the_buffer_arrives_whole_and_in_order(pair) -> None:
    ours, peer = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    data = bytes(range(256)) * 16384  # 4 MiB: many sends, the reader drains meanwhile
    reader = gevent.spawn(lambda: b"".join(iter(lambda: peer.recv(65536), b"")))
    ours.sendall(data)
    ours.shutdown(socket.SHUT_WR)
    assert reader.get(timeout=10) == data
    assert len(_Counted.sends) >= 1 and _Counted.sends[0] < len(data)
