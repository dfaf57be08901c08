"""A loopback TCP proxy that counts round trips: how often a client waited for its server.

On each connection, a send that follows a reply (or opens the connection) is one wait; a
send that follows a send with no reply between (a command sent ``noreply``) is counted under
``sends`` only. One thread per connection reads both sides, so the order of the two is
known. Used to count the gateway's round trips to Memcached from outside the gateway
(bench/cpu/counter_trips.py, tests/integration/test_limit_counters.py).
"""

from __future__ import annotations

import selectors
import socket
import threading


class TripCounter:
    """A loopback TCP proxy to ``target`` counting each connection's sends and waits."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sends = 0
        self.waits = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.sends, self.waits

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        """One connection, both ways, in one thread, so the order of the two sides is known:
        the worker waits for a reply before it sends again (unless it sent ``noreply``)."""
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, server)
        selector.register(server, selectors.EVENT_READ, client)
        replied = True  # a fresh connection's first send is a wait too
        try:
            while True:
                for key, _ in selector.select():
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    with self._lock:
                        if key.fileobj is client:
                            self.sends += 1
                            self.waits += replied
                            replied = False
                        else:
                            replied = True
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            selector.close()
            client.close()
            server.close()
