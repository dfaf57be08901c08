"""Upstream config file, routing order, breakers and the per-upstream request: no sockets."""

from __future__ import annotations

import json

import pytest

from app.core.errors import UpstreamReset, UpstreamTimeout, UpstreamUnreachable
from app.request.headers import with_upstream_key
from app.tenancy.prices import Price
from app.upstream.attempts import _can_fail_over
from app.upstream.breaker import CLOSED, HALF_OPEN, OPEN, Breaker, BreakerPolicy
from app.upstream.catalog import (
    ConfigError,
    UpstreamSpec,
    candidates,
    from_environment,
    load,
    prices_of,
    serving_id,
)
from app.upstream.hedge import HedgePolicy
from app.upstream.transport import UpstreamRequest, _prepare
from tests.conftest import ROOT

ENV = {"OPENAI_KEY_A": "sk-a", "OPENAI_KEY_B": "sk-b", "AZURE_OPENAI_KEY": "az"}


# -- the config file -----------------------------------------------------------------------
def test_the_shipped_example_loads() -> None:
    specs = load((ROOT / "deploy" / "llmgate.example.toml").read_text(), ENV)
    assert [s.name for s in specs] == ["openai-a", "openai-b", "azure-east", "vllm"]
    azure = specs[2]
    assert (azure.auth, azure.key, azure.priority) == ("api-key", "az", 1)
    assert azure.query == (("api-version", "2024-10-21"),)
    assert azure.model_for("gpt-4o-mini") == "gpt4o-mini-prod"
    assert specs[3].headers == (("X-Team", "ml-platform"),) and specs[3].key == ""
    assert specs[0].hedge == HedgePolicy(percentile=95, max_ms=1500)
    assert "sk-a" not in repr(specs[0])  # keys never printed
    table = prices_of((ROOT / "deploy" / "llmgate.example.toml").read_text())
    assert table is not None and table.version == "example-2026-12"
    assert table.price_of("gpt-4o-mini") == Price(150_000, 75_000, 600_000, 16384)
    assert table.price_of("other") == Price(2_500_000, 2_500_000, 10_000_000)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('[[upstreams]]\nname = "a"\n', 1, "upstreams.base_url is missing"),
        ('[[upstreams]]\nname = "a"\nbase_url = "ftp://x"\n', 3, "upstreams.base_url must be"),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nweight = "2"\n', 4, "weight has"),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nwieght = 2\n', 4, "wieght is not"),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nauth = "basic"\n', 4, "auth must"),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nkey_env = "NOPE"\n', 4, "NOPE"),
        ('[[upstreams]]\nname = "A B"\nbase_url = "http://x"\n', 2, "upstreams.name must"),
        (
            '[[upstreams]]\nname = "a"\nbase_url = "http://x"\n\n'
            '[[upstreams]]\nname = "a"\nbase_url = "http://y"\n',
            6,
            "used twice",
        ),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nmodels = []\n', 4, "models must"),
        ("upstream = 1\n", 1, "unknown section"),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nhedge_after = "95"\n', 4, "p99.9"),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nhedge_after = 0\n', 4, "> 0"),
        (
            '[[upstreams]]\nname = "a"\nbase_url = "http://x"\nhedge_after = "p90"\n'
            "hedge_min_ms = 500\nhedge_max_ms = 100\n",
            4,
            "hedge_min_ms <= hedge_max_ms",
        ),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nhedge_max_ms = 9\n', 4, "needs"),
    ],
)
def test_a_wrong_file_names_the_line_and_the_field(text: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(text, {}, path="gw.toml")
    assert str(caught.value).startswith(f"gw.toml:{line}: "), str(caught.value)
    assert words in str(caught.value)


def test_toml_syntax_errors_keep_tomllib_position() -> None:
    with pytest.raises(ConfigError, match=r"gw.toml: not valid TOML: .*line 2"):
        load('[[upstreams]]\nname = "a\n', {}, path="gw.toml")


def test_the_environment_makes_one_upstream_with_a_fallback_key() -> None:
    (spec,) = from_environment("http://h:1/v1/", "sk-op")
    assert (spec.name, spec.base_url, spec.key, spec.key_fallback) == (
        "default", "http://h:1/v1", "sk-op", True,
    )  # fmt: skip


# -- routing -------------------------------------------------------------------------------
A = UpstreamSpec("a", "http://a/v1", priority=0, weight=3, models=("m",))
B = UpstreamSpec("b", "http://b/v1", priority=0, weight=1, models=("m", "n"))
C = UpstreamSpec("c", "http://c/v1", priority=1, models=("*",))


def _names(specs, model="m", allowed=lambda n: True, rand=lambda: 0.0) -> list[str]:
    return [s.name for s in candidates(specs, model, allowed=allowed, rand=rand)]


def test_candidates_by_model_priority_then_weight() -> None:
    assert _names([A, B, C], "n") == ["b", "c"]
    assert _names([A, B, C], "other") == ["c"]
    assert _names([C, B, A], rand=lambda: 0.0) == ["b", "a", "c"]  # priority, then the draw
    assert _names([A, B, C], rand=lambda: 0.99) == ["b", "a", "c"]  # the last quarter: b
    firsts = [_names([A, B], rand=lambda d=i / 100: d)[0] for i in range(100)]
    assert firsts.count("a") == 75  # weight 3 : 1


def test_open_breakers_go_last_unless_all_are_open() -> None:
    assert _names([A, B, C], allowed=lambda n: n != "a") == ["b", "c"]
    assert _names([A, B], allowed=lambda n: False) == ["a", "b"]  # panic: try them all


def test_route_id_names_every_base_url_serving_the_model() -> None:
    assert serving_id([A, B, C], "m") == "http://a/v1,http://b/v1,http://c/v1"
    assert serving_id([A, B, C], "n") == "http://b/v1,http://c/v1"


# -- one upstream's request ----------------------------------------------------------------
def _req(**kw) -> UpstreamRequest:
    base = dict(method="POST", path="/chat/completions", query="", stream=False,
                headers={"Authorization": "Bearer caller", "X-Other": "1"},
                body=b'{"model":"gpt-4o-mini","messages":[]}', model="gpt-4o-mini")  # fmt: skip
    return UpstreamRequest(**{**base, **kw})


def test_azure_style_url_auth_query_and_alias() -> None:
    spec = UpstreamSpec("az", "https://r.example/openai/deployments/{model}", key="k",
                        auth="api-key", query=(("api-version", "2024"),),
                        aliases=(("gpt-4o-mini", "dep 1"),))  # fmt: skip
    url, headers, body = _prepare(spec, _req(query="x=1"))
    assert (
        url == "https://r.example/openai/deployments/dep%201/chat/completions?x=1&api-version=2024"
    )
    assert headers == {"X-Other": "1", "api-key": "k"}  # the caller's key is replaced
    assert body is not None and json.loads(body) == {"model": "dep 1", "messages": []}


def test_a_specs_pool_is_found_once_and_gets_origin_form_targets() -> None:
    from app.core.config import Settings
    from app.upstream.exchange import Upstream

    az = UpstreamSpec("az", "https://r.example/openai/deployments/{model}", query=(("v", "1"),))
    capped = UpstreamSpec("capped", "http://c.example:8080/v1", max_connections=3)
    per_host = UpstreamSpec("host", "https://{model}.example/v1")
    upstream = Upstream(Settings(), [az, capped, per_host])
    url = _prepare(az, _req(query="x=1"))[0]
    pool, target = upstream.transport._pool_for(az, url)
    assert (pool.scheme, pool.host, pool.port) == ("https", "r.example", 443)
    assert target == "/openai/deployments/gpt-4o-mini/chat/completions?x=1&v=1"
    assert upstream.transport._pool_for(az, url)[0] is pool  # found once, not per request
    # The manager forgets its pools but closes none: ours stays usable.
    upstream.transport.pool.clear()
    assert upstream.transport._pool_for(az, url)[0] is pool and pool.pool is not None
    pool.close()  # closed all the same: looked up again
    assert upstream.transport._pool_for(az, url)[0] is not pool
    capped_pool, target = upstream.transport._pool_for(capped, _prepare(capped, _req())[0])
    assert capped_pool.pool is not None
    assert (capped_pool.port, capped_pool.pool.maxsize, target) == (8080, 3, "/v1/chat/completions")
    host_pool, target = upstream.transport._pool_for(per_host, _prepare(per_host, _req())[0])
    assert (host_pool.host, target) == ("gpt-4o-mini.example", "/v1/chat/completions")


def test_without_an_alias_the_body_goes_as_sent() -> None:
    spec = UpstreamSpec("o", "https://o.example/v1", key="k", headers=(("X-Team", "t"),))
    url, headers, body = _prepare(spec, _req(body=b'{ "model" : "gpt-4o-mini" ,"messages":[]}'))
    assert url == "https://o.example/v1/chat/completions"
    assert headers["Authorization"] == "Bearer k" and headers["X-Team"] == "t"
    assert body == b'{ "model" : "gpt-4o-mini" ,"messages":[]}'


def test_an_alias_changes_only_the_models_value() -> None:
    spec = UpstreamSpec("az", "https://r.example/{model}", aliases=(("gpt-4o-mini", "dép"),))
    sent = b'{"messages" : [{"content":"caf\\u00e9 \xc3\xa9"}],\n "model" : "gpt-4o-mini" }'
    _, _, body = _prepare(spec, _req(body=sent))
    assert body == b'{"messages" : [{"content":"caf\\u00e9 \xc3\xa9"}],\n "model" : "d\xc3\xa9p" }'


@pytest.mark.parametrize("own", ["Authorization", "api-key", "x-api-key"])
def test_a_fallback_key_never_replaces_the_callers(own: str) -> None:
    assert with_upstream_key({own: "mine"}, "op", fallback_only=True) == {own: "mine"}
    assert with_upstream_key({own: "mine"}, "op") == {"Authorization": "Bearer op"}
    assert with_upstream_key({}, "op", fallback_only=True) == {"Authorization": "Bearer op"}
    assert with_upstream_key({own: "mine"}, "") == {own: "mine"}


def test_what_may_fail_over() -> None:
    connect = UpstreamTimeout("connect", 1, before_send=True)  # as the transport makes it
    assert _can_fail_over(UpstreamUnreachable("x"), stream=False)
    assert _can_fail_over(connect, stream=False)
    assert _can_fail_over(UpstreamTimeout("first_byte", 1), stream=True)
    assert not _can_fail_over(UpstreamTimeout("first_byte", 1), stream=False)  # may be billing
    assert not _can_fail_over(UpstreamReset("x"), stream=True)  # the request was sent
    assert not _can_fail_over(UpstreamTimeout("idle", 1), stream=True)


# -- the breaker ---------------------------------------------------------------------------
POLICY = BreakerPolicy(failures_to_open=3, window=10, window_min=6, error_rate=0.5,
                       cooldown_s=5, cooldown_max_s=12)  # fmt: skip


def _fail(breaker: Breaker, times: int, now: float = 0.0) -> Breaker:
    for _ in range(times):
        breaker = breaker.record(True, now)
    return breaker


def test_opens_after_consecutive_failures_then_half_opens_for_one_probe() -> None:
    b = _fail(Breaker(POLICY), 2)
    assert b.state == CLOSED and b.allows(0)
    b = _fail(b, 1)
    assert b.state == OPEN and not b.allows(4.9)
    assert b.current(5.0).state == HALF_OPEN and b.allows(5.0)
    assert b.probes(5.0)
    probing = b.start_call(5.0)
    assert not probing.allows(5.1) and not probing.probes(5.1)  # one probe at a time
    assert probing.record(False, 6, probe=True).state == CLOSED


def test_a_failed_probe_reopens_for_longer_up_to_the_cap() -> None:
    b = _fail(Breaker(POLICY), 3)  # open until 5
    b = b.start_call(5).record(True, 5, probe=True)
    assert b.state == OPEN and b.until == 15  # 10 s: doubled
    b = b.start_call(15).record(True, 15, probe=True)
    assert b.until == 27  # capped at 12
    b = b.start_call(27).record(False, 27, probe=True)
    assert b.state == CLOSED and b.openings == 0
    assert _fail(b, 3, 30).until == 35  # a success in between: back to the first cooldown


def test_opens_on_the_error_rate_over_the_window() -> None:
    b = Breaker(POLICY)
    for failed in [True, False, True, False, True, False]:
        b = b.record(failed, 0)
    assert b.state == CLOSED  # 3 of 6: not above half
    b = b.record(True, 0)
    assert b.state == OPEN  # 4 of 7


def test_a_failure_that_brings_the_rate_exactly_to_the_threshold_does_not_open() -> None:
    """The rate is judged when a call fails: here the failure that makes it exactly half
    (``error_rate``, 0.5), of 6 calls (``window_min``) and then of a full window of 10."""
    b = Breaker(POLICY)
    for failed in [False, True, False, True, False, True]:
        b = b.record(failed, 0)
    assert (b.state, b.consecutive, b.recent.count(True)) == (CLOSED, 1, 3)  # 3 of 6
    for failed in [False, True, False, True]:
        b = b.record(failed, 0)
    assert (b.state, len(b.recent), b.recent.count(True)) == (CLOSED, 10, 5)  # 5 of 10
    b = b.record(True, 0)  # 6 of 10 (the oldest, a success, left); 2 in a row, not 3
    assert (b.state, b.openings) == (OPEN, 1)


def test_a_success_resets_the_consecutive_count_and_late_results_do_not_reopen() -> None:
    b = _fail(Breaker(POLICY), 2).record(False, 0)
    assert _fail(b, 2).state == CLOSED
    opened = _fail(Breaker(POLICY), 3)
    assert opened.record(False, 1) == opened  # a call from before: the cooldown stands


def test_a_success_that_changes_nothing_keeps_the_breaker_and_old_failures_age_out() -> None:
    b = _fail(Breaker(POLICY), 2)
    for n in range(POLICY.window):
        b = b.record(False, n)
        assert b.consecutive == 0 and b.state == CLOSED
    assert b.recent == (False,) * POLICY.window  # the failures left the window
    assert b == Breaker(POLICY, recent=(False,) * POLICY.window)
    assert b.record(False, 20) is b  # a healthy upstream's success: the same value, kept
    # After a failure, the next success is a change again.
    failed_once = b.record(True, 21)
    after = failed_once.record(False, 22)
    assert after.consecutive == 0 and after.recent == (*(False,) * 8, True, False)


def test_a_probe_cancelled_by_its_caller_frees_the_slot_and_gives_no_verdict() -> None:
    opened = _fail(Breaker(POLICY), 3)  # open until 5
    probing = opened.start_call(5.0)
    assert not probing.allows(5.1)
    assert probing.call_cancelled(5.2) == probing  # another call's end frees nothing
    freed = probing.call_cancelled(5.2, probe=True)
    assert freed.state == HALF_OPEN and freed.allows(5.2)  # the next call probes
    assert freed.openings == opened.openings  # no verdict: not closed, not reopened
    assert freed.start_call(6).record(True, 6, probe=True).until == 16  # a doubled cooldown
    # Closed, a call that ends without a verdict changes nothing.
    counting = _fail(Breaker(POLICY), 2)
    assert counting.call_cancelled(0, probe=True) == counting


def test_in_half_open_only_the_probe_decides() -> None:
    """A call started before the breaker opened (or in panic, every breaker open) may end
    while it is half-open: its result says nothing of the upstream since."""
    probing = _fail(Breaker(POLICY), 3).start_call(5.0)  # the probe is out
    assert probing.record(False, 5.5) == probing  # a late success does not close it
    assert probing.record(True, 5.5) == probing  # nor a late failure reopen it
    assert probing.record(False, 5.5, probe=True).state == CLOSED


def test_a_model_no_upstream_serves_is_a_404_before_any_call() -> None:
    from app.core.config import Settings
    from app.core.errors import ModelNotServed
    from app.upstream.exchange import Upstream

    upstream = Upstream(Settings(), [A, B])
    upstream.check_serves("n")
    upstream.check_serves(None)  # no model (GET /v1/models): any upstream
    with pytest.raises(ModelNotServed) as caught:
        upstream.check_serves("other")
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        404, "model_not_found", "model",
    )  # fmt: skip


def test_the_breaker_state_shows_half_open_once_the_cooldown_ended() -> None:
    from app.core.config import Settings
    from app.observe.metrics import Metrics
    from app.upstream.exchange import Upstream

    now = [0.0]
    metrics = Metrics(multiproc_dir="")
    upstream = Upstream(Settings(), [A], metrics=metrics, clock=lambda: now[0],
                        breaker_policy=POLICY)  # fmt: skip
    for _ in range(3):
        upstream.outliers.record("a", "failed")
    assert upstream.states() == {"a": "open"}
    assert metrics.upstream_state.labels("a")._value.get() == 2
    now[0] = 5.0
    assert upstream.states() == {"a": "half_open"}
