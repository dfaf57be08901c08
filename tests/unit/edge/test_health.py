"""Readiness probes against real sockets on loopback (gevent servers in this process)."""

from __future__ import annotations

from gevent.server import StreamServer

from app.core.config import Settings
from app.edge.readiness import readiness
from app.upstream.catalog import from_environment


class Silent:
    """Accepts and never answers; counts the connections open at once across servers."""

    def __init__(self) -> None:
        self.open = 0
        self.peak = 0

    def serve(self) -> StreamServer:
        def handle(sock, _address) -> None:
            self.open += 1
            self.peak = max(self.peak, self.open)
            try:
                while sock.recv(64):
                    pass  # a probe's `version`: never answered
            finally:
                self.open -= 1

        server = StreamServer(("127.0.0.1", 0), handle)
        server.start()
        return server


def test_every_target_is_probed_at_once() -> None:
    # Three Memcached nodes that never answer: each probe waits out its timeout. One after
    # another they would take three timeouts, past a Kubernetes probe's; at once, one.
    silent = Silent()
    servers = [silent.serve() for _ in range(3)]
    upstream = StreamServer(("127.0.0.1", 0), lambda sock, _address: None)
    upstream.start()
    try:
        nodes = ",".join(f"127.0.0.1:{s.server_port}" for s in servers)
        specs = from_environment(f"http://127.0.0.1:{upstream.server_port}/v1", "")
        ready, checks = readiness(Settings(memcached=nodes), specs, {})
    finally:
        for server in [*servers, upstream]:
            server.stop()
    assert silent.peak == 3  # all three probes were under way together
    assert ready and checks["upstream"]["ok"]
    memcached = checks["memcached"]
    assert not memcached["ok"]
    assert [n["node"] for n in memcached["nodes"]] == nodes.split(",")
    assert all(n["error"] == "timed out" for n in memcached["nodes"]), memcached
