"""The accept loop and the keep-alive loop of each connection, on gevent.

One greenlet per connection: read a request, let ``App`` answer it, repeat until either side
wants to close. Every accepted socket gets TCP_NODELAY: a stream writes many small events,
and with Nagle's algorithm each one would wait for the ACK of the previous, which a
delayed-ACK client holds back for up to 40 ms on loopback. Nothing here is monkey-patched;
the simulator uses gevent's own sockets, so it stays safe to import anywhere.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from gevent.server import StreamServer

from .app import App, Config, Exchange, is_control, new_id
from .http11 import CONTINUE, ProtocolError, Request, RequestParser
from .responses import ApiError, dumps
from .stats import Stats
from .wire import ClientGone, Peer, base_headers, send_full

BACKLOG = 4096
RECV_SIZE = 64 * 1024


@dataclass
class _Connection:
    peer: Peer
    parser: RequestParser = field(default_factory=RequestParser)
    served: int = 0
    counted: int | None = None  # the stats epoch it was counted in, until known as control


class Server:
    """The simulator's TCP server; ``start()`` binds, ``stop()`` drains then kills."""

    def __init__(
        self,
        config: Config,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        backlog: int = BACKLOG,
        idle_timeout: float = 300.0,
    ) -> None:
        self.stats = Stats()
        self.app = App(config, self.stats)
        self.idle_timeout = idle_timeout
        self._server = StreamServer((host, port), self._handle, backlog=backlog)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float = 1.0) -> None:
        """Stop accepting, give open connections ``grace`` seconds, then kill them."""
        self._server.stop(timeout=grace)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.socket.getsockname()[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def _handle(self, sock: socket.socket, address: Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Also bounds a write to a client that stopped reading: the stream is abandoned.
        sock.settimeout(self.idle_timeout)
        conn = _Connection(Peer(sock))
        # Counted when accepted: a client's connection opened ahead of need (a pool's spare)
        # is a handshake made now, whenever it carries its first request.
        conn.counted = self.stats.epoch
        self.stats.connections_accepted += 1
        self.stats.connections_open += 1
        self.stats.connections_unused += 1
        try:
            self._serve(conn)
        except (OSError, ClientGone):
            pass  # the client reset or vanished mid-request: nothing left to answer
        finally:
            if conn.counted is not None:
                self.stats.connections_open -= 1
            if conn.served == 0:
                self.stats.connections_unused -= 1
            conn.peer.release()
            sock.close()

    def _serve(self, conn: _Connection) -> None:
        while True:
            request = self._read(conn.peer, conn.parser)
            if request is None:
                return
            conn.served += 1
            if conn.served == 1:
                self.stats.connections_unused -= 1
            if conn.served == 1 and is_control(request.path):
                # Uncounted once its first request is a control one, so that the
                # connections a test opens to poll /sim/stats never show up in the numbers
                # it asserts on (nor after a reset in between).
                if conn.counted == self.stats.epoch:
                    self.stats.connections_accepted -= 1
                conn.counted = None
                self.stats.connections_open -= 1
            conn.peer.begin()
            try:
                keep_alive = self.app.handle(Exchange(request, conn.peer, conn.served))
            finally:
                conn.peer.end()
            if not keep_alive:
                return

    def _read(self, peer: Peer, parser: RequestParser) -> Request | None:
        """The next request on this connection, or None when it should close."""
        continued = False
        while True:
            try:
                request = parser.next_request()
            except ProtocolError as err:
                body = dumps(ApiError(err.status, err.message).to_body())
                send_full(peer, err.status, body, base_headers(new_id("req_"), close=True))
                return None
            if request is not None:
                return request
            pending = parser.pending_head
            if pending is not None and pending.expects_continue and not continued:
                # RFC 9110 10.1.1: the client may be holding the body back until it hears this.
                peer.send(CONTINUE)
                continued = True
            try:
                data = peer.sock.recv(RECV_SIZE)
            except OSError:  # idle timeout or reset between requests
                return None
            if not data:
                return None
            parser.feed(data)
