"""A Memcached of the test's own on loopback, and what it holds read from its own mouth.

The counts come from Memcached's ``stats`` command on a connection of their own, never
through the client under test, so a test compares the gateway's work with an independent
source.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from runner.procs import Proc, free_port
from runner.stack import Stack
from tests.conftest import require_binary


def start_memcached(log_dir: Path, *extra: str, port: int = 0) -> tuple[Proc, int]:
    """A memcached on a free loopback port, or ``port`` (one a memcached just left: a
    restart); ``extra``: more of its options, e.g. "-I", "512k"; its log in ``log_dir``. The
    caller stops it."""
    binary = require_binary("memcached")
    port = port or free_port()
    argv = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "64", *extra]
    if os.geteuid() == 0:
        argv += ["-u", "nobody"]
    proc = Proc(f"memcached-{port}", argv, log_path=log_dir / f"memcached-{port}.log")
    try:
        proc.wait_port(port)
    except Exception:
        proc.stop()
        raise
    return proc, port


def memcached_stats(port: int, host: str = "127.0.0.1") -> dict[str, int]:
    """The whole-number lines of the node's ``stats`` (curr_items, cmd_get, ...)."""
    with socket.create_connection((host, port), timeout=2) as sock:
        sock.sendall(b"stats\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            assert chunk, "memcached closed the stats connection"
            buf += chunk
    out = {}
    for line in buf.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "STAT" and parts[2].isdigit():
            out[parts[1]] = int(parts[2])
    return out


def _command(port: int, command: bytes, end: bytes, host: str = "127.0.0.1") -> bytes:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(command)
        buf = b""
        while not buf.endswith(end):
            chunk = sock.recv(65536)
            assert chunk, "memcached closed the connection"
            buf += chunk
    return buf


def memcached_keys(port: int, prefix: str, host: str = "127.0.0.1") -> list[str]:
    """The keys the node holds that start with ``prefix`` (``lru_crawler metadump all``;
    it may still list an item whose time is up: ``memcached_get`` tells)."""
    from urllib.parse import unquote

    dump = _command(port, b"lru_crawler metadump all\r\n", b"END\r\n", host)
    keys = []
    for line in dump.decode().splitlines():
        if line.startswith("key="):
            key = unquote(line.split()[0][4:])
            if key.startswith(prefix):
                keys.append(key)
    return keys


def memcached_get(port: int, key: str, host: str = "127.0.0.1") -> bytes | None:
    """The value of ``key`` as the node serves it now (None: no such live item)."""
    reply = _command(port, b"get %s\r\n" % key.encode(), b"END\r\n", host)
    if reply == b"END\r\n":
        return None
    header, _, rest = reply.partition(b"\r\n")
    size = int(header.split()[3])
    return rest[:size]


def stop_stack_memcached(stack: Stack) -> int:
    """Kill a stack's one Memcached (SIGKILL: its connections are closed by the kernel, as
    after a crash); its port, free again for ``start_stack_memcached``."""
    port = int(stack.memcached_addr.rsplit(":", 1)[1])
    stack.proc("memcached").kill()
    stack.procs = [p for p in stack.procs if p.name != "memcached"]
    return port


def start_stack_memcached(stack: Stack, port: int) -> None:
    """A new, empty Memcached where the stack's was (same port, same log file): what a
    restarted node looks like to the gateway, whose pooled connections were to the old one."""
    log = stack.options.run_dir / "logs" / "memcached.log"
    proc = Proc("memcached", stack.memcached_argv(port), log_path=log)
    stack.procs.append(proc)
    proc.wait_port(port)


def flush_memcached(port: int, host: str = "127.0.0.1") -> None:
    """Memcached's own ``flush_all``: every item gone at once, the node still up (what an
    operator's flush, or an eviction of everything, leaves)."""
    assert _command(port, b"flush_all\r\n", b"\r\n", host) == b"OK\r\n"
