"""The limit counters' contract (app/tenancy/limits.py ``Counters``), kept by both implementations:
Memcached's (app/store/counters.py; real memcached on loopback) and the per-worker stand-in.
Memcached's own contents are read with a plain client of the test's, not through the code
under test.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymemcache.client.base import Client

from app.store.counters import MemcachedCounters
from app.store.memcached import MemcachedBackend
from app.tenancy.limits import MISSING, Count, MemoryCounters
from runner.procs import free_port
from tests.conftest import ROOT
from tests.support.faultproxy import FaultProxy
from tests.support.memcached import memcached_stats, start_memcached
from tests.support.trips import TripCounter


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


def _one(counters, key: str, delta: int, ttl: int = 0, *, renew: bool = False) -> int | None:
    return counters.apply([Count(key, delta, ttl, renew)])[0]


def test_incr_creates_counts_and_decr_stops_at_zero(counters, request) -> None:
    key = f"llmgate:rl:v1:t:{request.node.callspec.id}:requests:0"
    assert counters.read([key]) == {}
    assert _one(counters, key, 1, ttl=60) == 1
    assert _one(counters, key, 5, ttl=60) == 6
    assert _one(counters, key, 0, ttl=60) == 6  # a read that counts nothing
    assert _one(counters, key, -2) == 4
    assert _one(counters, key, -10) == 0
    assert _one(counters, key, 7, ttl=60) == 7
    assert counters.read([key, key + "x"]) == {key: 7}


def test_memcached_holds_the_count_as_a_plain_decimal_with_its_ttl(mc) -> None:
    counters = _counters(mc, timeout=1.0)
    key = "llmgate:rl:v1:t:raw:requests:0"
    _one(counters, key, 12, ttl=120)
    _one(counters, key, -3)  # 12 -> 9: memcached may pad the shorter number with a space
    raw = Client(("127.0.0.1", mc))
    assert raw.get(key).strip() == b"9"
    assert counters.read([key]) == {key: 9}
    other = _counters(mc, timeout=1.0)
    assert _one(other, key, 1, ttl=120) == 10  # another process's client: the same counter
    for client in (raw, counters, other):
        client.close()


def test_an_unreachable_node_is_none_never_an_exception() -> None:
    down = _counters(free_port(), timeout=0.2, connect_timeout=0.2)
    key = "llmgate:rl:v1:t:down:requests:0"
    assert down.apply([Count(key, 1, 60), Count(key, -1)]) == [None, None]
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
    _one(counters, key, 1, ttl=5)
    _one(counters, key, 1, ttl=700)  # not renewed: the TTL it was made with stays
    assert _ttl(mc, key) <= 5
    _one(counters, key, 1, ttl=700, renew=True)
    assert 690 <= _ttl(mc, key) <= 700
    assert counters.read([key]) == {key: 3}
    counters.close()


def test_a_batch_gives_each_count_its_own_value_in_order(counters, request) -> None:
    key = f"llmgate:rl:v1:t:{request.node.callspec.id}:batch:"
    a, b, gone = key + "a", key + "b", key + "gone"
    assert counters.apply([Count(a, 4, 60), Count(b, 2, 60, renew=True)]) == [4, 2]
    batch = [Count(a, 1, 60), Count(b, 5, 60, renew=True), Count(gone, -3), Count(a, -2),
             Count(b, 0, 60)]  # fmt: skip
    assert counters.apply(batch) == [5, 7, 0, 3, 7]
    assert counters.read([a, b, gone]) == {a: 3, b: 7}  # a decr makes no counter


def test_a_budget_count_leaves_a_missing_counter_missing_until_made_at_its_start(
    counters, request
) -> None:
    """A day's or month's budget is counted with ``create`` False, so that a counter Memcached
    lost is made again from the spend ledger (app/tenancy/access.py), at its ``start``."""
    key = f"llmgate:rl:v1:t:{request.node.callspec.id}:tokens_month:0"
    assert counters.apply([Count(key, 5, 60, create=False)]) == [MISSING]
    assert counters.read([key]) == {}  # nothing was made, nothing counted
    assert counters.apply([Count(key, 5, 60, start=100)]) == [105]
    assert counters.apply([Count(key, 1, 60, create=False)]) == [106]
    # A second maker finds it made (its add fails) and only counts: one start, never two.
    assert counters.apply([Count(key, 1, 60, start=900)]) == [107]


def test_counts_after_a_restart_go_on_a_new_connection_and_count(tmp_path) -> None:
    """A restarted node leaves the pooled connection closed on its side. A batch of counts
    looks before it writes, so it goes on a new connection instead of failing (which let the
    first call of each worker after a restart pass its limits uncounted)."""
    proc, port = start_memcached(tmp_path)
    counters = _counters(port, timeout=1.0)
    key = "llmgate:rl:v1:t:restart:tokens_month:0"
    try:
        assert counters.apply([Count(key, 3, 60)]) == [3]  # the connection is pooled now
        proc.kill()
        proc, _ = start_memcached(tmp_path, port=port)  # empty, where the old one was
        assert counters.apply([Count(key, 2, 60), Count(key + "x", 1, 60)]) == [2, 1]
        stats = memcached_stats(port)
        assert stats["incr_misses"] == 2 and stats["incr_hits"] == 2  # each sent once
    finally:
        counters.close()
        proc.kill()


# A worker's sockets are gevent's, which the peek before a batch reads through the
# non-blocking socket it wraps (app/store/guarded_client.py ``_closed_by_peer``).
RESTART_SCRIPT = r"""
from gevent import monkey

monkey.patch_all()

import json
import sys
from pathlib import Path

from app.store.counters import MemcachedCounters
from app.store.memcached import MemcachedBackend
from app.tenancy.limits import Count
from tests.support.memcached import memcached_stats, start_memcached

run_dir = Path(sys.argv[1])
proc, port = start_memcached(run_dir)
node = [("127.0.0.1", port)]
counters = MemcachedCounters(MemcachedBackend(node, timeout=1.0, connect_timeout=0.1))
key = "llmgate:rl:v1:t:restart-gevent:tokens_month:0"
first = counters.apply([Count(key, 3, 60)])  # the connection is pooled now
proc.kill()
proc, _ = start_memcached(run_dir, port=port)  # empty, where the old one was
second = counters.apply([Count(key, 2, 60), Count(key + "x", 1, 60)])
print(json.dumps({"first": first, "second": second, "stats": memcached_stats(port)}))
counters.close()
proc.kill()
"""


def test_a_gevent_workers_counts_after_a_restart_go_on_a_new_connection(tmp_path) -> None:
    """The restart above in a gevent-patched process, as a worker is: its batch too sees the
    pooled connection closed before it writes, and is sent once on a new one."""
    proc = subprocess.run(
        [sys.executable, "-c", RESTART_SCRIPT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["first"] == [3] and result["second"] == [2, 1]
    stats = result["stats"]  # the new memcached's own counts: each incr sent once
    assert stats["incr_misses"] == 2 and stats["incr_hits"] == 2


@pytest.fixture
def trips(mc) -> Iterator[tuple[MemcachedCounters, TripCounter]]:
    proxy = TripCounter(("127.0.0.1", mc))
    counters = _counters(proxy.port, timeout=1.0)
    yield counters, proxy
    counters.close()
    proxy.close()


def test_a_batch_on_one_node_is_one_round_trip(trips, mc) -> None:
    """Counted by a proxy between the client and memcached, and by memcached's stats: every
    count is its own command, all written before the first reply is read."""
    counters, proxy = trips
    key = "llmgate:rl:v1:t:trips:"
    existing = [Count(key + what, 1, 60) for what in ("requests", "tokens", "tokens_day")]
    counters.apply(existing)  # made: a round trip, then one more to create them
    before, stats = proxy.counts(), memcached_stats(mc)
    batch = [*existing, Count(key + "streams", 1, 700, renew=True)]
    assert counters.apply(batch) == [2, 2, 2, 1]  # the streams counter is made here
    assert counters.apply([Count(c.key, -1) for c in batch]) == [1, 1, 1, 0]
    waits = proxy.counts()[1] - before[1]
    after = memcached_stats(mc)
    assert waits == 3  # the batch, the streams counter's creation, the decrements
    assert after["incr_hits"] - stats["incr_hits"] == 4  # three, then the made one
    assert after["incr_misses"] - stats["incr_misses"] == 1
    assert after["decr_hits"] - stats["decr_hits"] == 4
    # Sent with its incr before the reply says the counter is missing: a miss, harmless (the
    # add that makes it gives the TTL).
    assert after["touch_misses"] - stats["touch_misses"] == 1
    assert counters.apply([batch[3]]) == [1] and _ttl(mc, batch[3].key) > 600


def test_counts_on_a_node_that_is_down_fail_alone(mc) -> None:
    """Two nodes, one of them down: the counts on the other are made, in one round trip."""
    nodes = [("127.0.0.1", mc), ("127.0.0.1", free_port())]
    counters = MemcachedCounters(MemcachedBackend(nodes, timeout=0.5, connect_timeout=0.2))
    live, dead = f"127.0.0.1:{mc}", f"127.0.0.1:{nodes[1][1]}"
    keys = [f"llmgate:rl:v1:t:two:{i}:requests:0" for i in range(40)]
    on = {node: [k for k in keys if counters.memcached.node_of(k) == node] for node in (live, dead)}
    assert on[live] and on[dead]
    batch = [Count(k, 1, 60) for k in (on[live][0], on[dead][0], on[live][1], on[dead][1])]
    assert counters.apply(batch) == [1, None, 1, None]
    assert counters.read(on[live][:2]) == {on[live][0]: 1, on[live][1]: 1}
    counters.close()


def test_an_error_reply_fails_its_batch_and_the_next_reads_its_own_replies(mc) -> None:
    """An item under a counter's key that is not a number: memcached answers CLIENT_ERROR in
    the middle of the batch. The batch fails (counted); the connection reads nothing of it
    after, so the next batch's values are its own."""
    counters = _counters(mc, timeout=1.0)
    good, bad = "llmgate:rl:v1:t:err:requests:0", "llmgate:rl:v1:t:err:tokens:0"
    raw = Client(("127.0.0.1", mc))
    raw.set(bad, b"not a number")
    assert counters.apply([Count(good, 1, 60)]) == [1]
    errors = counters.memcached.stats()["errors"]
    assert counters.apply([Count(good, 1, 60), Count(bad, 1, 60), Count(good, 1, 60)]) == [
        None, None, None]  # fmt: skip
    assert counters.memcached.stats()["errors"] == errors + 1
    for expected in (4, 5, 6):  # the batch's increments were made; memcached says so
        assert counters.apply([Count(good, 1, 60)]) == [expected]
    raw.close()
    counters.close()


# -- the calls of a worker, together (gevent) ---------------------------------------------------
TOGETHER_SCRIPT = r"""
from gevent import monkey

monkey.patch_all()

import json
import sys

import gevent

from app.store.counters import MemcachedCounters
from app.store.memcached import MemcachedBackend
from app.tenancy.limits import Count

port, shared, callers, kill_first = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
counters = MemcachedCounters(MemcachedBackend([("127.0.0.1", port)], timeout=5.0))
seen = {}


def call(i):
    # A call's grant: the key's counter, shared by every call, and one of its own.
    seen[i] = counters.apply([Count(shared, 1, 60), Count(f"{shared}:own:{i}", 2, 60)])


greenlets = [gevent.spawn(call, i) for i in range(callers)]
if kill_first == "kill":
    gevent.sleep(0.1)  # the first call's batch is out (the proxy holds its reply), the rest wait
    greenlets[2].kill()  # the third's caller leaves while its counts wait for the next batch
    greenlets[0].kill()  # the first's: a GreenletExit where it waits for the reply
gevent.joinall(greenlets, timeout=30)
print(json.dumps({"seen": seen, "stats": counters.memcached.stats()}))
"""


def _together(port: int, shared: str, callers: int, kill_first: bool = False) -> dict:
    leave = "kill" if kill_first else "-"
    proc = subprocess.run(
        [sys.executable, "-c", TOGETHER_SCRIPT, str(port), shared, str(callers), leave],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict = json.loads(proc.stdout)
    return result


def test_concurrent_calls_share_round_trips_and_each_sees_its_own_count(trips, mc) -> None:
    """30 greenlets of one worker (a gevent-patched process of its own) ask for their counts
    in the same turn of the loop. The first is sent at once, the other 29 wait for it and go
    together: a proxy between the worker and memcached counts the round trips, memcached's
    own item the total, and each call's value is the count its ``incr`` made: 1 to 30, each
    once, as 30 round trips one after another would give."""
    _, proxy = trips
    shared = "llmgate:rl:v1:t:together:requests:0"
    before = proxy.counts()[1]
    result = _together(proxy.port, shared, 30)
    waits = proxy.counts()[1] - before
    values = sorted(v[0] for v in result["seen"].values())
    assert values == list(range(1, 31))
    assert all(v[1] == 2 for v in result["seen"].values())  # each call's own counter, made
    # The first call's batch and its counters' creation, then the rest's batch and theirs.
    assert waits <= 4, waits
    raw = Client(("127.0.0.1", mc))
    assert raw.get(shared).strip() == b"30"
    raw.close()


def test_a_caller_who_leaves_mid_batch_does_not_take_the_waiting_calls_with_it(mc) -> None:
    """The first call's batch is on its way (a proxy holds memcached's replies 1 s) when its
    caller leaves: its greenlet is killed where it waits for the reply. The calls that asked
    meanwhile still get their counts, in a batch of their own, but for the third, whose
    caller left too while its counts waited: they are never sent. Memcached holds the first
    call's increment (written before its caller left) and the three others' over the one
    before, and no counter of the third's own."""
    shared = "llmgate:rl:v1:t:leaves:requests:0"
    made = _counters(mc, timeout=1.0)
    assert _one(made, shared, 1, ttl=60) == 1  # the window's first call, long done
    made.close()
    with FaultProxy("127.0.0.1", mc) as proxy:
        proxy.latency(1.0)  # far longer than the script's 0.1 s wait, even on a busy machine
        result = _together(proxy.port, shared, 5, kill_first=True)
    seen = result["seen"]
    assert sorted(seen) == ["1", "3", "4"]  # the callers who left got nothing
    assert sorted(v[0] for v in seen.values()) == [3, 4, 5]
    assert all(v[1] == 2 for v in seen.values())
    raw = Client(("127.0.0.1", mc))
    assert raw.get(shared).strip() == b"5"
    assert raw.get(f"{shared}:own:2") is None and raw.get(f"{shared}:own:1") is not None
    raw.close()


@pytest.mark.parametrize(("size", "rate", "burst"), [(40, 2000, 16), (8, 200, 1)])
def test_a_batchs_replies_read_in_many_pieces_are_all_read(mc, size, rate, burst) -> None:
    """Memcached's replies to a batch reach the client a few bytes at a time, down to one
    (a proxy throttles them, so even the ``MN`` that ends them comes in pieces): every reply
    is still read, each count gets its value."""
    key = f"llmgate:rl:v1:t:pieces{size}:"
    made = _counters(mc, timeout=1.0)
    batch = [Count(f"{key}{i}", 1, 60) for i in range(size)]
    assert made.apply(batch) == [1] * size  # made, directly
    made.close()
    with FaultProxy("127.0.0.1", mc) as proxy:
        proxy.bandwidth(rate, burst=burst)
        counters = _counters(proxy.port, timeout=5.0)
        assert counters.apply([Count(c.key, i, 60) for i, c in enumerate(batch)]) == [
            1 + i for i in range(size)]  # fmt: skip
        assert counters.memcached.stats()["errors"] == 0
        counters.close()
