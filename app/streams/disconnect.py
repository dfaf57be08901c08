"""Noticing a caller leave: EOF on the worker's client socket, within a millisecond, even
while nothing is being written.

gunicorn notices a vanished caller only when a write fails (seconds on a slow stream, never
while waiting for the first token). ``DisconnectWatcher`` puts an io watcher on the socket (a
callback in the hub's loop, not a greenlet per call) that tells whoever waits for the
caller; ``watch`` is the one way a call is watched: its trace learns the caller left, and
then whatever reads for it (a flight's listener, a call of the caller's own).
"""

from __future__ import annotations

import _socket
import os
import socket
from collections.abc import Callable

import gevent

from app.request.call import Call


def watch(call: Call, lost: Callable[[], None]) -> DisconnectWatcher:
    """Watch ``call``'s caller until the watcher is stopped: when it leaves, the call's trace
    says so and ``lost`` runs. Both run in the hub's loop, so they mark and wake, never
    block. What the watcher holds lives as long as the call's stream: the call's trace, not
    the call, which holds the caller's whole request body."""
    trace = call.trace

    def gone() -> None:
        trace.caller_left()
        lost()

    return DisconnectWatcher(call.client_socket, gone)


class DisconnectWatcher:
    """Calls ``on_gone`` when the caller's socket reads EOF; stops when told or on data.

    An io watcher on the socket rather than a greenlet waiting on it: no greenlet to spawn,
    keep (its stack, for the whole call) and kill per call. ``on_gone`` runs in the hub's
    loop, so it must not block: it marks the caller gone and wakes whoever waits for it.
    """

    def __init__(self, sock: socket.socket | None, on_gone: Callable[[], None]) -> None:
        self._io = None
        if sock is not None:
            self._io = gevent.get_hub().loop.io(sock.fileno(), 1)  # 1: readable
            self._io.start(self._readable, sock.fileno(), on_gone)

    def _readable(self, fd: int, on_gone: Callable[[], None]) -> None:
        self.stop()
        if _at_eof(fd):
            on_gone()
        # else the caller is sending more (pipelining): we cannot tell, so stop watching

    def stop(self) -> None:
        if self._io is not None:
            self._io.stop()
            self._io.close()
            self._io = None


def _at_eof(fd: int) -> bool:
    """Whether the connection on ``fd`` has ended (EOF or reset), without taking a byte.
    Through the C socket: gevent's would wait for data, and this runs in the hub."""
    try:
        probe = _socket.socket(fileno=os.dup(fd))
    except OSError:
        return True  # the descriptor is closed already
    try:
        return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # woken with nothing to read
    except OSError:
        return True  # reset
    finally:
        probe.close()
