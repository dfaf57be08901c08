"""Several instances behave as one gateway (issue 12): `make run-cluster`'s shape on loopback.

Three gateway instances (each its own gunicorn, one gevent worker) behind one nginx upstream
block (least_conn, passive health checks, retries only of connects), two Memcached nodes,
the simulator upstream — built by runner/stack.py, as `make run-cluster` builds it. Counts
come from the simulator's own /sim/stats, each instance's own /metrics, Memcached's stats
and the bytes callers received (every answer judged against its prompt, tests/support/calls.py).
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import urllib3

from runner.__main__ import write_scrape_targets
from runner.stack import Stack, StackOptions
from tests.conftest import require_binary
from tests.support.calls import Outcome, call
from tests.support.memcached import memcached_stats
from tests.support.stack import StackHandle
from tests.support.waiting import wait_for

INSTANCES = 3
http = urllib3.PoolManager(maxsize=256, retries=False)
# Slow, whole: the cluster takes about 17 s to stop (its three instances drain) and a
# rolling restart under load about 10 s.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(runs_dir: Path) -> Iterator[StackHandle]:
    require_binary("nginx")
    require_binary("memcached")
    options = StackOptions(
        run_dir=runs_dir / "cluster",
        instances=INSTANCES,
        memcached_nodes=2,
        workers=1,
        env={
            # L1 copies live 1 s, so a read after that shows what Memcached holds.
            "LLMGATE_CACHE_L1_TTL_S": "1",
            # A restarted instance drains in seconds here, not the production 600 s.
            "LLMGATE_GRACEFUL_TIMEOUT_S": "20",
        },
    )
    stack = Stack(options).start()
    try:
        yield StackHandle(stack)
    finally:
        stack.stop()


def served(gw: StackHandle) -> list[float]:
    return gw.per_instance("llmgate_requests_total")


# -- 1. one upstream call for 200 identical requests over three instances -------------------
def test_200_identical_requests_over_three_instances_make_one_upstream_call(cluster) -> None:
    gw = cluster
    gw.sim_reset()
    before = served(gw)
    prompt = f"cluster coalesce {uuid.uuid4().hex}"
    slow = {"x-sim-tps": "20", "x-sim-ttft-ms": "300"}  # ~1.3 s of streaming
    barrier = threading.Barrier(200)

    def one(i: int) -> Outcome:
        barrier.wait(10)
        return call(http, gw.url, prompt, 20, stream=True, temperature=0, headers=slow)

    with ThreadPoolExecutor(200) as pool:
        outcomes = list(pool.map(one, range(200)))
    per_instance = [after - b for after, b in zip(served(gw), before, strict=True)]
    statuses = Counter(o.cache.split(";")[0] for o in outcomes)
    print(f"coalesce: per instance {per_instance}, statuses {dict(statuses)}")
    assert [str(o) for o in outcomes if o.kind != "ok"] == []
    assert all(n > 0 for n in per_instance), per_instance  # spread over every instance
    assert sum(per_instance) == 200
    assert gw.sim_stats()["requests"] == 1, (gw.sim_stats(), statuses)
    assert statuses["MISS"] == 1


# -- 2. an instance SIGKILLed mid-burst: only its in-flight calls fail -----------------------
def test_an_instance_killed_mid_burst_fails_only_its_in_flight_calls(cluster) -> None:
    gw = cluster
    gw.sim_reset()
    run = uuid.uuid4().hex[:8]
    slow = {"x-sim-tps": "5", "x-sim-ttft-ms": "0"}  # 20 tokens: ~4 s each
    results: list[Outcome | None] = [None] * 30

    def stream(i: int) -> None:  # not cacheable (no temperature 0): each goes upstream
        results[i] = call(http, gw.url, f"{run} in flight {i}", 20, stream=True, headers=slow)

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(30)]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: gw.sim_stats()["streams_started"] == 30, 15), gw.sim_stats()
    # The simulator counts a stream when it starts sending; an instance counts it active a
    # moment later, once its first event is on the way to the caller: wait for all 30.
    in_flight: list[float] = []

    def all_active() -> bool:
        in_flight[:] = gw.per_instance("llmgate_active_streams")
        return sum(in_flight) == 30

    assert wait_for(all_active, 15), in_flight
    assert all(in_flight), f"streams not spread over the instances: {in_flight}"
    victim = 0
    gw.stack.stop_instance(victim, sig=signal.SIGKILL)  # its whole process group
    killed_at = time.monotonic()
    # A call sent in the very instant of the death can go out on a keep-alive connection
    # nginx still holds to the dead instance; nginx cannot know whether that POST started,
    # so it answers 502 rather than retry it (docs/scaling.md). "After the kill" starts once
    # nginx had a moment to see those connections close.
    time.sleep(0.5)
    after: list[Outcome] = []
    lock = threading.Lock()

    def new_calls(n: int) -> None:
        for k in range(8):
            out = call(http, gw.url, f"{run} after {n}.{k}", 5, stream=k % 2 == 0,
                       headers={"x-sim-tps": "200"}, timeout_s=20)  # fmt: skip
            with lock:
                after.append(out)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(new_calls, range(8)))
    for thread in threads:
        thread.join(30)
    streams = [r for r in results if r is not None]
    failed = [r for r in streams if r.kind != "ok"]
    stats = gw.sim_stats()
    print(
        f"sigkill: active streams per instance {in_flight}, killed instance {victim}; "
        f"{len(failed)} of {len(streams)} streams failed, sim abandoned "
        f"{stats['streams_abandoned']}; {len(after)} calls after the kill "
        f"({time.monotonic() - killed_at:.1f} s), {sum(o.kind != 'ok' for o in after)} failed"
    )
    assert len(streams) == 30, "a stream thread hung"
    assert len(failed) <= in_flight[victim], [str(f) for f in failed]
    assert stats["streams_abandoned"] == in_flight[victim], stats
    assert [str(o) for o in after if o.kind != "ok"] == []
    assert len(after) == 64
    gw.stack.start_instance(victim)  # back for the next tests


# -- 3. a rolling restart under 100 concurrent streams ---------------------------------------
def test_a_rolling_restart_under_100_streams_fails_no_stream(cluster) -> None:
    """Each instance in turn: out of nginx's upstream block (a reload: what a pod's readiness
    and the Service do), SIGTERM (it drains: every stream it holds finishes), started again,
    back in. 100 callers stream the whole time, each stream ~1.5 s.

    Each stream on its own connection (`Connection: close`): an nginx reload closes the idle
    keep-alive connections of its old workers, and a caller that sends on one in that instant
    sees the connection closed before any byte (a client-side race of the reload itself, not
    of the gateway, which the OpenAI SDK retries as a connection error). Kubernetes has no such
    reload: the Service's endpoints change instead."""
    gw = cluster
    gw.sim_reset()
    run = uuid.uuid4().hex[:8]
    stop = threading.Event()
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    once = {"x-sim-tps": "10", "x-sim-ttft-ms": "100", "Connection": "close"}

    def caller(n: int) -> None:
        k = 0
        while not stop.is_set():
            out = call(http, gw.url, f"{run} rolling {n}.{k}", 15, stream=True, headers=once)
            k += 1
            with lock:
                outcomes.append(out)

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(100)]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: gw.sim_stats()["streams_started"] >= 100, 20)
    restarted = []
    for index in range(INSTANCES):
        gw.stack.set_down(index, True)
        time.sleep(0.5)  # nginx's new workers have the new block; old ones finish theirs
        began = time.monotonic()
        gw.stack.stop_instance(index, sig=signal.SIGTERM, timeout=30)
        drained = time.monotonic() - began
        gw.stack.start_instance(index)
        gw.stack.set_down(index, False)
        restarted.append(round(drained, 1))
        time.sleep(1.0)  # it takes streams again before the next one goes
    stop.set()
    for thread in threads:
        thread.join(30)
    kinds = Counter(o.kind for o in outcomes)
    print(f"rolling restart: drain times {restarted} s; {len(outcomes)} streams, {dict(kinds)}")
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert [str(o) for o in outcomes if o.kind != "ok"] == []
    assert len(outcomes) >= 300


# -- 4. one Memcached node stopped: its share of hits is lost, no call fails ----------------
def test_a_memcached_node_stopped_costs_its_share_of_hits_and_fails_nothing(cluster) -> None:
    gw = cluster
    gw.sim_reset()
    nodes = [int(a.rsplit(":", 1)[1]) for a in gw.stack.memcached_addrs]
    items_before = [memcached_stats(p)["curr_items"] for p in nodes]
    prompts = [f"share {i} {uuid.uuid4().hex}" for i in range(150)]

    def ask(prompt: str) -> Outcome:
        return call(http, gw.url, prompt, 4, stream=False, temperature=0)

    with ThreadPoolExecutor(16) as pool:
        first = list(pool.map(ask, prompts))
    assert [str(o) for o in first if o.kind != "ok"] == []
    stored = [
        memcached_stats(p)["curr_items"] - b for p, b in zip(nodes, items_before, strict=True)
    ]
    assert sum(stored) == len(prompts), stored  # one entry each (leases are deleted)
    share_lost = stored[1] / sum(stored)
    time.sleep(1.5)  # every L1 copy (LLMGATE_CACHE_L1_TTL_S=1) has expired
    gw.stack.proc("memcached-1").stop()
    with ThreadPoolExecutor(16) as pool:
        second = list(pool.map(ask, prompts))
    hits = sum(o.cache.startswith("HIT") for o in second)
    hit_rate = hits / len(prompts)
    errors = gw.per_instance("llmgate_cache_errors_total")
    print(
        f"memcached node stopped: entries per node {stored}, its share {share_lost:.2f}; "
        f"hit rate after {hit_rate:.2f} (expected about {1 - share_lost:.2f}); "
        f"{Counter(o.cache for o in second)}; cache errors per instance {errors}"
    )
    assert [str(o) for o in second if o.kind != "ok"] == []
    assert 0.1 < share_lost < 0.9, stored  # consistent hashing spread them
    assert abs(hit_rate - (1 - share_lost)) <= 0.1, (hit_rate, share_lost)


# -- 5. metrics per instance, summed by the dashboard ----------------------------------------
def test_each_instance_is_its_own_scrape_target_and_the_dashboard_sums_them(cluster) -> None:
    from tests.conftest import ROOT

    gw = cluster
    targets = json.loads(write_scrape_targets(gw.stack).read_text())
    assert targets[0]["targets"] == [u.removeprefix("http://") for u in gw.stack.app_urls]
    counts = served(gw)
    assert len(set(counts)) > 1 or counts[0] > 0  # each /metrics is its instance's own
    dashboard = json.loads((ROOT / "deploy/grafana/llmgate-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs and all("sum" in e and 'instance=~"$instance"' in e for e in exprs), exprs
