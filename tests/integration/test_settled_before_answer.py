"""A keyed call's settlement is in Memcached before its caller has the whole answer, so the
caller's next call, on any worker of any instance, counts against what the last one really
spent (docs/security.md, "Limits and budgets"). Held from outside: Memcached sits behind a
fault proxy that delays every command on its way to it, and its own ``stats``, read
directly, are looked at the moment the answer has been read whole through nginx.

Issue 45 asked whether the settlement could be sent after the answer to save the caller its
wait (bench/HISTORY.md, "A keyed call at 10 callers"): it would make the key's give-back
reach Memcached after a caller who calls again at once may already be counted, which these
tests refuse.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from tests.support.faultproxy import FaultProxy
from tests.support.keys_file import keys_toml
from tests.support.memcached import memcached_stats, start_memcached
from tests.support.waiting import minute_with_room

DELAY_S = 0.3  # each command reaches Memcached this long after the worker sent it
LIMITS = "tokens_per_minute = 100000000\ntokens_per_day = 100000000\nmax_streams = 1000"
http = urllib3.PoolManager(retries=False)


def _secret(name: str) -> str:
    return f"llmg-settled-{name}-secret"


@pytest.fixture(scope="module")
def slowed(make_stack, tmp_path_factory) -> Iterator[tuple[str, FaultProxy, int]]:
    run_dir: Path = tmp_path_factory.mktemp("settled-before-answer")
    keys = run_dir / "keys.toml"
    keys.write_text(keys_toml([("settled", LIMITS)], _secret))
    mc, port = start_memcached(run_dir)
    proxy = FaultProxy("127.0.0.1", port).start()
    # A command's wait within the counters' timeout: counted, not passed uncounted.
    env = {
        "LLMGATE_KEYS_FILE": str(keys),
        "LLMGATE_CACHE_MODE": "off",
        "LLMGATE_MEMCACHED": f"127.0.0.1:{proxy.port}",
        "LLMGATE_MEMCACHED_TIMEOUT_S": "2",
    }
    stack = make_stack(env=env, memcached=False, workers=2)
    yield stack.url, proxy, port
    proxy.stop()
    mc.stop()


def _call(url: str, stream: bool) -> bytes:
    """The whole answer: a body to its last byte, a stream to its end (its last chunk)."""
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "settle"}],
        "max_tokens": 8,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {_secret('settled')}", "Content-Type": "application/json"}
    resp = http.request(
        "POST", url + "/v1/chat/completions", body=json.dumps(body), headers=headers
    )
    assert resp.status == 200, resp.data
    return resp.data


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_the_settlement_is_in_memcached_when_the_caller_has_the_answer(slowed, stream) -> None:
    url, proxy, port = slowed
    minute_with_room(10)
    _call(url, stream)  # the window's counters made
    proxy.latency(0.0, DELAY_S)
    try:
        before = memcached_stats(port)
        answer = _call(url, stream)
        at_the_answer = memcached_stats(port)
        time.sleep(3 * DELAY_S)  # anything still on its way to Memcached is there by now
        later = memcached_stats(port)
    finally:
        proxy.pass_through()
    assert (b"data: [DONE]" in answer) == stream
    # Given back: the tokens held beyond the answer's usage, in both token windows (and the
    # stream slot): every decr of the settlement counted before the caller had the answer,
    # each once.
    decrs = 3 if stream else 2
    assert at_the_answer["decr_hits"] - before["decr_hits"] == decrs
    assert later["decr_hits"] - before["decr_hits"] == decrs
    assert later["incr_hits"] - before["incr_hits"] == decrs
