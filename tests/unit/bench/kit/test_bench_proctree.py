"""bench/kit/proctree.py's count of a process tree's connections to a port, its accepted ones on
a port and a listener's accept queue, against real sockets."""

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


def test_a_listeners_accept_queue_and_its_accepted_connections() -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        port = server.getsockname()[1]
        assert proctree.accept_queue(port) == 0
        callers = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        try:
            # Handshakes the kernel finished, not yet accepted: waiting in the queue.
            assert proctree.accept_queue(port) == 5
            assert proctree.accepted_on([os.getpid()], port) == 0
            accepted = [server.accept()[0] for _ in range(2)]
            assert proctree.accept_queue(port) == 3
            assert proctree.accepted_on([os.getpid()], port) == 2
            assert proctree.accepted_on([], port) == 0
        finally:
            for sock in [*callers, *accepted]:
                sock.close()
