"""Upstream addresses that fail in known ways, on loopback only."""

from __future__ import annotations

import socket


class BlackHole:
    """A port whose connects hang: its accept queue is full and never drained.

    Linux drops SYNs for a listener whose backlog is full, so a connect attempt waits for
    its timeout, which is how an unreachable remote host looks to the gateway.
    """

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.filler = socket.create_connection(("127.0.0.1", self.port))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.filler.close()
        self.listener.close()


def closed_port_url() -> str:
    """An http URL on a loopback port nobody listens on (connects are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
