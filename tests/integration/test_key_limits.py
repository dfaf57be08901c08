"""A gateway key's limits tried the way they break: with time passing and with concurrent
callers, through nginx over two instances of two workers sharing one Memcached.

What a key spent is counted from outside the gateway: the simulator's own token count (it
adds up every answer it generated), and the usage of the answers the callers received,
priced with the same table by the test itself. The gateway's counters are read only to
check that they agree.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import urllib3

from app.store.discovery import resolve
from runner.procs import Proc, free_port
from tests.conftest import require_binary
from tests.support.bodies import chat_about
from tests.support.keys_file import keys_toml, priced_config
from tests.support.memcached import memcached_stats
from tests.support.metrics import samples
from tests.support.sim import sim_stats
from tests.support.stack import NOWHERE, file_stack
from tests.support.waiting import minute_with_room

KEYS = {
    "two-streams": "max_streams = 2",
    "day2000": "tokens_per_day = 2000",
    "tpm1000": "tokens_per_minute = 1000",
    "usd": "usd_per_day = 2.5",
    "responder": "tokens_per_day = 1000000",
    "capped": "max_tokens = 7\ntokens_per_day = 1000000",
    "edge": "tokens_per_day = 1000",
}
# USD per million tokens: dear on purpose, so a few calls reach a budget of 2.5 USD.
PRICE_IN, PRICE_OUT = 1000.0, 2000.0
# A test that reads one minute's count starts with this much of the minute left: each of
# them takes 2 s at most here (streams of 10 tokens at 5 a second).
MINUTE_ROOM_S = 10
http = urllib3.PoolManager(retries=False, maxsize=64, timeout=urllib3.Timeout(connect=5, read=60))


def secret(name: str) -> str:
    return f"llmg-{name}-limits-secret"


def config_toml(sim_url: str) -> str:
    return priced_config(sim_url, version="test-prices-1", price_in=PRICE_IN, price_out=PRICE_OUT)


@pytest.fixture(scope="module")
def sim_options() -> tuple[str, ...]:
    """This module's simulator answers at its own pace (its defaults)."""
    return ()


@pytest.fixture(scope="module")
def limited(make_stack, tmp_path_factory, upstream_sim):
    return file_stack(
        make_stack, tmp_path_factory.mktemp("limits-config"), config_toml(upstream_sim),
        keys=keys_toml(KEYS.items(), secret), instances=2, workers=2, upstream_url=NOWHERE,
    )  # fmt: skip


def post(url: str, key: str, body: dict, path: str = "/v1/chat/completions", **kw):
    return http.request(
        "POST",
        url + path,
        body=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {secret(key)}",
            **kw.pop("headers", {}),
        },
        **kw,
    )


def usage_of(gw, key: str) -> dict:
    resp = http.request("GET", gw.url + "/admin/usage")
    assert resp.status == 200, resp.data
    return {k["name"]: k for k in json.loads(resp.data)["keys"]}[key]


def metric(gw, name: str, **labels: str) -> float:
    """A metric summed over the instances (each aggregates its own workers only)."""
    total = 0.0
    for url in gw.stack.app_urls:
        text = http.request("GET", url + "/metrics").data.decode()
        total += sum(samples(text, name, **labels))
    return total


def log_line(gw, request_id: str) -> dict:
    """The JSON log line of the call ``request_id`` (written once its last byte has left)."""
    pattern = re.compile(rf'^\{{.*"{re.escape(request_id)}".*\}}$', re.M)
    for _ in range(100):
        logs = "".join(gw.log(f"gunicorn-{i}") for i in range(2))
        found = [json.loads(m) for m in pattern.findall(logs)]
        if found:
            (line,) = found
            return line
        time.sleep(0.05)
    raise AssertionError(f"no log line for {request_id}")


def words(n: int, salt: str) -> str:
    """A prompt of ``n`` words the simulator counts as ``n`` tokens, 3 bytes each."""
    return " ".join([salt[:2]] * n)


# -- stream slots that live as long as their streams -------------------------------------------
class OpenStream:
    """A stream read to its end in a thread of its own; its status known at once."""

    def __init__(self, url: str, tokens: int, tps: float) -> None:
        body = chat_about("hold the line", stream=True, max_tokens=tokens)
        self.resp = post(url, "two-streams", body, preload_content=False,
                         headers={"x-sim-tps": str(tps)})  # fmt: skip
        self.data = b""
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while chunk := self.resp.read1(65536):
                self.data += chunk
        finally:
            self.resp.release_conn()
            self.done.set()


@pytest.mark.slow
def test_max_streams_holds_for_as_long_as_the_streams_stay_open(limited) -> None:
    start = time.monotonic()

    def at(t: float) -> None:
        time.sleep(max(0.0, start + t - time.monotonic()))

    first = OpenStream(limited.url, tokens=20, tps=2)  # ~10 s of tokens
    assert first.resp.status == 200
    at(1.5)
    second = OpenStream(limited.url, tokens=24, tps=2)
    assert second.resp.status == 200
    at(2.5)  # the old counter had expired a second after the first stream began
    third = post(limited.url, "two-streams", chat_about("x", stream=True, max_tokens=2))
    assert third.status == 429, third.data[:300]
    assert json.loads(third.data)["error"]["code"] == "rate_limit_exceeded"
    assert int(third.headers["retry-after"]) >= 1
    assert usage_of(limited, "two-streams")["streams_open"] == 2
    at(6.0)  # both still streaming: still full
    assert post(limited.url, "two-streams", chat_about("x", stream=True)).status == 429
    assert first.done.wait(30) and first.data.endswith(b"data: [DONE]\n\n")
    assert not second.done.is_set()  # one slot free, one still held
    fourth = post(limited.url, "two-streams", chat_about("x", stream=True, max_tokens=2))
    assert fourth.status == 200 and fourth.data.endswith(b"data: [DONE]\n\n")
    assert second.done.wait(30)
    deadline = time.monotonic() + 5
    while usage_of(limited, "two-streams")["streams_open"] and time.monotonic() < deadline:
        time.sleep(0.1)  # the last settlement runs as the last byte leaves
    assert usage_of(limited, "two-streams")["streams_open"] == 0


# -- budgets that concurrent calls cannot overspend --------------------------------------------
def spend_concurrently(gw, sim: str, key: str, bodies: list[dict]) -> tuple[list, int]:
    """Send ``bodies`` at once through nginx; the answers and the simulator's own count of
    the tokens it generated meanwhile."""
    before = sim_stats(sim)["tokens"]
    barrier = threading.Barrier(len(bodies))

    def call(body: dict):
        barrier.wait()
        return post(gw.url, key, body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(call, bodies))
    return answers, sim_stats(sim)["tokens"] - before


def test_20_concurrent_calls_never_spend_past_a_daily_token_budget(limited, upstream_sim) -> None:
    bodies = [chat_about(words(500, f"d{i}"), max_tokens=50) for i in range(20)]
    answers, simulated = spend_concurrently(limited, upstream_sim, "day2000", bodies)
    ok = [r for r in answers if r.status == 200]
    refused = [r for r in answers if r.status == 429]
    assert len(ok) + len(refused) == 20 and ok, [r.status for r in answers]
    billed = sum(json.loads(r.data)["usage"]["total_tokens"] for r in ok)
    assert simulated == billed  # the answers' usage is what the upstream counted
    assert simulated <= 2000  # the documented overshoot bound is 0
    for resp in refused:
        error = json.loads(resp.data)["error"]
        assert error["code"] == "insufficient_quota" and resp.headers["x-should-retry"] == "false"
    assert usage_of(limited, "day2000")["tokens_today"] == billed


def test_concurrent_calls_never_spend_past_tokens_per_minute(limited, upstream_sim) -> None:
    minute_with_room(MINUTE_ROOM_S)
    bodies = [chat_about(words(100, f"m{i}"), max_tokens=50) for i in range(8)]
    answers, simulated = spend_concurrently(limited, upstream_sim, "tpm1000", bodies)
    ok = [r for r in answers if r.status == 200]
    assert len(ok) >= 2, [r.status for r in answers]  # the bound is loose, not absurd
    assert simulated == sum(json.loads(r.data)["usage"]["total_tokens"] for r in ok) <= 1000
    for resp in answers:
        if resp.status == 429:
            assert json.loads(resp.data)["error"]["type"] == "tokens"
            assert resp.headers.get("x-should-retry") != "false"  # the minute will come round


def test_concurrent_calls_never_spend_past_a_money_budget(limited, upstream_sim) -> None:
    bodies = [chat_about(words(100, f"u{i}"), max_tokens=50) for i in range(20)]
    answers, simulated = spend_concurrently(limited, upstream_sim, "usd", bodies)
    ok = [r for r in answers if r.status == 200]
    assert len(ok) >= 2, [r.status for r in answers]
    cost = 0.0
    for resp in ok:  # priced here, from the answers' usage
        usage = json.loads(resp.data)["usage"]
        cost += (usage["prompt_tokens"] * PRICE_IN + usage["completion_tokens"] * PRICE_OUT) / 1e6
    assert simulated == sum(json.loads(r.data)["usage"]["total_tokens"] for r in ok)
    assert cost <= 2.5
    assert usage_of(limited, "usd")["usd_today"] == pytest.approx(cost)
    assert metric(limited, "llmgate_key_cost_usd_total", key="usd") == pytest.approx(cost)
    refused = json.loads(next(r for r in answers if r.status == 429).data)["error"]
    assert refused["code"] == "insufficient_quota" and "USD" in refused["message"]


def test_each_call_has_a_receipt_in_its_log_line(limited) -> None:
    resp = post(limited.url, "responder", chat_about("a receipt please", max_tokens=5),
                headers={"X-Request-ID": "receipt-test-1"})  # fmt: skip
    assert resp.status == 200
    answer = json.loads(resp.data)
    line = log_line(limited, "receipt-test-1")
    assert line["usage"] == answer["usage"]  # as the provider sent it
    assert line["upstream_request_id"] == resp.headers["x-request-id"]
    assert line["prices_version"] == "test-prices-1"
    usage = answer["usage"]
    expected = (usage["prompt_tokens"] * PRICE_IN + usage["completion_tokens"] * PRICE_OUT) / 1e6
    assert line["cost_usd"] == pytest.approx(expected)


def test_a_call_reserving_exactly_a_fresh_budget_is_admitted_and_one_token_more_is_not(
    limited,
) -> None:
    # The reservation worked out here as docs/security.md states it: the body's bytes, 64
    # tokens, the call's max_tokens. A call that lands on the budget exactly is admitted.
    prompt = chat_about("land on the edge")
    size = len(json.dumps({**prompt, "max_tokens": 100}).encode())
    exact = 1000 - size - 64
    assert len(json.dumps({**prompt, "max_tokens": exact}).encode()) == size  # 3 digits both
    over = post(limited.url, "edge", {**prompt, "max_tokens": exact + 1})
    assert over.status == 429, over.data
    assert "Request too large" in json.loads(over.data)["error"]["message"]
    assert usage_of(limited, "edge")["tokens_today"] == 0  # refused before counting
    resp = post(limited.url, "edge", {**prompt, "max_tokens": exact})
    assert resp.status == 200, resp.data


def test_a_keys_cap_is_sent_to_a_call_that_names_none(limited, upstream_sim) -> None:
    resp = post(limited.url, "capped", chat_about("cap me", temperature=0.5))
    assert resp.status == 200
    assert json.loads(resp.data)["usage"]["completion_tokens"] == 7
    sent = json.loads(http.request("GET", upstream_sim + "/sim/requests").data)[-1]["body"]
    assert sent["max_completion_tokens"] == 7 and "max_tokens" not in sent


def test_a_responses_streams_usage_reaches_the_log_the_metrics_and_the_budget(
    limited, upstream_sim
) -> None:
    before = usage_of(limited, "responder")["tokens_today"]
    prompt_before = metric(limited, "llmgate_key_tokens_total", key="responder", kind="prompt")
    body = {"model": "sim-model", "input": "count me", "stream": True, "max_output_tokens": 6}
    resp = post(limited.url, "responder", body, path="/v1/responses",
                headers={"X-Request-ID": "responses-usage-1"})  # fmt: skip
    assert resp.status == 200
    completed = [
        json.loads(line[6:])
        for line in resp.data.split(b"\n")
        if line.startswith(b"data: ") and b'"response.completed"' in line
    ]
    usage = completed[0]["response"]["usage"]
    assert usage_of(limited, "responder")["tokens_today"] - before == usage["total_tokens"]
    prompt_after = metric(limited, "llmgate_key_tokens_total", key="responder", kind="prompt")
    assert prompt_after - prompt_before == usage["input_tokens"]
    line = log_line(limited, "responses-usage-1")
    assert (line["tokens_in"], line["tokens_out"]) == (
        usage["input_tokens"],
        usage["output_tokens"],
    )


# -- only the caller's own calls count against the caller -------------------------------------
@pytest.fixture(scope="module")
def one_worker(make_stack, tmp_path_factory, upstream_sim):
    """One worker that holds 4 streams, and an upstream that refuses every connection."""
    keys = [("rpm", "requests_per_minute = 100\nmax_streams = 50"),
            ("dead-end", 'requests_per_minute = 100\nupstreams = ["dead"]')]  # fmt: skip
    dead = f'\n[[upstreams]]\nname = "dead"\nbase_url = "{NOWHERE}"\npriority = 1\n'
    return file_stack(
        make_stack, tmp_path_factory.mktemp("admission-config"), config_toml(upstream_sim) + dead,
        keys=keys_toml(keys, secret), env={"LLMGATE_MAX_STREAMS_PER_WORKER": "4"},
        instances=1, workers=1, upstream_url=NOWHERE,
    )  # fmt: skip


def test_streams_the_worker_refused_are_not_counted_against_the_key(one_worker) -> None:
    minute_with_room(MINUTE_ROOM_S)
    before = usage_of(one_worker, "rpm")["requests_this_minute"]
    barrier = threading.Barrier(12)

    def stream(i: int):
        body = chat_about(f"busy {i}", stream=True, max_tokens=10)
        barrier.wait()
        return post(one_worker.url, "rpm", body, headers={"x-sim-tps": "5"})

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(stream, range(12)))
    codes = sorted(
        json.loads(r.data)["error"]["code"] if r.status != 200 else "ok" for r in answers
    )
    assert codes == ["gateway_overloaded"] * 8 + ["ok"] * 4, codes
    assert usage_of(one_worker, "rpm")["requests_this_minute"] - before == 4


def test_calls_no_upstream_answered_give_their_request_back(one_worker) -> None:
    minute_with_room(MINUTE_ROOM_S)
    for stream in (False, True, False):
        resp = post(one_worker.url, "dead-end", chat_about("anyone?", stream=stream))
        assert resp.status == 502, resp.data[:300]
        assert json.loads(resp.data)["error"]["code"] == "upstream_unreachable"
    assert usage_of(one_worker, "dead-end")["requests_this_minute"] == 0
    # An upstream's own error answer is an answer: that call counts.
    before = usage_of(one_worker, "rpm")["requests_this_minute"]
    resp = post(one_worker.url, "rpm", chat_about("no"), headers={"x-sim-fault": "401"})
    assert resp.status == 401
    assert usage_of(one_worker, "rpm")["requests_this_minute"] == before + 1


# -- limits counted once for every worker, whichever way Memcached is named ---------------------
@pytest.fixture(scope="module")
def by_dns(make_stack, tmp_path_factory, upstream_sim):
    """Two instances of two workers whose Memcached is named as Kubernetes names it:
    ``dns+name:port`` (the headless Service of deploy/kubernetes), here ``localhost``."""
    binary = require_binary("memcached")
    folder: Path = tmp_path_factory.mktemp("dns-limits")
    port = free_port()
    hosts = sorted({host for host, _ in resolve("localhost", port)})
    argv = [binary, "-l", ",".join(hosts), "-p", str(port), "-U", "0", "-m", "16"]
    if os.geteuid() == 0:
        argv += ["-u", "nobody"]
    memcached = Proc(f"memcached-dns-{port}", argv, log_path=folder / "memcached.log")
    memcached.wait_port(port, hosts[0])
    stack = file_stack(
        make_stack, folder, config_toml(upstream_sim),
        keys=keys_toml([("rpm3", "requests_per_minute = 3")], secret),
        env={"LLMGATE_MEMCACHED": f"dns+localhost:{port}"},
        instances=2, workers=2, memcached=False, upstream_url=NOWHERE,
    )  # fmt: skip
    yield stack, (hosts[0], port)
    memcached.kill()


def test_a_keys_limit_holds_over_every_worker_when_memcached_is_found_by_dns(
    by_dns, upstream_sim
) -> None:
    """12 concurrent calls over 4 workers for a key of 3 a minute: 3 reach the upstream,
    counted by the upstream itself, and the count lives in the named Memcached. Counted per
    worker (the limits' client took only host:port entries), each worker let 3 through."""
    stack, (host, port) = by_dns
    minute_with_room(MINUTE_ROOM_S)
    before = sim_stats(upstream_sim)["requests"]
    barrier = threading.Barrier(12)

    def call(i: int):
        barrier.wait()
        return post(stack.url, "rpm3", chat_about(f"counted once {i}", max_tokens=5)).status

    with ThreadPoolExecutor(12) as pool:
        statuses = sorted(pool.map(call, range(12)))
    assert statuses == [200] * 3 + [429] * 9, statuses
    assert sim_stats(upstream_sim)["requests"] - before == 3
    assert (
        memcached_stats(port, host)["curr_items"] >= 1
    )  # the key's counter, where every worker counts
