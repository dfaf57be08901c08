"""What a call with a gateway key costs Memcached, counted from outside the gateway: a stack
of two gevent workers behind nginx whose Memcached sits behind a proxy that counts round
trips (tests/support/trips.py); the commands from Memcached's own ``stats``. The cache is
off, so every command is the limit counters'.

A call waits for Memcached once for its grant (every limit its key has, one ``incr`` each,
written together) and once for its settlement; a limit the key does not have costs nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from tests.support.keys_file import keys_toml
from tests.support.memcached import memcached_stats, start_memcached
from tests.support.trips import TripCounter
from tests.support.waiting import minute_with_room

LIMITS = {
    "all": "requests_per_minute = 100000\ntokens_per_minute = 100000000\n"
    "tokens_per_day = 100000000\nmax_streams = 1000",
    "requests-only": "requests_per_minute = 100000",
    "unlimited": "",
}
COMMANDS = ("incr_hits", "incr_misses", "decr_hits", "decr_misses", "cmd_touch", "cmd_set")
http = urllib3.PoolManager(retries=False)


def _secret(name: str) -> str:
    return f"llmg-trips-{name}-secret"


@pytest.fixture(scope="module")
def counted(make_stack, tmp_path_factory) -> Iterator[tuple[str, TripCounter, int]]:
    run_dir: Path = tmp_path_factory.mktemp("round-trips")
    keys = run_dir / "keys.toml"
    keys.write_text(keys_toml(LIMITS.items(), _secret))
    mc, port = start_memcached(run_dir)
    proxy = TripCounter(("127.0.0.1", port))
    env = {"LLMGATE_KEYS_FILE": str(keys), "LLMGATE_CACHE_MODE": "off",
           "LLMGATE_MEMCACHED": f"127.0.0.1:{proxy.port}"}  # fmt: skip
    stack = make_stack(env=env, memcached=False, workers=2)
    yield stack.url, proxy, port
    proxy.close()
    mc.stop()


def _calls(url: str, key: str, stream: bool, n: int) -> None:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8, "stream": stream}  # fmt: skip
    headers = {"Authorization": f"Bearer {_secret(key)}", "Content-Type": "application/json"}
    for _ in range(n):
        resp = http.request("POST", url + "/v1/chat/completions", body=json.dumps(body),
                            headers=headers)  # fmt: skip
        assert resp.status == 200, resp.data


def _counted(counted, key: str, stream: bool, n: int, decrs: int) -> tuple[int, dict[str, int]]:
    """Round trips and commands of ``n`` calls, after two calls made the window's counters;
    ``decrs``: the decrements their settlements make, waited for."""
    url, proxy, port = counted
    minute_with_room(20)
    _calls(url, key, stream, 2)
    time.sleep(0.3)  # their settlements, sent as the answers end
    waits, before = proxy.counts()[1], memcached_stats(port)
    _calls(url, key, stream, n)
    deadline = time.monotonic() + 5
    while True:  # the last settlement is sent once its answer has left
        after = memcached_stats(port)
        done = {name: after[name] - before[name] for name in COMMANDS}
        if done["decr_hits"] >= decrs or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.1)  # anything more would show
    return proxy.counts()[1] - waits, done


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_a_call_waits_for_memcached_once_to_admit_and_once_to_settle(counted, stream) -> None:
    waits, done = _counted(counted, "all", stream, 10, decrs=10 * (3 if stream else 2))
    # requests, tokens a minute, tokens a day (and the stream slot): one incr each; back at the
    # end, the tokens held beyond the answer's usage and the slot.
    assert done == {"incr_hits": 10 * (4 if stream else 3), "incr_misses": 0,
                    "decr_hits": 10 * (3 if stream else 2), "decr_misses": 0,
                    "cmd_touch": 10 if stream else 0, "cmd_set": 0}  # fmt: skip
    assert waits == 2 * 10


def test_a_limit_the_key_does_not_have_costs_nothing(counted) -> None:
    waits, done = _counted(counted, "requests-only", True, 10, decrs=0)
    assert done == {"incr_hits": 10, "incr_misses": 0, "decr_hits": 0, "decr_misses": 0,
                    "cmd_touch": 0, "cmd_set": 0}  # fmt: skip
    assert waits == 10  # nothing to settle: the request was served
    waits, done = _counted(counted, "unlimited", True, 10, decrs=0)
    assert waits == 0 and not any(done.values())
