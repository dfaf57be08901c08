"""A TCP fault proxy on loopback: pass bytes through, or delay, stall, reset or refuse them.

Protocol-agnostic (Memcached today, HTTP upstreams later). netem and Toxiproxy are not
available on these machines (docs/stack-notes.md), so faults are injected here.

One thread owns every socket and runs a ``selectors`` loop; the test thread only changes the
mode and wakes the loop through a socket pair. That keeps closes and resets race-free: no
socket is ever closed under another thread's blocked ``recv``.

Modes (changeable while running):

- ``pass``: bytes flow both ways.
- ``latency(seconds)``: each chunk from the target reaches the client ``seconds`` after it
  arrived (order kept; chunks are delayed one by one, not cumulatively).
- ``stall``: connections are accepted and read, nothing is forwarded in either direction, so
  the client waits for an answer that never comes.
- ``reset``: existing connections are reset (SO_LINGER 0 then close sends RST); new ones are
  accepted and reset at once.
- ``down`` (alias ``refuse``): the port stops listening (connects are refused) and existing
  connections are closed, as when the server process stops. Leaving ``down`` listens again
  on the same port.

Connects to the target are blocking with a short timeout: the targets are loopback servers.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

_CHUNK = 65536
_BACKPRESSURE = 1 << 20  # stop reading a side while this much waits to be written
_CONNECT_TIMEOUT_S = 1.0

PASS, LATENCY, STALL, RESET, DOWN = "pass", "latency", "stall", "reset", "down"


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@dataclass(eq=False)
class _Side:
    sock: socket.socket
    out: bytearray = field(default_factory=bytearray)  # ready to write to this socket
    eof: bool = False  # this socket sent FIN
    shut: bool = False  # we sent FIN to this socket


@dataclass(eq=False)
class _Link:
    """One client connection and, unless born stalled, its connection to the target."""

    client: _Side
    target: _Side | None
    # Chunks from the target waiting for their delivery time; b"" marks the target's EOF.
    delayed: collections.deque[tuple[float, bytes]] = field(default_factory=collections.deque)


class FaultProxy:
    """``FaultProxy(host, port)``: listens on ``127.0.0.1:<.port>`` and forwards to the target."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.host = listen_host
        self._listener: socket.socket | None = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._mode = PASS
        self._latency = 0.0
        self._applied = (PASS, 0.0)  # what the loop has put into effect
        self._closed = False
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._links: list[_Link] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.accepted = 0  # connections accepted over the proxy's life

    # -- control (any thread) ---------------------------------------------------------
    def start(self) -> FaultProxy:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"faultproxy:{self.port}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        else:
            self._close_all()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str, latency: float = 0.0) -> None:
        if mode == "refuse":
            mode = DOWN
        if mode not in (PASS, LATENCY, STALL, RESET, DOWN):
            raise ValueError(f"unknown fault mode {mode!r}")
        with self._lock:
            self._mode, self._latency = mode, latency
        self._wake()
        # The loop applies the change; wait for it so the next line of a test sees it.
        deadline = time.monotonic() + 2
        while self._thread is not None and time.monotonic() < deadline:
            with self._lock:
                if self._applied == (mode, latency):
                    return
            time.sleep(0.002)

    def pass_through(self) -> None:
        self.set_mode(PASS)

    def latency(self, seconds: float) -> None:
        self.set_mode(LATENCY, seconds)

    def stall(self) -> None:
        self.set_mode(STALL)

    def reset(self) -> None:
        self.set_mode(RESET)

    def down(self) -> None:
        self.set_mode(DOWN)

    refuse = down

    @property
    def open_links(self) -> int:
        return len(self._links)

    # -- the loop (proxy thread only) -------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, port))
        sock.listen(128)
        sock.setblocking(False)
        return sock

    def _run(self) -> None:
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._listener is not None:
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        try:
            while not self._stopping:
                self._sync_mode()
                self._deliver_due()
                self._update_interest()
                for key, events in self._sel.select(self._next_timeout()):
                    self._dispatch(key, events)
        finally:
            self._close_all()

    def _sync_mode(self) -> None:
        with self._lock:
            wanted = (self._mode, self._latency)
        if wanted == self._applied:
            return
        mode = wanted[0]
        if mode == DOWN:
            if self._listener is not None:
                self._sel.unregister(self._listener)
                self._listener.close()
                self._listener = None
            for link in list(self._links):
                self._drop(link, rst=False)
        else:
            if self._listener is None:
                self._listener = self._listen(self.port)
                self._sel.register(self._listener, selectors.EVENT_READ, "accept")
            if mode == RESET:
                for link in list(self._links):
                    self._drop(link, rst=True)
            elif mode == STALL:
                for link in self._links:
                    link.delayed.clear()
                    if link.target is not None:
                        link.target.out.clear()
                    link.client.out.clear()
            else:  # pass / latency: connections born stalled have no target; end them
                for link in [lk for lk in self._links if lk.target is None]:
                    self._drop(link, rst=False)
        with self._lock:
            self._applied = wanted

    def _next_timeout(self) -> float | None:
        dues = [link.delayed[0][0] for link in self._links if link.delayed]
        if not dues:
            return None
        return max(0.0, min(dues) - time.monotonic())

    def _deliver_due(self) -> None:
        now = time.monotonic()
        for link in self._links:
            while link.delayed and link.delayed[0][0] <= now:
                _, data = link.delayed.popleft()
                if data:
                    link.client.out += data
                else:
                    self._half_close(link.client)

    def _update_interest(self) -> None:
        for link in self._links:
            for side, other in self._pairs(link):
                events = 0
                if not side.eof and (other is None or len(other.out) < _BACKPRESSURE):
                    events |= selectors.EVENT_READ
                if side.out:
                    events |= selectors.EVENT_WRITE
                self._set_interest(side.sock, events, link)

    def _set_interest(self, sock: socket.socket, events: int, link: _Link) -> None:
        try:
            current = self._sel.get_key(sock).events
        except KeyError:
            current = 0
        if events == current:
            return
        if current and events:
            self._sel.modify(sock, events, link)
        elif events:
            self._sel.register(sock, events, link)
        else:
            self._sel.unregister(sock)

    @staticmethod
    def _pairs(link: _Link) -> list[tuple[_Side, _Side | None]]:
        if link.target is None:
            return [(link.client, None)]
        return [(link.client, link.target), (link.target, link.client)]

    def _dispatch(self, key: selectors.SelectorKey, events: int) -> None:
        if key.data == "wake":
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
            return
        if key.data == "accept":
            self._accept()
            return
        link: _Link = key.data
        if link not in self._links:
            return
        side = link.client if key.fileobj is link.client.sock else link.target
        assert side is not None
        try:
            if events & selectors.EVENT_WRITE:
                self._flush(link, side)
            if events & selectors.EVENT_READ and link in self._links:
                self._read(link, side)
        except OSError:
            self._drop(link, rst=True)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self.accepted += 1
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = self._applied[0]
        if mode == RESET:
            _reset(client)
            return
        target = None
        if mode != STALL:
            try:
                target = socket.create_connection(self.target, timeout=_CONNECT_TIMEOUT_S)
            except OSError:
                _reset(client)
                return
            target.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target.setblocking(False)
        client.setblocking(False)
        self._links.append(_Link(_Side(client), _Side(target) if target else None))

    def _read(self, link: _Link, side: _Side) -> None:
        data = side.sock.recv(_CHUNK)
        mode, delay = self._applied
        from_target = side is link.target
        if not data:
            side.eof = True
            if link.target is None:  # a stalled-born connection: nothing to forward
                self._drop(link, rst=False)
            elif from_target and mode == LATENCY:
                link.delayed.append((time.monotonic() + delay, b""))
            else:
                other = link.client if from_target else link.target
                self._half_close(other)
            self._maybe_done(link)
            return
        if mode == STALL or link.target is None:
            return  # read and swallowed: the other side never hears of it
        if from_target:
            if mode == LATENCY or link.delayed:  # keep order behind already delayed chunks
                link.delayed.append((time.monotonic() + delay, data))
            else:
                link.client.out += data
        else:
            link.target.out += data

    def _flush(self, link: _Link, side: _Side) -> None:
        if side.out:
            sent = side.sock.send(side.out)
            del side.out[:sent]
        if not side.out and side.shut:
            with contextlib.suppress(OSError):
                side.sock.shutdown(socket.SHUT_WR)
        self._maybe_done(link)

    def _half_close(self, side: _Side) -> None:
        side.shut = True
        if not side.out:
            with contextlib.suppress(OSError):
                side.sock.shutdown(socket.SHUT_WR)

    def _maybe_done(self, link: _Link) -> None:
        sides = [s for s, _ in self._pairs(link)]
        if all(s.eof and s.shut and not s.out for s in sides) and not link.delayed:
            self._drop(link, rst=False)

    def _drop(self, link: _Link, *, rst: bool) -> None:
        if link not in self._links:
            return
        self._links.remove(link)
        for side, _ in self._pairs(link):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(side.sock)
            if rst:
                _reset(side.sock)
            else:
                side.sock.close()

    def _close_all(self) -> None:
        if self._closed:
            return
        self._closed = True
        for link in list(self._links):
            self._drop(link, rst=False)
        if self._listener is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self._listener)
            self._listener.close()
            self._listener = None
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
