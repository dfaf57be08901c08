"""The limit counters' contract (app/tenancy/limits.py ``Counters``), kept by both implementations:
Memcached's (app/cache/counters.py; real memcached on loopback) and the per-worker stand-in.
Memcached's own contents are read with a plain client of the test's, not through the code
under test.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymemcache.client.base import Client

from app.cache.counters import MemcachedCounters
from app.cache.memcached import MemcachedBackend
from app.tenancy.limits import MemoryCounters
from runner.procs import free_port
from tests.support.memcached import start_memcached


@pytest.fixture(scope="module")
def mc(tmp_path_factory) -> Iterator[int]:
    proc, port = start_memcached(Path(tmp_path_factory.mktemp("counters")))
    yield port
    proc.kill()


def _counters(port: int, timeout: float, connect_timeout: float = 0.1) -> MemcachedCounters:
    node = [("127.0.0.1", port)]
    return MemcachedCounters(
        MemcachedBackend(node, timeout=timeout, connect_timeout=connect_timeout, name="limits")
    )


@pytest.fixture(params=["memcached", "memory"])
def counters(request, mc):
    if request.param == "memory":
        yield MemoryCounters()
        return
    backend = _counters(mc, timeout=1.0)
    yield backend
    backend.close()


def test_incr_creates_counts_and_decr_stops_at_zero(counters, request) -> None:
    key = f"llmgate:rl:v1:t:{request.node.callspec.id}:requests:0"
    assert counters.read([key]) == {}
    assert counters.incr(key, 1, ttl=60) == 1
    assert counters.incr(key, 5, ttl=60) == 6
    assert counters.incr(key, 0, ttl=60) == 6  # a read that counts nothing
    assert counters.decr(key, 2) == 4
    assert counters.decr(key, 10) == 0
    assert counters.incr(key, 7, ttl=60) == 7
    assert counters.read([key, key + "x"]) == {key: 7}


def test_memcached_holds_the_count_as_a_plain_decimal_with_its_ttl(mc) -> None:
    counters = _counters(mc, timeout=1.0)
    key = "llmgate:rl:v1:t:raw:requests:0"
    counters.incr(key, 12, ttl=120)
    counters.decr(key, 3)  # 12 -> 9: memcached may pad the shorter number with a space
    raw = Client(("127.0.0.1", mc))
    assert raw.get(key).strip() == b"9"
    assert counters.read([key]) == {key: 9}
    other = _counters(mc, timeout=1.0)
    assert other.incr(key, 1, ttl=120) == 10  # another process's client: the same counter
    for client in (raw, counters, other):
        client.close()


def test_an_unreachable_node_is_none_never_an_exception() -> None:
    down = _counters(free_port(), timeout=0.2, connect_timeout=0.2)
    key = "llmgate:rl:v1:t:down:requests:0"
    assert down.incr(key, 1, ttl=60) is None
    assert down.decr(key, 1) is None
    assert down.read([key]) is None
    down.close()


def _ttl(port: int, key: str) -> int:
    """The item's remaining TTL as memcached itself reports it (meta get, flag t)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(f"mg {key} t\r\n".encode())
        reply = sock.recv(4096).decode()
    match = re.match(r"HD t(-?\d+)", reply)
    assert match, reply
    return int(match.group(1))


def test_a_renewed_counter_lives_its_whole_ttl_again(mc) -> None:
    counters = _counters(mc, timeout=1.0)
    key = "llmgate:rl:v1:t:renew:streams:0"
    counters.incr(key, 1, ttl=5)
    counters.incr(key, 1, ttl=700)  # not renewed: the TTL it was made with stays
    assert _ttl(mc, key) <= 5
    counters.incr(key, 1, ttl=700, renew=True)
    assert 690 <= _ttl(mc, key) <= 700
    assert counters.read([key]) == {key: 3}
    counters.close()
