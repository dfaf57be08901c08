"""A TCP fault proxy on loopback: pass bytes through, or delay, throttle, stall, reset or refuse.

Protocol-agnostic (Memcached and HTTP upstreams). netem and Toxiproxy are not available on
these machines (docs/stack-notes.md), so faults are injected here, for tests and benchmarks.

One thread owns every socket and runs a ``selectors`` loop; the test thread only changes the
settings and wakes the loop through a socket pair. That keeps closes and resets race-free: no
socket is ever closed under another thread's blocked ``recv``. The loop never sleeps except
in ``select``, whose timeout is the next moment a delayed chunk, a throttled send or a slow
FIN is due. The per-connection machinery is in tests/support/faultlink.py.

Modes (one at a time, changeable while running):

- ``pass``: bytes flow both ways. ``pass_through()`` also clears every condition below.
- ``latency(to_client, to_target=0.0)``: each chunk reaches the other side that many seconds
  after it arrived, per direction (order kept; chunks are delayed one by one, not
  cumulatively). ``latency(s)`` alone delays only target → client, as it always did.
- ``stall``, the blackhole: connections are accepted and read, nothing is passed on in
  either direction, FINs included, so the client waits for an answer that never comes.
  Connections open when the stall begins keep their target connection (the target hears
  nothing more); bytes read during the stall are lost, a FIN is held and passed on when the
  stall ends (an RST still resets the link). Connections accepted during the stall have no
  target and are closed when it ends.
- ``reset``: existing connections are reset (SO_LINGER 0 then close sends RST); new ones are
  accepted and reset at once.
- ``down`` (alias ``refuse``): the port stops listening (connects are refused) and existing
  connections are closed, as when the server process stops. Leaving ``down`` listens again
  on the same port.

Conditions, per connection and per direction, applied while the mode forwards (``pass``,
``latency``); they combine with each other and with the latency, are kept across mode
changes, and are cleared by ``pass_through()``:

- ``bandwidth(to_client, to_target=None, burst=None)``: bytes per second through a token
  bucket holding ``burst`` bytes (default 20 ms of the rate). A throttled side is not read
  once 1 MiB waits for it, so the sender is slowed down by TCP as on a real slow link.
- ``reset_after(nbytes, direction="total")``: once ``nbytes`` have been passed on in that
  direction (``"to_target"``, ``"to_client"``, or ``"total"``: both added), the connection
  is reset at both ends — after the receiver's kernel has the bytes, so a client reads
  exactly ``nbytes`` and then gets ECONNRESET. Counted from when the limit is set (or the
  connection opened, if later).
- ``slow_close(to_client, to_target=0.0)``: a FIN is passed on that many seconds after the
  EOF arrived (after the latency, and never before the bytes ahead of it).
- ``connect_latency(seconds)``: on a connection accepted from then on, what the client
  sends before anything has reached it (its first flight) waits that much more. The kernel
  completes the TCP handshake on loopback at once, so this is how a WAN's handshake round
  trip reaches a client that writes first (TLS, HTTP): ``latency(rtt / 2, rtt / 2)`` with
  ``connect_latency(rtt)`` makes a new connection's first answer take two round trips, a
  reused one's one. A server that speaks first is not delayed by it.

Connects to the target are blocking with a short timeout: the targets are loopback servers.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from tests.support.faultlink import (
    DOWN,
    FORWARDING,
    LATENCY,
    MODES,
    PASS,
    RESET,
    STALL,
    TO_CLIENT,
    TO_TARGET,
    TOTAL,
    Link,
    Settings,
    Side,
    reset_socket,
)

_CHUNK = 65536
_BACKPRESSURE = 1 << 20  # stop reading a side while this much waits to be written for it
_CONNECT_TIMEOUT_S = 1.0
_DRAIN_S = 1.0  # reset after N: wait this long at most for the N bytes to be received
_DRAIN_POLL_S = 0.005


class FaultProxy:
    """``FaultProxy(host, port)``: listens on ``127.0.0.1:<.port>`` and forwards to the target."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.host = listen_host
        self._listener: socket.socket | None = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._wanted = Settings()  # what the test thread asked for
        self._applied = Settings()  # what the loop has put into effect
        self._closed = False
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._links: list[Link] = []
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
        return self._wanted.mode

    @property
    def settings(self) -> Settings:
        return self._wanted

    def set_mode(self, mode: str, latency: float = 0.0) -> None:
        if mode == "refuse":
            mode = DOWN
        if mode not in MODES:
            raise ValueError(f"unknown fault mode {mode!r}")
        if mode == PASS:
            self._update(lambda s: Settings())
        elif mode == LATENCY:
            self.latency(latency)
        else:
            self._update(lambda s: replace(s, mode=mode))

    def pass_through(self) -> None:
        self.set_mode(PASS)

    def latency(self, to_client: float, to_target: float = 0.0) -> None:
        self._update(lambda s: s.shaped({"latency": to_client}, {"latency": to_target}, LATENCY))

    def bandwidth(
        self, to_client: float | None, to_target: float | None = None, *, burst: int | None = None
    ) -> None:
        """Bytes per second per direction (None: unlimited), per connection."""
        if any(rate is not None and rate <= 0 for rate in (to_client, to_target)):
            raise ValueError("a rate is a positive number of bytes per second, or None")
        client, target = {"rate": to_client, "burst": burst}, {"rate": to_target, "burst": burst}
        self._update(lambda s: s.shaped(client, target))

    def reset_after(self, nbytes: int | None, direction: str = TOTAL) -> None:
        """Reset each connection once ``nbytes`` have passed in ``direction`` (None: no limit)."""
        if direction not in (TOTAL, TO_CLIENT, TO_TARGET):
            raise ValueError(f"unknown direction {direction!r}")
        limit = {"reset_after": nbytes}
        client, target = (limit, {}) if direction == TO_CLIENT else ({}, limit)
        if direction == TOTAL:
            self._update(lambda s: replace(s, reset_after_total=nbytes))
        else:
            self._update(lambda s: s.shaped(client, target))

    def slow_close(self, to_client: float, to_target: float = 0.0) -> None:
        self._update(lambda s: s.shaped({"close_delay": to_client}, {"close_delay": to_target}))

    def connect_latency(self, seconds: float) -> None:
        """The TCP handshake's round trip, for connections accepted from now on."""
        self._update(lambda s: replace(s, connect_latency=seconds))

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

    def _update(self, change: Callable[[Settings], Settings]) -> None:
        with self._lock:
            self._wanted = wanted = change(self._wanted)
        self._wake()
        # The loop applies the change; wait for it so the next line of a test sees it.
        deadline = time.monotonic() + 2
        while self._thread is not None and time.monotonic() < deadline:
            with self._lock:
                if self._applied == wanted:
                    return
            time.sleep(0.002)

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
                now = time.monotonic()
                self._sync(now)
                self._pump(now)
                self._update_interest(now)
                for key, events in self._sel.select(self._next_timeout(now)):
                    self._dispatch(key, events)
        finally:
            self._close_all()

    def _sync(self, now: float) -> None:
        with self._lock:
            wanted = self._wanted
        old = self._applied
        if wanted == old:
            return
        if wanted.mode != old.mode:
            self._enter(wanted.mode, now)
        for link in self._links:
            for flow in link.flows:
                flow.set_conditions(getattr(wanted, flow.name), now)
                if wanted.budgets() != old.budgets():
                    flow.passed = 0
        with self._lock:
            self._applied = wanted

    def _enter(self, mode: str, now: float) -> None:
        if mode == DOWN:
            if self._listener is not None:
                self._sel.unregister(self._listener)
                self._listener.close()
                self._listener = None
            for link in list(self._links):
                self._drop(link, rst=False)
            return
        if self._listener is None:
            self._listener = self._listen(self.port)
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        if mode == RESET:
            for link in list(self._links):
                self._drop(link, rst=True)
        elif mode == STALL:
            for link in self._links:
                for flow in link.flows:
                    flow.discard()
        else:  # pass / latency: links born stalled have no target, end them; pass held FINs
            for link in list(self._links):
                if link.target is None:
                    self._drop(link, rst=False)
                for flow in link.flows:
                    if flow.src.eof and not flow.eof_queued:
                        flow.receive_eof(now)

    def _pump(self, now: float) -> None:
        """Deliver what is due; start and finish resets after N bytes; retire closed links."""
        forwarding = self._applied.mode in FORWARDING
        for link in list(self._links):
            if link.reset_by is not None:
                if link.drained() or now >= link.reset_by:
                    self._drop(link, rst=True)
                continue
            if forwarding and link.exhausted(self._applied.reset_after_total):
                link.reset_by = now + _DRAIN_S
                continue
            for flow in link.flows:
                flow.advance(now)
            if link.done():
                self._drop(link, rst=False)

    def _next_timeout(self, now: float) -> float | None:
        dues = [d for link in self._links if (d := link.next_due(now, _DRAIN_POLL_S)) is not None]
        if not dues:
            return None
        return max(0.0, min(dues) - time.monotonic())

    def _update_interest(self, now: float) -> None:
        for link in self._links:
            for side in link.sides:
                events = 0
                if link.reset_by is None:
                    src, dst = link.flow_from(side), link.flow_to(side)
                    if not side.eof and (src is None or src.queued < _BACKPRESSURE):
                        events |= selectors.EVENT_READ
                    if dst is not None and dst.can_send(now):
                        events |= selectors.EVENT_WRITE
                self._set_interest(side.sock, events, link)

    def _set_interest(self, sock: socket.socket, events: int, link: Link) -> None:
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

    def _dispatch(self, key: selectors.SelectorKey, events: int) -> None:
        if key.data == "wake":
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
            return
        if key.data == "accept":
            self._accept()
            return
        link: Link = key.data
        if link not in self._links:
            return
        side = link.side_of(key.fileobj)
        now = time.monotonic()
        try:
            flow = link.flow_to(side)
            if events & selectors.EVENT_WRITE and flow is not None:
                flow.send(now, link.budget(flow, self._applied.reset_after_total))
            if events & selectors.EVENT_READ:
                self._read(link, side, now)
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
        settings = self._applied
        if settings.mode == RESET:
            reset_socket(client)
            return
        target = None
        if settings.mode != STALL:
            try:
                target = socket.create_connection(self.target, timeout=_CONNECT_TIMEOUT_S)
            except OSError:
                reset_socket(client)
                return
            target.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target.setblocking(False)
        client.setblocking(False)
        now = time.monotonic()
        self._links.append(
            Link(
                client,
                target,
                settings.to_target,
                settings.to_client,
                now,
                settings.connect_latency,
            )
        )

    def _read(self, link: Link, side: Side, now: float) -> None:
        data = side.sock.recv(_CHUNK)
        flow = link.flow_from(side)  # None on a link born stalled: nothing to forward
        forwarding = self._applied.mode in FORWARDING
        if not data:
            side.eof = True
            if flow is not None and forwarding:
                flow.receive_eof(now)
            # In a stall the FIN is held: a blackhole never answers, not even with a close.
        elif flow is not None and forwarding:
            flow.receive(data, now, link.extra_latency(flow))
        # else: read and swallowed, the other side never hears of it

    def _drop(self, link: Link, *, rst: bool) -> None:
        if link not in self._links:
            return
        self._links.remove(link)
        for side in link.sides:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(side.sock)
            if rst:
                reset_socket(side.sock)
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
