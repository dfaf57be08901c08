"""The spend ledger of a cluster (issue 46): two instances of two workers behind nginx, one
Memcached and one PostgreSQL of the stack's own, as `make run-cluster` runs them. 1,000 calls
of four keys at once, streamed and not, give 1,000 rows (each call once), and each key's
rows add up to what its counters hold in Memcached, tokens and money, and all of them to
what the simulator itself counted it generated. Every figure is read at its source: the
database (tests/support/postgres.py ``ledger_query``), Memcached's own answers, the
simulator's /sim/stats.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import urllib3

from app.tenancy import limits
from tests.conftest import require_postgres
from tests.support.bodies import chat_about
from tests.support.keys_file import keys_toml, priced_config
from tests.support.memcached import memcached_get
from tests.support.postgres import ledger_query
from tests.support.sim import sim_stats
from tests.support.stack import NOWHERE, file_stack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
CALLS = 1000
BUDGETS = "tokens_per_day = 100000000\ntokens_per_month = 1000000000\nusd_per_month = 100000"
KEYS = {f"k{i}": BUDGETS for i in range(4)}
http = urllib3.PoolManager(retries=False, maxsize=32, timeout=urllib3.Timeout(total=60))


def secret(name: str) -> str:
    return f"llmg-{name}-cluster-secret"


@pytest.fixture(scope="module")
def cluster(make_stack, tmp_path_factory, upstream_sim):
    require_postgres()
    config = priced_config(upstream_sim, version="cluster-1", price_in=3.0, price_out=15.0)
    keys = keys_toml(KEYS.items(), secret)
    folder = tmp_path_factory.mktemp("cluster")
    return file_stack(
        make_stack,
        folder,
        config,
        keys=keys,
        instances=2,
        workers=2,
        postgres=True,
        upstream_url=NOWHERE,
    )


def one_call(url: str, i: int) -> int:
    key = f"k{i % 4}"
    stream = i % 2 == 1
    body = chat_about(f"call number {i} of the cluster", max_tokens=5 + i % 7, stream=stream)
    resp = http.request(
        "POST",
        url + "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {secret(key)}",
            "Content-Type": "application/json",
            "x-sim-tps": "5000",
        },
    )
    return resp.status


def counter(port: int, window: limits.Window, key: str) -> int:
    raw = memcached_get(port, window.key(key))
    assert raw is not None, f"no {window.what} counter for {key}"
    return int(raw.strip())


def test_a_thousand_calls_are_a_thousand_rows_that_add_up_everywhere(cluster, upstream_sim) -> None:
    url = cluster.stack.ledger_url
    assert url.startswith("postgresql://")
    before = sim_stats(upstream_sim)
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda i: one_call(cluster.url, i), range(CALLS)))
    assert statuses == [200] * CALLS
    count = "SELECT COUNT(*) FROM llmgate_spend"
    assert wait_for(lambda: ledger_query(url, count)[0][0] == CALLS, timeout=30)
    generated = sim_stats(upstream_sim)["tokens"] - before["tokens"]
    rows = ledger_query(
        url,
        "SELECT key_name, COUNT(*), SUM(tokens), SUM(cost_pico), SUM(tokens_in + tokens_out), "
        "COUNT(DISTINCT upstream_request_id), MIN(basis), MAX(basis) FROM llmgate_spend "
        "GROUP BY key_name ORDER BY key_name",
    )
    assert [r[0] for r in rows] == ["k0", "k1", "k2", "k3"]
    assert sum(r[1] for r in rows) == CALLS
    assert sum(r[2] for r in rows) == generated  # the simulator's own count
    port = int(cluster.stack.memcached_addr.rsplit(":", 1)[1])
    now = time.time()
    for name, calls, tokens, cost, parts, providers, low, high in rows:
        assert calls == CALLS // 4 and (low, high) == ("usage", "usage")
        assert providers == calls  # each row its own provider request id
        assert tokens == parts  # charged what the usage said: prompt plus output
        assert counter(port, limits.month("tokens_month", now), name) == tokens
        assert counter(port, limits.day("tokens_day", now), name) == tokens
        assert counter(port, limits.month("usd_month", now), name) == cost

    def rows_counted(result: str) -> float:  # each worker publishes its counts every second
        return sum(cluster.per_instance("llmgate_ledger_rows_total", result=result))

    assert wait_for(lambda: rows_counted("written") == CALLS, timeout=10)
    assert rows_counted("dropped") == rows_counted("lost") == 0
