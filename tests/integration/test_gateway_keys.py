"""Gateway keys through the whole stack: two gateway instances of two workers each behind
nginx, one Memcached holding the limit counters, the simulator as the upstream.

What is checked comes from outside the gateway where it can: the simulator's request log
says which credential went upstream and what body it received, the answers' own usage says
how many tokens were spent, nginx answers for the addresses it refuses.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import urllib3

from app.request.bounds import PROMPT_OVERHEAD
from app.tenancy.keyring import hash_key
from runner.procs import free_port
from tests.support.bodies import chat
from tests.support.metrics import samples
from tests.support.waiting import minute_with_room

UPSTREAM_KEY = "sk-upstream-operator"
OPERATOR_TOKEN = "op-token-for-tests"
KEYS = {
    # name: (secret, extra TOML lines)
    "team-a": ("llmg-team-a-secret", ""),
    "team-b": ("llmg-team-b-secret", ""),
    "mini-only": ("llmg-mini-only-secret", 'models = ["other-model"]'),
    "rpm60": ("llmg-rpm60-secret", "requests_per_minute = 60"),
    "rpm-only": ("llmg-rpm-only-secret", "requests_per_minute = 1000"),
    "tpm-only": ("llmg-tpm-only-secret", "tokens_per_minute = 100000"),
    "budget": ("llmg-budget-secret", "tokens_per_day = 1000"),
    "streamer": ("llmg-streamer-secret", "tokens_per_day = 1000000"),
    "revokee": ("llmg-revokee-secret", ""),
    "ns-one": ("llmg-ns-one-secret", 'cache_namespace = "shared"'),
    "ns-two": ("llmg-ns-two-secret", 'cache_namespace = "shared"'),
}
http = urllib3.PoolManager(retries=False, maxsize=32)


def _keys_toml(revoked: frozenset[str] = frozenset()) -> str:
    tables = []
    for name, (secret, extra) in KEYS.items():
        lines = [f'name = "{name}"', f'sha256 = "{hash_key(secret)}"', extra]
        if name in revoked:
            lines.append("revoked = true")
        tables.append("[[keys]]\n" + "\n".join(filter(None, lines)))
    return "\n\n".join(tables) + "\n"


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gateway-keys") / "keys.toml"
    path.write_text(_keys_toml())
    return path


@pytest.fixture(scope="module")
def keyed(make_stack, keys_file):
    env = {
        "LLMGATE_KEYS_FILE": str(keys_file),
        "LLMGATE_UPSTREAM_API_KEY": UPSTREAM_KEY,
        "LLMGATE_OPERATOR_TOKEN": OPERATOR_TOKEN,
    }
    handle = make_stack(env=env, instances=2, workers=2)
    handle.sim_reset()
    return handle


def _post(url: str, body: dict, key: str | None, **headers: str):
    if key is not None:
        headers["Authorization"] = f"Bearer {KEYS[key][0]}"
    return http.request("POST", url + "/v1/chat/completions", body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json", **headers})  # fmt: skip


def _error(resp) -> dict:
    return json.loads(resp.data)["error"]


def _admin_usage(gw) -> dict[str, dict]:
    resp = http.request("GET", gw.url + "/admin/usage",
                        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})  # fmt: skip
    assert resp.status == 200, resp.data
    return {k["name"]: k for k in json.loads(resp.data)["keys"]}


def test_no_key_or_a_wrong_key_is_401_and_nothing_goes_upstream(keyed) -> None:
    before = keyed.sim_stats()["requests"]
    for headers in ({}, {"Authorization": "Bearer sk-not-ours"}, {"api-key": "llmg-nope"}):
        resp = _post(keyed.url, chat(max_tokens=3), None, **headers)
        assert resp.status == 401 and resp.headers["Content-Type"] == "application/json"
        assert _error(resp)["code"] == "invalid_api_key"
    # Not even a bad body is looked at before the key: a stranger learns nothing.
    resp = http.request("POST", keyed.url + "/v1/chat/completions", body=b"{not json")
    assert resp.status == 401
    assert keyed.sim_stats()["requests"] == before


def test_a_valid_key_is_answered_with_the_upstream_key_never_the_callers(keyed) -> None:
    keyed.sim_reset()
    resp = _post(keyed.url, chat(max_tokens=3), "team-a", **{"OpenAI-Organization": "org-x"})
    assert resp.status == 200, resp.data
    (seen,) = keyed.sim_requests()
    assert seen["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert "openai-organization" not in seen["headers"]  # the caller's identity stays here
    assert KEYS["team-a"][0] not in json.dumps(seen)


def test_a_model_the_key_may_not_use_is_403(keyed) -> None:
    before = keyed.sim_stats()["requests"]
    resp = _post(keyed.url, chat(max_tokens=3), "mini-only")
    assert resp.status == 403 and _error(resp)["code"] == "model_not_allowed"
    assert keyed.sim_stats()["requests"] == before


def _cache_status(gw, body: dict, key: str) -> str:
    resp = _post(gw.url, body, key)
    assert resp.status == 200, resp.data
    return resp.headers["X-LLMGate-Cache"]


def _hit_within(gw, body: dict, key: str, tries: int = 5) -> bool:
    """A HIT within a few calls: the entry may sit in another instance's L1 only while its
    write to Memcached failed open (a busy machine), so one miss proves nothing."""
    return any(_cache_status(gw, body, key).startswith("HIT") for _ in range(tries))


def test_the_cache_is_scoped_by_gateway_key_or_its_namespace(keyed) -> None:
    body = chat(max_tokens=4, temperature=0, messages=[{"role": "user", "content": "keyed"}])
    assert _cache_status(keyed, body, "team-a") == "MISS"
    assert _hit_within(keyed, body, "team-a")
    assert _cache_status(keyed, body, "team-b") == "MISS"  # another key: its own entries
    # One cache_namespace, one set of entries: what ns-one stored, ns-two reads at once.
    # Three bodies, two hits at least: one write may fail open on a busy machine; a broken
    # namespace gives none (ns-two's first call would be its own MISS).
    hits = 0
    for n in range(3):
        shared = {**body, "max_tokens": 5 + n}
        assert _cache_status(keyed, shared, "ns-one") == "MISS"
        hits += _cache_status(keyed, shared, "ns-two").startswith("HIT")
    assert hits >= 2


def _rate_limit_headers(gw, key: str) -> dict[str, str]:
    """A call's x-ratelimit-* headers, each of which must come once."""
    resp = _post(gw.url, chat(max_tokens=2, temperature=0.9), key)
    assert resp.status == 200, resp.data
    names = [k.lower() for k in resp.headers if k.lower().startswith("x-ratelimit-")]
    assert len(names) == len(set(names)), names
    return {name: resp.headers[name] for name in names}


def test_a_keys_limits_replace_the_upstreams_headers_only_for_what_they_limit(keyed) -> None:
    """A key without limits passes the upstream's x-ratelimit-* headers as they are; a key's
    own trio replaces the upstream's for the dimension it limits (requests, tokens), and the
    upstream's trio of the other dimension passes (docs/security.md)."""
    from simulator.responses import LIMIT_REQUESTS, LIMIT_TOKENS

    trios = {f"x-ratelimit-{kind}-{what}" for kind in ("limit", "remaining", "reset")
             for what in ("requests", "tokens")}  # fmt: skip
    upstream = _rate_limit_headers(keyed, "team-a")
    assert upstream.keys() == trios
    assert upstream["x-ratelimit-limit-requests"] == str(LIMIT_REQUESTS)
    assert upstream["x-ratelimit-limit-tokens"] == str(LIMIT_TOKENS)
    requests = _rate_limit_headers(keyed, "rpm-only")
    assert requests.keys() == trios
    assert requests["x-ratelimit-limit-requests"] == "1000"  # the key's
    assert requests["x-ratelimit-limit-tokens"] == str(LIMIT_TOKENS)  # the upstream's
    tokens = _rate_limit_headers(keyed, "tpm-only")
    assert tokens.keys() == trios
    assert tokens["x-ratelimit-limit-tokens"] == "100000"
    assert tokens["x-ratelimit-limit-requests"] == str(LIMIT_REQUESTS)


def test_60_requests_per_minute_across_two_instances_of_two_workers(keyed) -> None:
    minute_with_room(10)  # a window edge would split the count (the calls take < 1 s)
    targets = keyed.stack.app_urls  # both gunicorn instances, half the calls each
    assert len(targets) == 2
    body = chat(max_tokens=2, temperature=0.9)  # not cacheable: every call goes upstream
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: _post(targets[i % 2], body, "rpm60"), range(100)))
    ok = [r for r in answers if r.status == 200]
    refused = [r for r in answers if r.status == 429]
    assert (len(ok), len(refused)) == (60, 40), sorted(r.status for r in answers)
    for resp in refused:
        assert _error(resp)["code"] == "rate_limit_exceeded"
        assert 1 <= int(resp.headers["retry-after"]) <= 60
    # Each admitted call saw the shared count: 59 down to 0 remaining, each value once.
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in ok)
    assert remaining == list(range(60))
    assert {r.headers["x-ratelimit-limit-requests"] for r in ok} == {"60"}
    assert _admin_usage(keyed)["rpm60"]["requests_this_minute"] == 60


def test_a_token_budget_refuses_the_call_that_would_cross_it(keyed) -> None:
    spent, statuses = 0, []
    for i in range(6):
        body = chat(max_tokens=300, temperature=0.9,
                    messages=[{"role": "user", "content": f"budget {i}"}])  # fmt: skip
        resp = _post(keyed.url, body, "budget")
        statuses.append(resp.status)
        # Held before the call: the body's bytes bound its prompt (app/request/bounds.py), plus 300.
        held = len(json.dumps(body).encode()) + PROMPT_OVERHEAD + 300
        if resp.status == 200:
            # The answer's own usage: what the simulator says it spent.
            assert spent + held <= 1000  # admitted only while the reservation fitted
            spent += json.loads(resp.data)["usage"]["total_tokens"]
        else:
            assert resp.status == 429 and spent + held > 1000
            assert _error(resp)["code"] == "insufficient_quota"
            assert resp.headers["x-should-retry"] == "false"
    assert statuses[0] == 200 and 429 in statuses
    assert _admin_usage(keyed)["budget"]["tokens_today"] == spent


def _stream_bytes(url: str, body: dict, key: str) -> bytes:
    resp = http.request("POST", url + "/v1/chat/completions", body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json",
                                 "Authorization": f"Bearer {KEYS[key][0]}"},
                        preload_content=False)  # fmt: skip
    data = resp.read()
    resp.release_conn()
    assert resp.status == 200, data
    return data


def test_stream_tokens_are_counted_from_a_usage_chunk_the_caller_did_not_ask_for(keyed) -> None:
    body = chat(True, max_tokens=6, temperature=0.9)
    keyed.sim_reset()
    asked = _stream_bytes(keyed.url, {**body, "stream_options": {"include_usage": True}},
                          "streamer")  # fmt: skip
    usage_lines = [line for line in asked.split(b"\n\n") if b'"choices":[]' in line]
    assert len(usage_lines) == 1
    total = json.loads(usage_lines[0][6:])["usage"]["total_tokens"]
    assert _admin_usage(keyed)["streamer"]["tokens_today"] == total

    silent = _stream_bytes(keyed.url, body, "streamer")
    # Neither the usage chunk nor the "usage":null of every chunk the asking caused.
    assert b'"usage"' not in silent and silent.endswith(b"data: [DONE]\n\n")
    sent = json.loads(
        keyed.sim_requests()[-1]["body"] and json.dumps(keyed.sim_requests()[-1]["body"])
    )
    assert sent["stream_options"] == {"include_usage": True}  # the gateway asked for it
    # The same prompt and bound: the simulator spent the same again, and it was counted.
    assert _admin_usage(keyed)["streamer"]["tokens_today"] == 2 * total


def test_a_revoked_key_stops_working_in_every_worker_within_a_second(keyed, keys_file) -> None:
    urls = [keyed.url, *keyed.stack.app_urls]
    body = chat(max_tokens=2, temperature=0.9)
    assert {_post(urls[i % 3], body, "revokee").status for i in range(12)} == {200}
    keys_file.write_text(_keys_toml(revoked=frozenset({"revokee"})))
    time.sleep(1.0)
    statuses = [_post(urls[i % 3], body, "revokee").status for i in range(24)]
    assert set(statuses) == {401}
    assert _post(keyed.url, body, "team-a").status == 200  # the others are unaffected
    keys_file.write_text(_keys_toml())


def test_operational_endpoints_need_the_token_and_an_allowed_address(keyed) -> None:
    for path in ("/metrics", "/status", "/status.json", "/admin/usage"):
        resp = http.request("GET", keyed.url + path)
        assert resp.status == 401, path
        assert _error(resp)["code"] == "operator_token_required"
        assert resp.headers["WWW-Authenticate"].startswith("Basic")
        good = http.request("GET", keyed.url + path,
                            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})  # fmt: skip
        assert good.status == 200, path
    basic = urllib3.make_headers(basic_auth=f"ops:{OPERATOR_TOKEN}")
    assert http.request("GET", keyed.url + "/metrics", headers=basic).status == 200
    # From an address nginx does not allow (loopback, but not 127.0.0.1): its JSON 403.
    elsewhere = urllib3.PoolManager(retries=False, source_address=("127.0.0.2", 0))
    resp = elsewhere.request("GET", keyed.url + "/metrics",
                             headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})  # fmt: skip
    assert resp.status == 403 and _error(resp)["code"] == "forbidden"
    resp = elsewhere.request("GET", keyed.url + "/v1/../metrics")
    assert resp.status == 403
    assert _post(keyed.url, chat(max_tokens=2), "team-a").status == 200  # the API is open
    # ...and the API itself still answers callers from that address.
    resp = elsewhere.request("GET", keyed.url + "/healthz")
    assert resp.status == 200


def test_key_metrics_carry_names_never_secrets(keyed) -> None:
    texts = []
    for url in keyed.stack.app_urls:  # each instance has its own metrics: summed here
        resp = http.request("GET", url + "/metrics",
                            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})  # fmt: skip
        texts.append(resp.data.decode())

    def total(name: str, **labels: str) -> float:
        return sum(value for text in texts for value in samples(text, name, **labels))

    assert total("llmgate_key_requests_total", key="rpm60", status="429") == 40
    assert total("llmgate_key_requests_total", key="rpm60", status="200") == 60
    assert total("llmgate_key_tokens_total", key="budget", kind="completion") > 0
    assert not any(secret in text for secret, _ in KEYS.values() for text in texts)


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_limits_without_memcached_fail_open_or_closed(make_stack, keys_file, mode) -> None:
    env = {
        "LLMGATE_KEYS_FILE": str(keys_file),
        "LLMGATE_MEMCACHED": f"127.0.0.1:{free_port()}",  # nobody listens there
        "LLMGATE_LIMITS_FAIL": mode,
        "LLMGATE_CACHE_MODE": "off",
    }
    gw = make_stack(env=env, workers=1, memcached=False)
    body = chat(max_tokens=2, temperature=0.9)
    statuses = [_post(gw.url, body, "rpm60").status for _ in range(3)]
    if mode == "open":
        assert statuses == [200, 200, 200]  # uncounted, and said so
        assert "limit counters unreachable; limits fail open" in gw.log("gunicorn")
        assert gw.metric("llmgate_limit_counter_errors_total") >= 3
    else:
        assert statuses == [503, 503, 503]
        resp = _post(gw.url, body, "rpm60")
        assert _error(resp)["code"] == "limits_unavailable"
    assert _post(gw.url, body, "team-a").status == 200  # a key without limits needs no counter
