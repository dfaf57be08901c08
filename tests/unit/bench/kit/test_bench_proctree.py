"""bench/kit/proctree.py's count of a process tree's connections to a port, against real sockets."""

from __future__ import annotations

import os
import socket

from bench.kit import proctree


def test_connections_to_a_port_are_this_process_s_established_ones() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as one,
        socket.create_server(("127.0.0.1", 0)) as two,
    ):
        port = one.getsockname()[1]
        ours = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        other = socket.create_connection(("127.0.0.1", two.getsockname()[1]))
        try:
            # The accepted ends have the port as their local one: not counted.
            accepted = [one.accept()[0] for _ in range(3)]
            assert proctree.connections_to([os.getpid()], port) == 3
            ours[0].close()
            assert proctree.connections_to([os.getpid()], port) == 2
            assert proctree.connections_to([], port) == 0  # another tree holds none
        finally:
            for sock in [*ours, other, *accepted]:
                sock.close()
