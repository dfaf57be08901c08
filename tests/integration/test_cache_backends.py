"""Cache backends against real Memcached on loopback: one contract suite, then the faults.

The contract class runs the same tests against the in-process LRU, Memcached, and the two
tiered (dogpile's way: one interface, several backends, one suite). The fault tests put
tests/support/faultproxy.py between the backend and Memcached: down, stalled, resetting,
a node stopped mid-run, and a call interrupted mid-reply by a gevent.Timeout.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cache.tiered import TieredCache
from app.store.backends import Backend
from app.store.memcached import FLAG_MANIFEST, FLAG_PART, FLAG_VALUE, MemcachedBackend
from app.store.memory import MemoryBackend
from tests.conftest import ROOT
from tests.support.clock import Clock
from tests.support.faultproxy import FaultProxy
from tests.support.faults import BlackHole
from tests.support.memcached import start_memcached

MiB = 1024 * 1024
CEILING = 8 * MiB  # the largest value every contract backend stores
SLACK = 0.5  # added to a timeout in duration bounds: generous, never a tight timing assert


# -- processes and helpers ------------------------------------------------------------------
@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache-backends")


@pytest.fixture(scope="module")
def mc_port(logs: Path) -> Iterator[int]:
    proc, port = start_memcached(logs)
    yield port
    proc.kill()


@pytest.fixture
def key() -> Callable[..., str]:
    """Keys unique to the test, shaped like the gateway's (tests share one memcached)."""
    run = uuid.uuid4().hex[:16]

    def make(name: str = "k") -> str:
        return f"llmgate:test:{run}:{name}"

    return make


def raw_get(port: int, key: str) -> tuple[int, bytes] | None:
    """(flags, data) of an item, read straight from Memcached with no client library."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(f"get {key}\r\n".encode())
        buf = b""
        while not buf.endswith(b"END\r\n"):
            chunk = sock.recv(MiB)
            assert chunk, "memcached closed the connection"
            buf += chunk
    if buf == b"END\r\n":
        return None
    header, _, rest = buf.partition(b"\r\n")
    _, _, flags, length = header.split()
    return int(flags), rest[: int(length)]


def raw_command(port: int, line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(line)
        return sock.recv(4096)


def timed(call: Callable[[], object]) -> tuple[object, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


# -- the contract suite ---------------------------------------------------------------------
class TieredAsBackend:
    """TieredCache.get also names the level; the contract only looks at the value."""

    def __init__(self, tiers: TieredCache) -> None:
        self.tiers = tiers
        self.name = tiers.name
        self.set, self.add, self.delete = tiers.set, tiers.add, tiers.delete
        self.close, self.stats, self.errors = tiers.close, tiers.stats, tiers.errors

    def get(self, key: str) -> bytes | None:
        found = self.tiers.get(key)
        return None if found is None else found[0]


@dataclass
class Harness:
    cache: Backend
    advance: Callable[[float], None]  # let this much time pass, as the backend sees it
    counters: Callable[[], dict[str, int]]  # the counters of the level that stores


@pytest.fixture(params=["memory", "memcached", "tiered"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    clock = Clock(1000.0)

    def tick(seconds: float) -> None:
        clock.now += seconds

    def tick_and_sleep(seconds: float) -> None:
        clock.now += seconds
        time.sleep(seconds)

    closing: list[Backend] = []
    if request.param == "memory":
        memory = MemoryBackend(8 * CEILING, clock=clock)
        closing.append(memory)
        yield Harness(memory, tick, memory.stats)
    else:
        port = request.getfixturevalue("mc_port")
        l2 = MemcachedBackend([("127.0.0.1", port)], max_value_bytes=CEILING)
        if request.param == "memcached":
            closing.append(l2)
            yield Harness(l2, time.sleep, l2.stats)
        else:
            tiers = TieredCache(MemoryBackend(8 * CEILING, clock=clock), l2, l1_ttl=60)
            closing.append(TieredAsBackend(tiers))
            yield Harness(closing[0], tick_and_sleep, l2.stats)
    for backend in closing:
        backend.close()


class TestBackendContract:
    def test_miss_set_get_overwrite_delete(self, harness: Harness, key) -> None:
        cache = harness.cache
        assert cache.get(key()) is None
        assert cache.set(key(), b"first", 60) is True
        assert cache.get(key()) == b"first"
        assert cache.set(key(), b"second", 60) is True
        assert cache.get(key()) == b"second"
        cache.delete(key())
        assert cache.get(key()) is None
        cache.delete(key("never-set"))  # deleting a missing key is fine

    def test_add_is_a_lease(self, harness: Harness, key) -> None:
        cache = harness.cache
        assert cache.add(key(), b"holder-1", 30) is True
        assert cache.add(key(), b"holder-2", 30) is False  # a no-reply add would say True
        assert cache.get(key()) == b"holder-1"
        cache.delete(key())
        assert cache.add(key(), b"holder-3", 30) is True
        cache.set(key("taken"), b"x", 30)
        assert cache.add(key("taken"), b"y", 30) is False

    def test_values_are_binary_safe(self, harness: Harness, key) -> None:
        cache = harness.cache
        every_byte = bytes(range(256)) * 4 + b"\r\nEND\r\nVALUE x 0 1\r\n"
        assert cache.set(key(), every_byte, 60)
        assert cache.get(key()) == every_byte
        assert cache.set(key("empty"), b"", 60)
        assert cache.get(key("empty")) == b""  # empty is a hit, not a miss

    def test_ttl_expires(self, harness: Harness, key) -> None:
        cache = harness.cache
        cache.set(key("short"), b"s", 1)
        cache.set(key("long"), b"l", 60)
        assert cache.get(key("short")) == b"s"
        harness.advance(2.1)  # Memcached's TTL granularity is one second
        assert cache.get(key("short")) is None
        assert cache.get(key("long")) == b"l"

    def test_huge_ttl_is_clamped_not_read_as_a_unix_time(self, harness: Harness, key) -> None:
        # Unclamped, Memcached reads 10**9 as 2001-09-09 and the item is expired at once.
        assert harness.cache.set(key(), b"v", 10**9)
        assert harness.cache.get(key()) == b"v"
        assert harness.cache.add(key("lease"), b"v", 10**9)
        assert harness.cache.get(key("lease")) == b"v"

    def test_large_value_round_trips(self, harness: Harness, key) -> None:
        big = os.urandom(3 * MiB + 12345)  # over Memcached's 1 MiB item limit
        assert harness.cache.set(key(), big, 60)
        assert harness.cache.get(key()) == big
        harness.cache.delete(key())
        assert harness.cache.get(key()) is None

    def test_too_large_is_refused(self, harness: Harness, key) -> None:
        assert harness.cache.set(key(), b"small", 60)
        assert harness.cache.set(key(), b"x" * (CEILING + 1), 60) is False
        assert harness.cache.get(key()) is None  # no stale older value either
        assert harness.cache.add(key("lease"), b"x" * (CEILING + 1), 60) is False
        assert harness.counters()["too_large"] >= 2

    @pytest.mark.parametrize("bad", ["", "has space", "tab\t", "new\nline", "é", "k" * 201])
    def test_invalid_keys_raise(self, harness: Harness, bad: str) -> None:
        cache = harness.cache
        for call in (
            lambda: cache.get(bad),
            lambda: cache.set(bad, b"v", 1),
            lambda: cache.add(bad, b"v", 1),
            lambda: cache.delete(bad),
        ):
            with pytest.raises(ValueError):
                call()

    def test_values_must_be_bytes(self, harness: Harness, key) -> None:
        with pytest.raises(TypeError):
            harness.cache.set(key(), "text", 60)  # type: ignore[arg-type]

    def test_counters(self, harness: Harness, key) -> None:
        cache = harness.cache
        before = harness.counters()
        cache.get(key())
        cache.set(key(), b"v", 60)
        after = harness.counters()
        assert {"hits", "misses", "sets", "errors", "too_large"} <= set(after)
        assert after["sets"] == before["sets"] + 1
        assert all(isinstance(v, int) for v in cache.stats().values())
        errors = [v for k, v in cache.stats().items() if k == "errors" or k.endswith("_errors")]
        assert cache.errors() == sum(errors)


# -- Memcached specifics on a healthy server ------------------------------------------------
@pytest.fixture
def mc(mc_port: int) -> Iterator[MemcachedBackend]:
    backend = MemcachedBackend([("127.0.0.1", mc_port)])
    yield backend
    backend.close()


def test_items_are_raw_bytes_with_our_flags(mc: MemcachedBackend, mc_port: int, key) -> None:
    mc.set(key(), b"\x80\x04plain bytes", 60)  # starts like a pickle; must stay bytes
    assert raw_get(mc_port, key()) == (FLAG_VALUE, b"\x80\x04plain bytes")


def test_split_value_layout_and_broken_parts_read_as_a_miss(
    mc: MemcachedBackend, mc_port: int, key
) -> None:
    big = os.urandom(2 * MiB)
    assert mc.set(key(), big, 60)
    flags, manifest = raw_get(mc_port, key()) or (0, b"")
    assert flags == FLAG_MANIFEST
    doc = json.loads(manifest)
    assert doc["n"] == 3 and doc["len"] == len(big)
    parts = [f"{key()}:{doc['h'][:12]}:p{i}" for i in range(3)]
    assert [raw_get(mc_port, p)[0] for p in parts] == [FLAG_PART] * 3  # type: ignore[index]
    assert mc.get(key()) == big

    # A part rewritten with other bytes of the same length: the digest catches it.
    length = len(raw_get(mc_port, parts[1])[1])  # type: ignore[index]
    store = f"set {parts[1]} {FLAG_PART} 60 {length}\r\n".encode() + b"z" * length + b"\r\n"
    assert raw_command(mc_port, store) == b"STORED\r\n"
    errors = mc.stats()["errors"]
    assert mc.get(key()) is None
    assert mc.stats()["errors"] == mc.errors() == errors + 1

    # A part evicted: a miss, never a short value.
    assert mc.set(key("again"), big, 60)
    doc = json.loads(raw_get(mc_port, key("again"))[1])  # type: ignore[index]
    assert raw_command(mc_port, f"delete {key('again')}:{doc['h'][:12]}:p2\r\n".encode())
    assert mc.get(key("again")) is None


def test_foreign_items_are_misses(mc: MemcachedBackend, mc_port: int, key) -> None:
    # flags 1 is pymemcache's and python-memcached's pickle flag: never unpickled, a miss.
    assert raw_command(mc_port, f"set {key()} 1 60 3\r\nabc\r\n".encode()) == b"STORED\r\n"
    assert mc.get(key()) is None


def test_a_rejected_write_returns_false(logs: Path, key) -> None:
    """noreply=False on writes: a server that refuses an item makes set() say so.

    HashClient's default no-reply set returned True for an item the server rejected.
    """
    proc, port = start_memcached(logs, "-I", "512k")  # items of 512 KiB at most
    backend = MemcachedBackend([("127.0.0.1", port)])  # sends up to 900 KiB as one item
    try:
        assert backend.set(key("fits"), b"x" * 1000, 60) is True
        assert backend.set(key("rejected"), b"x" * 600 * 1024, 60) is False
        assert backend.get(key("rejected")) is None
        assert backend.stats()["errors"] >= 1
        assert backend.dead_nodes() == []  # a server error is not a dead node
    finally:
        backend.close()
        proc.kill()


def test_pool_is_bounded_and_callers_wait_for_a_slot(mc_port: int, key) -> None:
    with FaultProxy("127.0.0.1", mc_port) as proxy:
        backend = MemcachedBackend([("127.0.0.1", proxy.port)], pool_size=2, timeout=2.0)
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(25):
                    backend.set(key(f"{n}-{i}"), b"v", 60)
                    assert backend.get(key(f"{n}-{i}")) == b"v"
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        backend.close()
        assert errors == []
        assert proxy.accepted <= 2  # 12 threads, 600 calls, never more than 2 connections
        assert backend.stats()["busy"] == 0


def test_no_free_slot_within_the_timeout_is_a_miss(mc_port: int, key) -> None:
    with FaultProxy("127.0.0.1", mc_port) as proxy:
        backend = MemcachedBackend([("127.0.0.1", proxy.port)], pool_size=1, timeout=0.5)
        backend.set(key(), b"v", 60)
        proxy.latency(0.3)
        results: list[object] = []
        threads = [
            threading.Thread(target=lambda: results.append(backend.get(key()))) for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        backend.close()
    assert len(results) == 3 and b"v" in results and None in results
    assert backend.stats()["busy"] >= 1
    assert backend.dead_nodes() == []


# -- faults ---------------------------------------------------------------------------------
@pytest.fixture
def proxy(mc_port: int) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", mc_port) as fault_proxy:
        yield fault_proxy


def test_node_down_is_a_fast_miss_then_skipped(proxy: FaultProxy, key) -> None:
    backend = MemcachedBackend([("127.0.0.1", proxy.port)], dead_timeout=30)
    proxy.down()
    value, took = timed(lambda: backend.get(key()))
    assert value is None and took < 0.1 + SLACK
    assert backend.stats()["errors"] == 1
    assert backend.set(key(), b"v", 60) is False
    assert backend.add(key(), b"v", 60) is False
    backend.delete(key())
    stats = backend.stats()
    assert stats["errors"] == 1 and stats["dead_skips"] == 3
    backend.close()


def test_unreachable_node_costs_one_connect_timeout(key) -> None:
    hole = BlackHole()  # connects hang, like a host that is gone
    backend = MemcachedBackend([("127.0.0.1", hole.port)], connect_timeout=0.5)
    try:
        value, took = timed(lambda: backend.get(key()))
        assert value is None and took < 0.5 + SLACK
        stored, took = timed(lambda: backend.set(key(), b"v", 60))
        assert stored is False and took < 0.1  # skipped, not another connect attempt
        assert backend.stats()["dead_skips"] == 1
    finally:
        backend.close()
        hole.close()


def test_stalled_node_costs_one_timeout_then_is_skipped_until_dead_timeout(
    proxy: FaultProxy, key
) -> None:
    backend = MemcachedBackend([("127.0.0.1", proxy.port)], timeout=0.5, dead_timeout=0.8)
    assert backend.set(key(), b"v", 60)
    proxy.stall()  # accepts and reads, never answers
    value, took = timed(lambda: backend.get(key()))
    assert value is None and took < 0.5 + SLACK
    value, took = timed(lambda: backend.get(key()))
    assert value is None and took < 0.1  # skipped, not waited on again
    stored, took = timed(lambda: backend.set(key(), b"w", 60))
    assert stored is False and took < 0.1
    stats = backend.stats()
    assert stats["errors"] == 1 and stats["dead_skips"] == 2
    assert backend.dead_nodes() == [f"127.0.0.1:{proxy.port}"]

    proxy.pass_through()
    time.sleep(0.9)  # past dead_timeout: the next caller probes the node again
    assert backend.get(key()) == b"v"
    assert backend.dead_nodes() == []
    backend.close()


def test_reset_connections_are_misses(proxy: FaultProxy, key) -> None:
    backend = MemcachedBackend([("127.0.0.1", proxy.port)], dead_timeout=0.3)
    assert backend.set(key(), b"v", 60) and backend.get(key()) == b"v"  # a pooled connection
    proxy.reset()
    value, took = timed(lambda: backend.get(key()))  # on the pooled connection: RST
    assert value is None and took < 0.2 + SLACK
    time.sleep(0.4)
    assert backend.get(key()) is None  # a new connection is reset at accept
    assert backend.set(key(), b"w", 60) is False
    assert backend.stats()["errors"] >= 2
    proxy.pass_through()
    time.sleep(0.4)
    assert backend.get(key()) == b"v"
    backend.close()


def test_two_nodes_one_stopped_mid_run(logs: Path, mc_port: int, key) -> None:
    proc, port_b = start_memcached(logs)
    backend = MemcachedBackend([("127.0.0.1", mc_port), ("127.0.0.1", port_b)], dead_timeout=30)
    try:
        keys = [key(f"n{i}") for i in range(40)]
        for k in keys:
            assert backend.set(k, k.encode(), 60)
        assert all(backend.get(k) == k.encode() for k in keys)  # both nodes serve

        slowest = 0.0
        after_stop = []
        for i, k in enumerate(keys):
            if i == 10:
                proc.stop()  # node B goes away under live traffic
            _, took_set = timed(functools.partial(backend.set, k, k.encode(), 60))
            got, took_get = timed(functools.partial(backend.get, k))
            slowest = max(slowest, took_set, took_get)
            if i >= 10:
                after_stop.append(got)
        assert slowest < 0.2 + SLACK
        # No rehashing: keys on the live node still hit, keys on the stopped one miss.
        assert any(v is not None for v in after_stop) and None in after_stop
        stats = backend.stats()
        assert stats["errors"] >= 1 and stats["dead_skips"] >= 1
        assert backend.dead_nodes() == [f"127.0.0.1:{port_b}"]
    finally:
        backend.close()
        proc.kill()


def test_a_restarted_node_fails_a_write_once_repeats_a_read_and_is_not_skipped(
    logs: Path, key
) -> None:
    """Its pooled connection was to the old process. An ``add`` on it is not sent again (twice
    it could find its own item): it fails, and the next command reconnects; a read, or a set
    of a whole value, runs again at once on a new connection."""
    proc, port = start_memcached(logs)
    backend = MemcachedBackend([("127.0.0.1", port)], dead_timeout=30)
    try:
        assert backend.set(key("old"), b"v", 60)  # one connection, kept in the pool
        proc.kill()
        proc, _ = start_memcached(logs, port=port)
        assert backend.add(key("lease"), b"1", 60) is False  # on the dropped connection
        assert raw_get(port, key("lease")) is None
        assert backend.add(key("lease"), b"1", 60) is True  # a new connection, not skipped
        assert raw_get(port, key("lease")) == (FLAG_VALUE, b"1")
        assert backend.stats()["errors"] == 1 and backend.stats()["dead_skips"] == 0

        assert backend.set(key("new"), b"n", 60)
        proc.kill()
        proc, _ = start_memcached(logs, port=port)
        raw_command(port, f"set {key('new')} {FLAG_VALUE} 60 1\r\nm\r\n".encode())
        assert backend.get(key("new")) == b"m"  # read again, on a new connection
        assert backend.stats()["errors"] == 1 and backend.dead_nodes() == []

        # A set leaves what it leaves however often it runs: run again, as a read is.
        proc.kill()
        proc, _ = start_memcached(logs, port=port)
        assert backend.set(key("again"), b"s", 60) is True
        assert raw_get(port, key("again")) == (FLAG_VALUE, b"s")
        assert backend.stats()["errors"] == 1 and backend.dead_nodes() == []
    finally:
        backend.close()
        proc.kill()


def test_tiered_keeps_serving_l1_when_l2_is_down(proxy: FaultProxy, key) -> None:
    clock = Clock(1000.0)
    l2 = MemcachedBackend([("127.0.0.1", proxy.port)])
    tiers = TieredCache(MemoryBackend(MiB, clock=clock), l2, l1_ttl=30)
    assert tiers.set(key(), b"v", 300)
    proxy.down()
    assert tiers.get(key()) == (b"v", "l1")
    assert tiers.set(key("new"), b"n", 300) is True  # stored in L1 at least
    assert tiers.add(key("lease"), b"1", 5) is False  # a lease needs the shared level
    assert tiers.stats()["l2_errors"] >= 1
    assert tiers.errors() == tiers.stats()["l2_errors"]  # what the errors metric counts
    tiers.close()


# -- interrupted calls (gevent) ----------------------------------------------------------------
INTERRUPT_SCRIPT = r"""
from gevent import monkey

monkey.patch_all()

import json
import socket
import sys

import gevent
from pymemcache.client.base import PooledClient

from app.store.memcached import MemcachedBackend

direct_port, proxy_port, ka, kb = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
A, B = b"tenant-A-secret", b"tenant-B-answer"
seed = MemcachedBackend([("127.0.0.1", direct_port)])
assert seed.set(ka, A, 60) and seed.set(kb, B, 60)
seed.close()
out = {}

# 1. What a reused connection would hand the next caller: the interrupted caller's reply.
raw = socket.create_connection(("127.0.0.1", proxy_port))
raw.sendall(b"get " + ka.encode() + b"\r\n")
try:
    with gevent.Timeout(0.1):
        raw.recv(4096)
except gevent.Timeout:
    pass
raw.sendall(b"get " + kb.encode() + b"\r\n")
buf = b""
while buf.count(b"END\r\n") < 2:
    buf += raw.recv(4096)
raw.close()
out["raw_next_reply"] = buf.split(b"END\r\n")[0].decode()

# 2. Stock pymemcache: the interrupted connection is neither closed nor freed (pool.py).
stock = PooledClient(("127.0.0.1", proxy_port), timeout=2, max_pool_size=2)
stock_results = []
for _ in range(3):
    try:
        with gevent.Timeout(0.1):
            stock.get(ka)
        stock_results.append("answered")
    except gevent.Timeout:
        stock_results.append("interrupted")
    except Exception as exc:
        stock_results.append(type(exc).__name__)
out["stock"] = stock_results
out["stock_leaked_open"] = sum(c.sock is not None for c in stock.client_pool.used)
stock.close()

# 3. Our backend: interrupted more times than it has pool slots, then B asks for its key.
backend = MemcachedBackend([("127.0.0.1", proxy_port)], timeout=2.0, pool_size=2)
interrupted = 0
for _ in range(3):
    try:
        with gevent.Timeout(0.1):
            backend.get(ka)
    except gevent.Timeout:
        interrupted += 1
out["interrupted"] = interrupted
got = backend.get(kb)
out["b_got"] = None if got is None else got.decode()

# 4. A lease: an add cut before its NOT_STORED was read; the next add (key absent) must win.
held, fresh = ka + ":lease-held", ka + ":lease-fresh"
assert backend.set(held, b"1", 60)
try:
    with gevent.Timeout(0.1):
        backend.add(held, b"2", 60)
except gevent.Timeout:
    pass
out["fresh_add"] = backend.add(fresh, b"1", 60)
pools = [p.client_pool for p in backend._client.clients.values()]
out["used_after"] = sum(len(p.used) for p in pools)
out["free_after"] = sum(len(p.free) for p in pools)
out["stats"] = backend.stats()
backend.close()
print(json.dumps(out))
"""


def test_a_connection_interrupted_mid_reply_is_never_reused(
    mc_port: int, proxy: FaultProxy, key
) -> None:
    """Tenant A's get is cut by a gevent.Timeout after its request went out and before its
    reply was read (the proxy holds replies 0.5 s; the timeout is 0.1 s). Tenant B's get on
    the same backend must return B's value.

    Why the test can fail: part 1 of the script reuses a raw connection the same way and
    shows the next reply on it is A's ``VALUE ... tenant-A-secret``. Stock pymemcache does
    not close that socket (it cleans up only on ``Exception``) and keeps the client in the
    pool's "used" list, so after ``max_pool_size`` interruptions every call fails (part 2).
    Had our backend put the interrupted connection back in its pool, B's get would have read
    A's reply (pymemcache notices the foreign key in ``VALUE`` and raises, so B would see a
    miss, not A's bytes), and part 4's add would have read the stale ``NOT_STORED`` of the
    interrupted add and refused a lease on an absent key (checked by mutating the backend).
    Run in a subprocess because the test process is not gevent-patched.
    """
    proxy.latency(0.5)
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_SCRIPT, str(mc_port), str(proxy.port), key("A"), key("B")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)

    # The hazard is real: a reused connection gives the next caller A's bytes.
    assert out["raw_next_reply"].startswith(f"VALUE {key('A')} ")
    assert "tenant-A-secret" in out["raw_next_reply"]
    # pymemcache 4.0 on its own: slots leak with open sockets, then the pool refuses calls.
    # If this changes, pymemcache fixed it; _GuardedClient may then be simplified.
    assert out["stock"] == ["interrupted", "interrupted", "RuntimeError"]
    assert out["stock_leaked_open"] == 2

    # Ours: every interruption discarded its connection; B gets B; the node is not "dead".
    assert out["b_got"] == "tenant-B-answer"
    assert out["fresh_add"] is True
    assert out["interrupted"] == 3
    assert out["used_after"] == 0 and out["free_after"] == 1
    assert out["stats"]["errors"] == 0 and out["stats"]["dead_skips"] == 0


# -- tiered specifics -----------------------------------------------------------------------
@pytest.fixture
def tiers(mc: MemcachedBackend) -> Iterator[tuple[TieredCache, Clock]]:
    clock = Clock(1000.0)
    yield TieredCache(MemoryBackend(MiB, clock=clock), mc, l1_ttl=10), clock


def test_tiered_names_the_level_and_copies_l2_hits_into_l1(tiers, key) -> None:
    cache, clock = tiers
    assert cache.set(key(), b"v", 300)
    assert cache.get(key()) == (b"v", "l1")
    clock.now += 10  # L1 kept it for l1_ttl only
    assert cache.get(key()) == (b"v", "l2")
    assert cache.get(key()) == (b"v", "l1")  # copied back into L1
    cache.delete(key())
    assert cache.get(key()) is None


def test_tiered_l1_ttl_never_exceeds_the_entry_ttl(tiers, key) -> None:
    cache, clock = tiers
    cache.set(key(), b"v", 3)
    clock.now += 3
    assert cache.l1.get(key()) is None


def test_leases_live_in_l2_and_are_shared_between_processes(tiers, mc_port: int, key) -> None:
    cache, _ = tiers
    other_l2 = MemcachedBackend([("127.0.0.1", mc_port)])
    other_process = TieredCache(MemoryBackend(MiB), other_l2, l1_ttl=10)
    assert cache.add(key("lease"), b"1", 30) is True
    assert other_process.add(key("lease"), b"1", 30) is False
    assert cache.l1.get(key("lease")) is None  # not copied into L1
    cache.delete(key("lease"))
    assert other_process.add(key("lease"), b"1", 30) is True
    other_process.close()


def test_a_lease_read_never_enters_l1_so_memcached_trouble_is_not_waited_on(
    mc_port: int, proxy: FaultProxy, key
) -> None:
    """Process A holds the lease; process B sees it held. When B then loses Memcached, B must
    learn that no lease can be had (None: compute at once), not find a copy of A's lease in
    its own L1 and wait ``lease_s`` for an entry nobody will write where B can read it."""
    from app.cache.keys import lease_key
    from app.cache.store import AnswerCache
    from app.core.config import Settings

    settings = Settings(cache_lease_s=30)
    a_l2 = MemcachedBackend([("127.0.0.1", mc_port)])
    b_l2 = MemcachedBackend([("127.0.0.1", proxy.port)], dead_timeout=30)
    a = AnswerCache(TieredCache(MemoryBackend(MiB), a_l2, l1_ttl=10), settings, shared=True)
    b_tiers = TieredCache(MemoryBackend(MiB), b_l2, l1_ttl=10)
    b = AnswerCache(b_tiers, settings, shared=True)
    assert a.try_lease(key()) is True
    assert b.try_lease(key()) is False
    assert b_tiers.l1.get(lease_key(key())) is None  # read from L2, not copied into L1
    proxy.down()
    assert b.try_lease(key()) is None
    a.release_lease(key())
    a_l2.close()
    b_l2.close()


def test_tiered_without_l2_uses_l1_for_everything(key) -> None:
    cache = TieredCache(MemoryBackend(MiB, name="l1"), None, l1_ttl=10)
    assert cache.add(key(), b"1", 30) and not cache.add(key(), b"2", 30)
    assert cache.get(key()) == (b"1", "l1")
    assert set(cache.stats()) >= {"l1_hits", "l1_misses", "l1_sets"}


def test_tiered_stats_are_prefixed_by_level(tiers, key) -> None:
    cache, _ = tiers
    cache.get(key())
    stats = cache.stats()
    assert stats["l1_misses"] >= 1 and stats["l2_misses"] >= 1
    assert "l2_dead_skips" in stats
