"""Noticing a caller leave (app/streams/disconnect.py): the watcher on the client socket calls
back from the hub at EOF, without a greenlet, and stops at data without taking it; ``watch``
tells the call's trace and the reader, and holds the call's trace, not the call."""

from __future__ import annotations

import gc
import weakref

import gevent
import gevent.socket

from app.request import routes
from app.request.call import Call
from app.streams.disconnect import DisconnectWatcher, watch


def test_the_disconnect_watcher_calls_on_gone_at_eof_from_the_hub_without_a_greenlet() -> None:
    ours, peer = gevent.socket.socketpair()
    gone: list[bool] = []
    active = gevent.get_hub().loop.activecnt
    watcher = DisconnectWatcher(ours, lambda: gone.append(True))
    assert gevent.get_hub().loop.activecnt == active + 1  # one io watcher, nothing spawned
    gevent.sleep(0.01)
    assert gone == []
    peer.close()
    gevent.sleep(0.05)
    assert gone == [True]
    watcher.stop()
    ours.close()


def test_the_disconnect_watcher_stops_on_data_without_taking_it() -> None:
    ours, peer = gevent.socket.socketpair()
    gone: list[bool] = []
    DisconnectWatcher(ours, lambda: gone.append(True))
    peer.sendall(b"GET / HTTP/1.1\r\n")  # a pipelined request: not a departure
    gevent.sleep(0.05)
    peer.close()
    gevent.sleep(0.05)
    assert gone == []  # it stopped watching at the data
    assert ours.recv(100) == b"GET / HTTP/1.1\r\n"  # the byte peeked is still there
    ours.close()


def test_watch_tells_the_trace_then_the_reader_and_holds_the_trace_not_the_call() -> None:
    ours, peer = gevent.socket.socketpair()
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"x" * 1000, ours)
    trace, told = call.trace, []
    watcher = watch(call, lambda: told.append(trace.client_closed))
    held = weakref.ref(call)
    del call
    gc.collect()
    assert held() is None  # the caller's request body is not kept as long as its stream
    peer.close()
    gevent.sleep(0.05)
    assert told == [True]  # the trace knew first, in the same turn of the hub's loop
    watcher.stop()
    ours.close()
