"""Cache-affine routing through the whole stack, counted by the simulator's own accounts.

Three equal upstreams, each an account of its own on one simulator that keeps a prompt
cache per account (simulator/prompt_cache.py), each reached through a fault proxy so it can
go down or turn slow. The simulator's per-account counters say where each call went and
what its prompt cache did, independently of the gateway's headers and log lines. One
gunicorn worker, so the bounded load read here is the one that acted.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import urllib3

from simulator.stats import group_of
from tests.support.faultproxy import FaultProxy
from tests.support.sim import sim_stats, start_simulator
from tests.support.stack import UPSTREAM, StackHandle, config_stack

NAMES = ("u1", "u2", "u3")
KEYS = {name: f"sk-{name}" for name in NAMES}
ACCOUNT = {group_of(key): name for name, key in KEYS.items()}  # the simulator's names for them
http = urllib3.PoolManager(retries=False, maxsize=128, timeout=urllib3.Timeout(read=30))


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Iterator[str]:
    proc, url = start_simulator(
        tmp_path_factory.mktemp("affinity-sim"), "--prompt-cache", "--ttft-ms", "0"
    )
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def proxies(sim: str) -> Iterator[dict[str, FaultProxy]]:
    port = int(sim.rsplit(":", 1)[1])
    started = {name: FaultProxy("127.0.0.1", port).start() for name in NAMES}
    yield started
    for proxy in started.values():
        proxy.stop()


def _toml(proxies: dict[str, FaultProxy], extra: str = "") -> str:
    return "".join(
        f"""
[[upstreams]]
name = "{name}"
base_url = "http://127.0.0.1:{proxies[name].port}/v1"
key = "{KEYS[name]}"
headers = {{ "x-sim-cache-min-tokens" = "64" }}
{extra}
"""
        for name in NAMES
    )


@pytest.fixture(scope="module")
def gw(make_stack, tmp_path_factory, proxies) -> StackHandle:
    return config_stack(
        make_stack, tmp_path_factory, _toml(proxies), LLMGATE_BREAKER_COOLDOWN_S="60"
    )


@pytest.fixture(autouse=True)
def _healthy(proxies: dict[str, FaultProxy], sim: str) -> Iterator[None]:
    http.request("POST", sim + "/sim/reset")
    yield
    for proxy in proxies.values():
        proxy.pass_through()


def _accounts(sim: str) -> dict[str, dict[str, int]]:
    """What each upstream's account saw, by the simulator's own count."""
    counts = sim_stats(sim)["prompt_cache"]
    return {ACCOUNT[group]: c for group, c in counts.items() if group in ACCOUNT}


def _words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


class Conversation:
    """An agent loop's turns: one head, a tail growing by an answer and a result a turn."""

    def __init__(self, seed: str) -> None:
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": _words(100, "sys")},
            {"role": "user", "content": _words(100, seed)},
        ]
        self.seed = seed

    def turn(self, gw: StackHandle, **headers: str) -> urllib3.BaseHTTPResponse:
        body = {"model": "m", "max_tokens": 5, "messages": self.messages}
        resp = gw.post("/v1/chat/completions", body, headers=headers)
        assert resp.status == 200, resp.data
        answer = json.loads(resp.data)["choices"][0]["message"]["content"]
        n = len(self.messages)
        self.messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": _words(40, f"{self.seed}-{n}")},
        ]
        return resp


@pytest.fixture(scope="module")
def failing(make_stack, tmp_path_factory, proxies) -> StackHandle:
    """A stack of its own: the breaker it opens stays with it."""
    return config_stack(
        make_stack, tmp_path_factory, _toml(proxies), LLMGATE_BREAKER_COOLDOWN_S="61"
    )


def test_a_conversation_keeps_its_upstream_over_20_turns_and_moves_once_when_it_fails(
    failing: StackHandle, proxies: dict[str, FaultProxy], sim: str
) -> None:
    gw = failing
    talk = Conversation("fix-the-bug")
    answered = [talk.turn(gw).headers[UPSTREAM] for _ in range(20)]
    first = answered[0]
    assert answered == [first] * 20
    seen = _accounts(sim)
    assert set(seen) == {first} and seen[first]["requests"] == 20
    # Its prefix was read back from the second turn on: all but what each turn added.
    assert seen[first]["read"] > 0.6 * (seen[first]["read"] + seen[first]["uncached"])

    proxies[first].down()
    moved = [talk.turn(gw).headers[UPSTREAM] for _ in range(6)]
    second = moved[0]
    assert second != first and moved == [second] * 6  # one move, and it stays
    seen = _accounts(sim)
    assert seen[second]["requests"] == 6 and set(seen) == {first, second}
    assert seen[first]["requests"] == 20  # nothing more reached the one that was down
    log = gw.log_records()[-6:]
    assert [r["routing"]["choice"] for r in log] == [first] * 5 + [second]  # breaker opened
    assert {r["routing"]["key"] for r in log} == {"prefix"}


def test_a_hot_prefix_from_100_sessions_keeps_each_upstream_within_its_bounded_share(
    gw: StackHandle, sim: str
) -> None:
    """100 sessions of one prefix at once (each held 2.5 s at the upstream): no upstream
    above (1 + 0.25) x its third of the calls in flight, the key's first choice full first,
    then its second; the third takes the rest."""
    body = {
        "model": "m",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": _words(100, "hot")}],
    }
    headers = {"x-sim-ttft-ms": "2500"}
    with ThreadPoolExecutor(100) as pool:
        answers = list(
            pool.map(lambda _: gw.post("/v1/chat/completions", body, headers=headers), range(100))
        )
    assert [r.status for r in answers] == [200] * 100
    counts = {name: c["requests"] for name, c in _accounts(sim).items()}
    assert sum(counts.values()) == 100
    cap = math.ceil((1 + 0.25) * 100 / 3)
    assert max(counts.values()) <= cap, counts
    log = [r for r in gw.log_records()[-100:] if r["routing"]["key"] == "prefix"]
    assert len(log) == 100
    (first,) = {r["routing"]["choice"] for r in log if r["routing"]["reason"] == "affine"}
    assert {r["routing"]["reason"] for r in log} == {"affine", "spill"}
    # Filled in the key's order: its first choice to its cap, its second next, the third
    # the rest (the caps grow with the calls in flight: 42 at 100).
    fullest = sorted(counts.values(), reverse=True)
    assert counts[first] >= cap - 2 and fullest[1] >= cap - 2, counts


@pytest.fixture(scope="module")
def hedged(make_stack, tmp_path_factory, proxies) -> StackHandle:
    return config_stack(
        make_stack,
        tmp_path_factory,
        _toml(proxies, "hedge_after = 300"),
        LLMGATE_BREAKER_COOLDOWN_S="60",
    )


def _stream(gw: StackHandle, talk: Conversation) -> str:
    body = {"model": "m", "max_tokens": 3, "stream": True, "messages": talk.messages}
    resp = gw.post("/v1/chat/completions", body, preload_content=False)
    data = resp.read()
    assert resp.status == 200 and data.endswith(b"data: [DONE]\n\n"), data
    return str(resp.headers[UPSTREAM])


def test_a_hedges_backup_goes_to_the_prefixs_second_choice(
    hedged: StackHandle, proxies: dict[str, FaultProxy], sim: str
) -> None:
    talk = Conversation("hedged")
    first = _stream(hedged, talk)
    proxies[first].down()  # where does the conversation go when its first choice fails?
    second = _stream(hedged, talk)
    proxies[first].latency(1.5)  # back, but slow to answer: each stream is hedged
    before = _accounts(sim)
    started = time.monotonic()
    winners = [_stream(hedged, talk) for _ in range(3)]
    assert winners == [second] * 3 and time.monotonic() - started < 3 * 1.5
    after = _accounts(sim)
    # Each hedge sent one backup, every time to the second choice; the third saw none.
    third = next(n for n in NAMES if n not in (first, second))
    assert after[second]["requests"] - before[second]["requests"] == 3
    assert after.get(third, {"requests": 0})["requests"] == before.get(third, {}).get("requests", 0)
    assert hedged.metric("llmgate_hedges_total", upstream=first, winner="backup") == 3
