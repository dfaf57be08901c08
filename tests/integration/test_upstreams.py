"""Several upstreams from a config file: failover, breakers, keys, counted by the simulators.

Two simulators on loopback play two providers; the primary is reached through the fault
proxy so it can go down and come back. One gunicorn worker, so the breaker the test drives
is the only one (breakers are per worker).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import urllib3

from tests.support.bodies import chat
from tests.support.faultproxy import FaultProxy
from tests.support.sim import sim_requests, sim_stats, start_simulator
from tests.support.stack import UPSTREAM, config_stack

http = urllib3.PoolManager(retries=False)


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Iterator[tuple[str, str]]:
    logs = tmp_path_factory.mktemp("upstream-sims")
    first, url_a = start_simulator(logs)
    second, url_b = start_simulator(logs)
    yield url_a, url_b
    first.stop()
    second.stop()


@pytest.fixture(scope="module")
def proxy(sims) -> Iterator[FaultProxy]:
    port = int(sims[0].rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as fault_proxy:
        yield fault_proxy


@pytest.fixture(scope="module")
def failover_gw(make_stack, tmp_path_factory, sims, proxy):
    toml = f"""
[[upstreams]]
name = "primary"
base_url = "http://127.0.0.1:{proxy.port}/v1"
priority = 0

[[upstreams]]
name = "secondary"
base_url = "{sims[1]}/v1"
priority = 1
"""
    return config_stack(make_stack, tmp_path_factory, toml, LLMGATE_BREAKER_FAILURES="2",
                  LLMGATE_BREAKER_COOLDOWN_S="1", LLMGATE_RETRY_BACKOFF_S="0.01")  # fmt: skip


def _ask(gw, stream: bool = False):
    return gw.post("/v1/chat/completions", chat(stream, max_tokens=3))


def _state(gw, name: str) -> tuple[float, str, str]:
    """The breaker's state as /metrics, /status.json and /readyz each tell it."""
    status = json.loads(http.request("GET", gw.url + "/status.json").data)
    ready = json.loads(http.request("GET", gw.url + "/readyz").data)
    by_name = {u["name"]: u for u in ready["checks"]["upstream"]["upstreams"]}
    return (
        gw.metric("llmgate_upstream_state", upstream=name),
        status["upstreams"][name]["state"],
        by_name[name]["state"],
    )


def test_primary_down_secondary_answers_and_the_breaker_opens_half_opens_closes(
    failover_gw, sims, proxy
) -> None:
    gw = failover_gw
    resp = _ask(gw)
    assert resp.status == 200 and resp.headers[UPSTREAM] == "primary"
    assert _state(gw, "primary") == (0, "closed", "closed")

    proxy.down()
    before = sim_stats(sims[1])["requests"]
    for stream in (False, True, False):
        resp = _ask(gw, stream)
        assert resp.status == 200 and resp.headers[UPSTREAM] == "secondary"
    assert sim_stats(sims[1])["requests"] == before + 3
    # Two failed attempts opened it: the third call went straight to the secondary.
    assert gw.metric("llmgate_upstream_attempts_total", upstream="primary", result="failed") == 2
    assert gw.metric("llmgate_upstream_failovers_total") == 2
    assert _state(gw, "primary") == (2, "open", "open")

    proxy.pass_through()
    time.sleep(1.2)  # the cooldown (1 s) ends: the next call is the probe
    assert _state(gw, "primary")[2] == "half_open"
    resp = _ask(gw)
    assert resp.status == 200 and resp.headers[UPSTREAM] == "primary"
    assert _state(gw, "primary") == (0, "closed", "closed")


@pytest.fixture(scope="module")
def two_keys_gw(make_stack, tmp_path_factory, sims):
    toml = f"""
[[upstreams]]
name = "key-a"
base_url = "{sims[0]}/v1"
key = "sk-upstream-a"

[[upstreams]]
name = "key-b"
base_url = "{sims[0]}/v1"
key = "sk-upstream-b"
"""
    return config_stack(make_stack, tmp_path_factory, toml)


def _rate_limited_once(gw, fail_key: str, retry_after: str):
    headers = {"x-sim-fault": "429", "x-sim-fail-times": "1", "x-sim-fail-key": fail_key,
               "x-sim-retry-after": retry_after}  # fmt: skip
    started = time.monotonic()
    resp = gw.post("/v1/chat/completions", chat(False, max_tokens=3), headers=headers)
    return resp, time.monotonic() - started


def test_a_429_on_one_key_moves_to_the_next_key_at_once(two_keys_gw, sims) -> None:
    before = len(sim_requests(sims[0]))
    resp, took = _rate_limited_once(two_keys_gw, "two-keys", "2")
    assert resp.status == 200
    calls = sim_requests(sims[0])[before:]
    assert len(calls) == 2
    keys = [c["headers"]["authorization"] for c in calls]
    assert sorted(keys) == ["Bearer sk-upstream-a", "Bearer sk-upstream-b"]  # one each
    assert took < 1.5  # not the 2 s retry-after: the other key at once
    assert resp.headers[UPSTREAM] == keys[1].removeprefix("Bearer sk-upstream-").join(["key-", ""])


def test_a_429_on_a_single_key_waits_its_retry_after(make_stack, tmp_path_factory, sims) -> None:
    toml = f'[[upstreams]]\nname = "only"\nbase_url = "{sims[0]}/v1"\nkey = "sk-only"\n'
    gw = config_stack(make_stack, tmp_path_factory, toml)
    before = len(sim_requests(sims[0]))
    resp, took = _rate_limited_once(gw, "single-key", "0.3")
    assert resp.status == 200
    calls = sim_requests(sims[0])[before:]
    assert [c["headers"]["authorization"] for c in calls] == ["Bearer sk-only"] * 2
    assert took >= 0.29  # retry-after-ms: 300 was honoured


def test_a_wrong_config_file_stops_the_start_naming_line_and_field(tmp_path) -> None:
    from runner.procs import StartError
    from runner.stack import Stack, StackOptions

    path = tmp_path / "bad.toml"
    path.write_text('[[upstreams]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nweight = 0\n')
    options = StackOptions(run_dir=tmp_path / "run", nginx=False, memcached=False, workers=1,
                           upstream_url="http://127.0.0.1:9/v1",
                           env={"LLMGATE_CONFIG": str(path)})  # fmt: skip
    with pytest.raises(StartError) as caught:
        Stack(options).start()
    assert (
        str(caught.value)
        == f"gunicorn exited (1): LLMGATE_CONFIG: {path}:4: upstreams.weight must be > 0"
    )
    assert "Traceback" not in str(caught.value)
