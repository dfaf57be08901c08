"""LLMGATE_MEMCACHED=dns+name:port: the ring follows what the name resolves to.

The Memcached servers are real, each on its own loopback address and the same port (as pods
behind a headless Service are); only DNS is simulated, by giving the watcher a resolver
whose answer the test changes. The backend, its pymemcache HashClient and its breaker are
the gateway's own (app/store/memcached.py, app/store/discovery.py).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.store.discovery import NodeWatcher, resolve
from app.store.memcached import MemcachedBackend
from runner.procs import Proc, free_port
from tests.conftest import require_binary
from tests.support.memcached import memcached_stats
from tests.support.waiting import wait_for

ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _items(host: str, port: int) -> int:
    return memcached_stats(port, host)["curr_items"]


@pytest.fixture(scope="module")
def pods(tmp_path_factory) -> Iterator[int]:
    """Three memcached servers on 127.0.0.1-3, one port: three pods of one Service."""
    binary = require_binary("memcached")
    logs: Path = tmp_path_factory.mktemp("discovery")
    port = free_port()
    procs = []
    try:
        for address in ADDRESSES:
            argv = [binary, "-l", address, "-p", str(port), "-U", "0", "-m", "16"]
            if os.geteuid() == 0:
                argv += ["-u", "nobody"]
            proc = Proc(f"memcached-{address}", argv, log_path=logs / f"{address}.log")
            procs.append(proc)
            proc.wait_port(port, address)
        yield port
    finally:
        for proc in procs:
            proc.kill()


class FakeDNS:
    """The one thing not real here: what the name resolves to."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.failing = False
        self.asked = 0

    def __call__(self, name: str, port: int) -> list[tuple[str, int]]:
        self.asked += 1
        assert name == "memcached"
        if self.failing:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return [(a, port) for a in self.addresses]


def _backend(port: int, dns: FakeDNS, every_s: float = 3600) -> MemcachedBackend:
    backend = MemcachedBackend([], discovered=True, timeout=0.5, connect_timeout=0.5)
    backend.watcher = NodeWatcher(
        [], [("memcached", port)], backend.set_nodes, every_s=every_s, resolver=dns
    ).start()
    return backend


def test_the_ring_grows_and_shrinks_with_the_names_addresses(pods: int) -> None:
    dns = FakeDNS("127.0.0.1", "127.0.0.2")
    backend = _backend(pods, dns)
    run = f"grow-{time.time_ns()}"
    try:
        before = {a: _items(a, pods) for a in ADDRESSES}
        first = [f"{run}-a{i}" for i in range(300)]
        assert all(backend.set(k, b"v", 60) for k in first)
        added = {a: _items(a, pods) - before[a] for a in ADDRESSES}
        # Both resolved pods hold a share; the third, not resolved yet, none.
        assert added["127.0.0.1"] > 60 and added["127.0.0.2"] > 60, added
        assert added["127.0.0.3"] == 0, added

        dns.addresses.append("127.0.0.3")  # the StatefulSet scaled to 3
        assert backend.watcher is not None and backend.watcher.refresh()
        still = sum(backend.get(k) is not None for k in first)
        # Consistent hashing: only the keys the new node now owns moved (about a third).
        assert 0.45 * len(first) <= still < len(first), still
        mid = {a: _items(a, pods) for a in ADDRESSES}
        second = [f"{run}-b{i}" for i in range(300)]
        assert all(backend.set(k, b"v", 60) for k in second)
        assert _items("127.0.0.3", pods) - mid["127.0.0.3"] > 50  # the new pod takes writes

        dns.addresses = ["127.0.0.1"]  # scaled down to one
        assert backend.watcher.refresh()
        assert backend.nodes == [("127.0.0.1", pods)]
        third = [f"{run}-c{i}" for i in range(100)]
        low = _items("127.0.0.1", pods)
        assert all(backend.set(k, b"v", 60) for k in third)
        assert _items("127.0.0.1", pods) - low == 100  # every write on the one node left
        assert backend.stats()["errors"] == 0
    finally:
        backend.close()


def test_a_failed_lookup_keeps_the_last_nodes(pods: int) -> None:
    dns = FakeDNS("127.0.0.1", "127.0.0.2")
    backend = _backend(pods, dns)
    try:
        dns.failing = True
        assert backend.watcher is not None and not backend.watcher.refresh()
        assert sorted(backend.nodes) == [("127.0.0.1", pods), ("127.0.0.2", pods)]
        assert backend.set("after-a-dns-blip", b"v", 60)
        assert backend.get("after-a-dns-blip") == b"v"
    finally:
        backend.close()


def test_the_watcher_re_resolves_on_its_own(pods: int) -> None:
    dns = FakeDNS("127.0.0.1")
    backend = _backend(pods, dns, every_s=0.05)
    try:
        dns.addresses = ["127.0.0.2", "127.0.0.3"]
        assert wait_for(lambda: len(backend.nodes) == 2, 5.0), backend.nodes
        assert sorted(h for h, _ in backend.nodes) == ["127.0.0.2", "127.0.0.3"]
        dropped = _items("127.0.0.1", pods)
        keys = [f"periodic-{time.time_ns()}-{i}" for i in range(50)]
        assert all(backend.set(k, b"v", 60) and backend.get(k) == b"v" for k in keys)
        assert _items("127.0.0.1", pods) == dropped  # the dropped node gets nothing
        assert dns.asked >= 2
    finally:
        backend.close()


def test_the_real_resolver_returns_every_address_of_a_name() -> None:
    # localhost has at least one address in every environment these tests run in.
    found = resolve("localhost", 11211)
    assert found and all(port == 11211 for _, port in found)
    assert found == sorted(set(found))
    with pytest.raises(OSError):
        resolve("no-such-host.invalid", 11211)


def test_readiness_probes_what_a_dns_name_resolves_to(pods: int) -> None:
    from app.core.config import Settings
    from app.edge.readiness import readiness

    settings = Settings(memcached=f"dns+localhost:{pods},dns+no-such-host.invalid:{pods}")
    _, checks = readiness(settings, [], {})
    nodes = {n["node"]: n for n in checks["memcached"]["nodes"]}
    assert nodes[f"127.0.0.1:{pods}"]["ok"]
    assert not nodes[f"dns+no-such-host.invalid:{pods}"]["ok"]
