"""A gunicorn worker's accept callback takes LLMGATE_ACCEPTS_PER_TURN connections a turn of its
loop, not gunicorn's one (app/patches/accepts.py); where gunicorn's or gevent's internals
moved, gunicorn's own server runs, said once.

Counted, not timed: connections waiting in a real listening socket's queue, and one call of
gevent's accept callback (what the loop runs once a turn while the listener is readable);
and gunicorn's own ``GeventWorker.run`` building its server after the swap."""

from __future__ import annotations

import logging
import socket as std_socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from gevent import socket
from gevent.server import StreamServer
from gunicorn.workers import ggevent

from app import patches
from app.patches import accepts

WAITING = 40


@pytest.fixture(autouse=True)
def _gunicorns_own(monkeypatch) -> Iterator[None]:
    """Each test starts from gunicorn's module as installed, and puts it back."""
    monkeypatch.setattr(ggevent, "StreamServer", StreamServer)
    monkeypatch.setattr(patches, "_refused", set())
    yield


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    yield sock
    sock.close()


def _taken_in_one_turn(server_class: Any, listener: socket.socket) -> int:
    """Connections the accept callback takes in one turn with WAITING in the queue, the
    server set up as gunicorn's run sets it up (max_accept 1, then start)."""
    taken: list[object] = []
    server = server_class(listener, handle=lambda *a: None, spawn=lambda *a: taken.append(a))
    server.max_accept = 1  # gunicorn's, with more than one worker
    clients = [std_socket.create_connection(listener.getsockname()) for _ in range(WAITING)]
    try:
        server.start()
        server._do_read()  # one turn: what the loop calls while the listener is readable
        return len(taken)
    finally:
        server.stop_accepting()
        for client in clients:
            client.close()
        for args in taken:
            args[-1][0].close()  # type: ignore[index]  # the accepted connection


def test_gunicorns_server_takes_one_connection_a_turn(listener) -> None:
    """The behaviour the patch changes, as gunicorn has it."""
    assert _taken_in_one_turn(StreamServer, listener) == 1


@pytest.mark.parametrize("setting", ["16", "64"])
def test_the_patched_server_takes_the_settings_connections_a_turn(listener, setting) -> None:
    accepts.install(2, {accepts.SETTING: setting})
    assert _taken_in_one_turn(ggevent.StreamServer, listener) == min(int(setting), WAITING)


def test_gunicorns_own_run_builds_the_patched_server(listener, caplog) -> None:
    """gunicorn's GeventWorker.run, unchanged, reads the swapped name and starts a server
    that takes the setting's connections a turn (its log line says so as it starts)."""
    accepts.install(2, {accepts.SETTING: "24"})
    worker = SimpleNamespace(
        cfg=SimpleNamespace(is_ssl=False, workers=2, graceful_timeout=1),
        sockets=[listener],
        worker_connections=10,
        server_class=None,
        handle=lambda *a: None,
        alive=False,  # build and start the servers, then stop at once
        notify=lambda: None,
        log=logging.getLogger("test"),
    )
    with caplog.at_level(logging.INFO, logger="llmgate.patches"):
        ggevent.GeventWorker.run(worker)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "accepts up to 24 new connections a turn" in line


@pytest.mark.parametrize(
    ("workers", "setting", "each_turn"),
    [(2, "1", 1), (2, "", 1), (1, "", 100), (1, "64", 100)],
)
def test_gunicorns_server_stays_where_the_setting_or_one_worker_says(
    workers, setting, each_turn
) -> None:
    """1 (the default): gunicorn's own. One worker: gunicorn leaves gevent's own 100 a turn."""
    assert accepts.install(workers, {accepts.SETTING: setting}) == each_turn
    assert ggevent.StreamServer is StreamServer


@pytest.mark.parametrize("bad", ["0", "many", "1001", "-3"])
def test_a_bad_setting_in_a_worker_is_the_default(bad, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="llmgate.patches"):
        assert accepts.per_turn({accepts.SETTING: bad}) == accepts.DEFAULT
    assert accepts.SETTING in caplog.records[0].getMessage()


def test_a_worker_that_builds_its_server_otherwise_keeps_gunicorns(monkeypatch, caplog) -> None:
    def run(self: Any) -> None:  # gunicorn moved the server's making elsewhere
        self.start()

    monkeypatch.setattr(ggevent.GeventWorker, "run", run)
    with caplog.at_level(logging.WARNING, logger="llmgate.patches"):
        assert accepts.install(2, {accepts.SETTING: "64"}) == 1
        assert accepts.install(2, {accepts.SETTING: "64"}) == 1
    assert ggevent.StreamServer is StreamServer
    assert len(caplog.records) == 1 and patches.refused() == {"accepts"}


def test_a_server_class_gevent_accepts_for_otherwise_is_not_swapped(monkeypatch) -> None:
    from gevent import baseserver

    def do_read(self: Any) -> None:  # reads no max_accept
        self.do_read()

    own = baseserver.BaseServer._do_read
    monkeypatch.setattr(baseserver.BaseServer, "_do_read", do_read)
    assert "max_accept" in (accepts.fits() or "")
    monkeypatch.setattr(baseserver.BaseServer, "_do_read", own)
    monkeypatch.setattr(ggevent, "StreamServer", object)
    assert "another server class" in (accepts.fits() or "")
    assert accepts.install(2, {accepts.SETTING: "64"}) == 1 and ggevent.StreamServer is object
