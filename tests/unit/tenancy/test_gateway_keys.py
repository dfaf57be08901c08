"""Gateway keys and their limits without a network: the key file, the windows, the gate.

The gate runs against ``MemoryCounters`` (the same contract Memcached's counters keep, see
tests/integration/test_gateway_keys.py for the real thing) and a pinned clock.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from app.core.errors import (
    BadRequest,
    InvalidApiKey,
    LimitsUnavailable,
    ModelNotAllowed,
    ModelNotPriced,
    RateLimited,
)
from app.request import bounds, metering, routes
from app.request.jsonedit import with_member
from app.request.metering import with_usage_requested, without_usage_chunk
from app.request.usage import Usage, usage_chunk
from app.tenancy import keyring, limits
from app.tenancy.access import Access
from app.tenancy.key_source import KeySource
from app.tenancy.keyring import GatewayKey, KeyRing, KeysFileError, hash_key, load, presented_key
from app.tenancy.prices import Price, PriceTable
from tests.conftest import ROOT

SECRET = "llmg-test-secret"
T0 = 1_790_000_020.0  # 40 s into a minute of 2026-09-21 (UTC)


def _key(**limits_) -> GatewayKey:
    return GatewayKey(name="team", sha256=hash_key(SECRET), **limits_)


def _bearer(secret: str = SECRET) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {secret}")]


# -- the keys file ---------------------------------------------------------------------------
def test_a_keys_file_loads_with_defaults_and_dates() -> None:
    ring = load(
        f"""
[[keys]]
name = "search"
sha256 = "{hash_key(SECRET)}"
models = ["gpt-4o-mini"]
requests_per_minute = 60
expires = 2027-01-01

[[keys]]
name = "batch"
sha256 = "{"0" * 64}"
revoked = true
"""
    )
    search, batch = ring.keys
    assert search.models == ("gpt-4o-mini",) and search.upstreams == ("*",)
    assert search.requests_per_minute == 60 and search.tokens_per_minute == 0
    assert search.expires == 1798761600.0  # 2027-01-01T00:00:00Z
    assert batch.revoked and batch.tenant == "key:batch"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[[keys]]\nname = "a"\n', "keys[0].sha256 is missing"),
        ('[[keys]]\nname = "a"\nsha256 = "abc"\n', "64 lowercase hex"),
        (f'[[keys]]\nname = "A"\nsha256 = "{"a" * 64}"\n', "keys[0].name must"),
        (f'[[keys]]\nname = "a"\nsha256 = "{"a" * 64}"\nrpm = 5\n', "rpm is not a known"),
        (f'[[keys]]\nname = "a"\nsha256 = "{"a" * 64}"\nmax_n = -1\n', "max_n must be >= 0"),
        (f'[[keys]]\nname = "a"\nsha256 = "{"a" * 64}"\nrevoked = "no"\n', "wrong type"),
        (f'[[keys]]\nname = "a"\nsha256 = "{"a" * 64}"\nmodels = []\n', "models must"),
        (
            f'[[keys]]\nname = "a"\nsha256 = "{"a" * 64}"\n'
            f'[[keys]]\nname = "a"\nsha256 = "{"b" * 64}"\n',
            "keys[1].name is used twice",
        ),
        ("key = 1\n", "unknown section"),
    ],
)
def test_a_wrong_keys_file_names_the_key_and_field(text: str, words: str) -> None:
    with pytest.raises(KeysFileError, match=r"^keys\.toml: ") as caught:
        load(text, path="keys.toml")
    assert words in str(caught.value)


def test_the_cli_prints_a_key_once_and_a_table_holding_only_its_hash(capsys) -> None:
    assert keyring.main(["new", "team-a"]) == 0
    out, err = capsys.readouterr()
    key = err.rsplit(": ", 1)[1].strip()
    assert key.startswith("llmg-") and len(key) == 48 and key not in out
    (made,) = load(out).keys
    assert (made.name, made.sha256) == ("team-a", hash_key(key))
    assert keyring.main(["new", "Bad Name"]) == 2


@pytest.mark.parametrize(
    ("headers", "found"),
    [
        ([("Authorization", "Bearer  k1 ")], "k1"),
        ([("api-key", "k2")], "k2"),
        ([("X-API-Key", "k3")], "k3"),
        ([("Authorization", "Basic eDp5"), ("api-key", "k4")], "k4"),
        ([("Authorization", "Bearer ")], None),
        ([], None),
    ],
)
def test_the_key_a_caller_presents(headers, found) -> None:
    assert presented_key(headers) == found


def test_unknown_revoked_and_expired_keys_are_one_401() -> None:
    ring = KeyRing([_key(), GatewayKey("old", hash_key("old"), expires=T0),
                    GatewayKey("gone", hash_key("gone"), revoked=True)])  # fmt: skip
    assert ring.authenticate(_bearer(), T0).name == "team"
    for secret in ("nope", "old", "gone"):
        with pytest.raises(InvalidApiKey) as caught:
            ring.authenticate(_bearer(secret), T0)
        assert caught.value.status == 401 and caught.value.code == "invalid_api_key"
        assert "not valid" in caught.value.message
    with pytest.raises(InvalidApiKey, match="needs an API key"):
        ring.authenticate([], T0)


def test_models_and_caps() -> None:
    key = _key(models=("gpt-4o-mini",), max_tokens=100, max_n=2)
    key.check_request("gpt-4o-mini", {"max_tokens": 100, "n": 2})
    with pytest.raises(ModelNotAllowed) as caught:
        key.check_request("gpt-4o", {})
    assert (caught.value.status, caught.value.code) == (403, "model_not_allowed")
    too_much = [({"max_tokens": 101}, "max_tokens"), ({"n": 3}, "n"),
                ({"max_output_tokens": 500}, "max_output_tokens")]  # fmt: skip
    for body, param in too_much:
        with pytest.raises(BadRequest) as bad:
            key.check_request("gpt-4o-mini", body)
        assert bad.value.param == param


# -- windows ---------------------------------------------------------------------------------
def test_windows_and_reset_texts() -> None:
    now = T0 + 0.5
    m = limits.minute("requests", now)
    assert (m.end - m.start, m.start % 60, m.reset_s(now)) == (60, 0, 19.5)
    assert m.key("team") == f"llmgate:rl:v1:team:requests:{m.start}"
    d, mo = limits.day("tokens_day", now), limits.month("usd_month", now)
    assert d.start % 86400 == 0 and d.end - d.start == 86400
    assert mo.start == 1788220800 and mo.end == 1790812800  # 2026-09-01 .. 2026-10-01 UTC
    assert mo.key("team") == f"llmgate:rl:v1:team:usd_month:{mo.start}"
    assert limits.month("tokens_month", 1796083200.0).end == 1798761600  # December: January
    assert [limits.reset_text(s) for s in (0.02, 1, 59.5, 360, 3725)] == [
        "20ms", "1s", "1m0s", "6m0s", "1h2m5s"]  # fmt: skip


def test_memory_counters_expire_and_stop_at_zero() -> None:
    now = [0.0]
    counters = limits.MemoryCounters(clock=lambda: now[0])
    assert counters.apply([limits.Count("k", 2, ttl=10), limits.Count("k", 3, ttl=10)]) == [2, 5]
    assert counters.apply([limits.Count("k", -9)]) == [0]
    now[0] = 11.0
    assert counters.read(["k"]) == {} and counters.apply([limits.Count("k", 1, ttl=10)]) == [1]


# -- the gate --------------------------------------------------------------------------------
class FixedSource(KeySource):
    def __init__(self, *keys: GatewayKey) -> None:
        self.ring = KeyRing(keys)

    def current(self) -> KeyRing:
        return self.ring


class DownCounters:
    def apply(self, counts):
        return [None] * len(counts)

    def read(self, keys):
        return None


def _gate(key: GatewayKey, counters=None, clock=lambda: T0, **kw) -> Access:
    return Access(FixedSource(key), counters or limits.MemoryCounters(), clock=clock, **kw)


def test_requests_per_minute_admit_exactly_the_limit_and_count_down() -> None:
    gate = _gate(_key(requests_per_minute=5))
    key = gate.authenticate(_bearer())
    remaining = []
    for _ in range(5):
        grant = gate.admit(key, "m", {}, stream=False)
        remaining.append(dict(grant.headers)["x-ratelimit-remaining-requests"])
    assert remaining == ["4", "3", "2", "1", "0"]
    assert dict(grant.headers)["x-ratelimit-reset-requests"] == "20s"
    with pytest.raises(RateLimited) as caught:
        gate.admit(key, "m", {}, stream=False)
    error = caught.value
    assert (error.status, error.type, error.code) == (429, "requests", "rate_limit_exceeded")
    assert error.headers["retry-after"] == "20" and error.retryable


OVER = bounds.PROMPT_OVERHEAD  # what an empty body's prompt reserves


def test_tokens_are_reserved_then_settled_from_usage() -> None:
    counters = limits.MemoryCounters()
    gate = _gate(_key(tokens_per_minute=1400, tokens_per_day=1400), counters)
    key = gate.authenticate(_bearer())
    first = gate.admit(key, "m", {"max_tokens": 600}, stream=False, route=routes.CHAT, size=100)
    assert first.tokens == 100 + OVER + 600  # the body's bytes, the overhead, the output
    assert dict(first.headers)["x-ratelimit-remaining-tokens"] == str(1400 - first.tokens)
    with pytest.raises(RateLimited) as caught:  # 764 + 764 would cross 1400
        gate.admit(key, "m", {"max_tokens": 600}, stream=False, route=routes.CHAT, size=100)
    assert caught.value.type == "tokens" and caught.value.retryable
    gate.settle(
        first, Usage({"prompt_tokens": 10, "completion_tokens": 90, "total_tokens": 100}), True
    )
    gate.settle(first, Usage({"total_tokens": 999}), True)  # once only
    windows = [limits.minute("tokens", T0), limits.day("tokens_day", T0)]
    assert counters.read([w.key("team") for w in windows]) == {w.key("team"): 100 for w in windows}
    second = gate.admit(key, "m", {"max_tokens": 600}, stream=False, route=routes.CHAT, size=100)
    gate.settle(second, None, False)  # a cache hit: nothing billed, the reservation freed
    assert counters.read([windows[0].key("team")]) == {windows[0].key("team"): 100}


def test_a_billed_call_without_usage_keeps_its_reservation() -> None:
    counters = limits.MemoryCounters()
    gate = _gate(_key(tokens_per_day=10_000), counters)
    key = gate.authenticate(_bearer())
    grant = gate.admit(key, "m", {"max_tokens": 700}, stream=True, route=routes.CHAT, size=36)
    gate.settle(grant, None, True)  # the caller left before the usage chunk
    day = limits.day("tokens_day", T0).key("team")
    assert counters.read([day]) == {day: 36 + OVER + 700}


def test_a_billed_call_whose_usage_is_an_empty_object_keeps_its_reservation() -> None:
    counters = limits.MemoryCounters()
    gate = _gate(_key(tokens_per_day=10_000), counters)
    key = gate.authenticate(_bearer())
    grant = gate.admit(key, "m", {"max_tokens": 700}, stream=False, route=routes.CHAT, size=36)
    gate.settle(grant, Usage({}), True)  # "usage": {} counts nothing: no usage, not 0 tokens
    day = limits.day("tokens_day", T0).key("team")
    assert counters.read([day]) == {day: 36 + OVER + 700}


def test_a_budget_is_a_quota_the_sdk_must_not_retry() -> None:
    gate = _gate(_key(tokens_per_day=100))
    key = gate.authenticate(_bearer())
    grant = gate.admit(key, "m", None, stream=False)  # a passthrough: nothing reserved
    gate.settle(grant, Usage({"total_tokens": 100}), True)
    with pytest.raises(RateLimited) as caught:  # the budget is spent: refused
        gate.admit(key, "m", None, stream=False)
    error = caught.value
    assert (error.code, error.retryable, error.type) == ("insufficient_quota", False, "tokens")
    assert int(error.headers["retry-after"]) > 3600  # the next UTC day


def test_a_call_larger_than_the_whole_limit_is_refused_for_good() -> None:
    counters = limits.MemoryCounters()
    gate = _gate(_key(tokens_per_minute=1000), counters)
    key = gate.authenticate(_bearer())
    with pytest.raises(RateLimited) as caught:
        gate.admit(key, "m", {"max_tokens": 10}, stream=False, route=routes.CHAT, size=5000)
    error = caught.value
    assert (error.status, error.type, error.retryable) == (429, "tokens", False)
    assert "retry-after" not in error.headers and "Request too large" in error.message
    assert counters.read([limits.minute("tokens", T0).key("team")]) == {}  # nothing taken


def test_a_refused_call_gives_back_what_it_took() -> None:
    counters = limits.MemoryCounters()
    gate = _gate(_key(requests_per_minute=10, max_streams=5, tokens_per_minute=1000), counters)
    key = gate.authenticate(_bearer())
    held = gate.admit(key, "m", {"max_tokens": 500}, stream=False, route=routes.CHAT)
    with pytest.raises(RateLimited):  # 564 fits alone, not beside the first
        gate.admit(key, "m", {"max_tokens": 500}, stream=True, route=routes.CHAT)
    taken = [limits.minute("requests", T0), limits.streams(600), limits.minute("tokens", T0)]
    counts = counters.read([w.key("team") for w in taken])
    assert [counts[w.key("team")] for w in taken] == [1, 0, held.tokens]


def test_a_call_the_gateway_failed_gives_its_request_back() -> None:
    counters = limits.MemoryCounters()
    gate = _gate(_key(requests_per_minute=10, max_streams=5), counters)
    key = gate.authenticate(_bearer())
    served = gate.admit(key, "m", {}, stream=True, route=routes.CHAT)
    failed = gate.admit(key, "m", {}, stream=True, route=routes.CHAT)
    gate.settle(served, Usage({"total_tokens": 5}), True)
    gate.settle(failed, None, False, served=False)  # e.g. the upstream was unreachable
    gate.settle(failed, None, False, served=False)  # once only
    requests, streams = limits.minute("requests", T0), limits.streams(600)
    counts = counters.read([requests.key("team"), streams.key("team")])
    assert counts == {requests.key("team"): 1, streams.key("team"): 0}


def test_a_stream_slot_outlives_the_stream_it_counts() -> None:
    now = [T0]
    counters = limits.MemoryCounters(clock=lambda: now[0])
    gate = _gate(_key(max_streams=2), counters, clock=lambda: now[0], stream_hold_s=600)
    key = gate.authenticate(_bearer())
    first = gate.admit(key, "m", {}, stream=True)
    now[0] += 500
    gate.admit(key, "m", {}, stream=True)  # renews the counter: it lives 660 s from here
    now[0] += 500  # 1,000 s after the first start, 500 after the second
    with pytest.raises(RateLimited, match="2 streams open"):
        gate.admit(key, "m", {}, stream=True)
    gate.settle(first, None, False)
    gate.admit(key, "m", {}, stream=True)
    now[0] += 661  # no start for longer than any stream lasts: the count is gone
    assert gate.usage()["keys"][0]["streams_open"] == 0
    window = limits.streams(600)
    assert window.ttl(now[0]) == window.ttl(0.0) == 660  # a duration, not an end time


def test_a_key_cap_is_sent_to_calls_that_name_no_bound() -> None:
    gate = _gate(_key(max_tokens=300, tokens_per_day=10_000))
    key = gate.authenticate(_bearer())
    named = gate.admit(key, "m", {"max_tokens": 20}, stream=False, route=routes.CHAT)
    unnamed = gate.admit(key, "m", {}, stream=False, route=routes.CHAT)
    embedding = gate.admit(key, "m", {}, stream=False, route=routes.EMBEDDINGS)
    assert (named.output_cap, named.tokens) == (None, OVER + 20)
    assert (unnamed.output_cap, unnamed.tokens) == (300, OVER + 300)
    assert (embedding.output_cap, embedding.tokens) == (None, OVER)


def test_a_call_naming_no_bound_reserves_the_models_ceiling() -> None:
    table = PriceTable("v1", {"big": Price(0, 0, 0, max_output_tokens=32_000)})
    gate = _gate(_key(tokens_per_day=10**6), prices=table, default_output_tokens=4096)
    key = gate.authenticate(_bearer())
    assert gate.admit(key, "big", {"n": 2}, stream=False, route=routes.CHAT).tokens == OVER + 64_000
    assert gate.admit(key, "small", {}, stream=False, route=routes.CHAT).tokens == OVER + 4096


PRICES = PriceTable(
    "2026-12", {"m": Price(input=2_000_000, cached_input=500_000, output=8_000_000)}
)


def test_a_money_budget_is_reserved_then_settled_at_the_answers_cost() -> None:
    counters = limits.MemoryCounters()
    spent: list[int] = []
    gate = _gate(
        _key(usd_per_day=0.01), counters, prices=PRICES, on_usage=lambda k, u, c: spent.append(c)
    )
    key = gate.authenticate(_bearer())
    grant = gate.admit(key, "m", {"max_tokens": 500}, stream=False, route=routes.CHAT, size=936)
    assert grant.cost == (936 + OVER) * 2_000_000 + 500 * 8_000_000  # 0.006 USD
    with pytest.raises(RateLimited) as caught:  # two would cross 0.01 USD
        gate.admit(key, "m", {"max_tokens": 500}, stream=False, route=routes.CHAT, size=936)
    assert caught.value.code == "insufficient_quota" and "USD" in caught.value.message
    usage = {"prompt_tokens": 300, "completion_tokens": 100, "total_tokens": 400,
             "prompt_tokens_details": {"cached_tokens": 200}}  # fmt: skip
    gate.settle(grant, Usage(usage), True)
    cost = 100 * 2_000_000 + 200 * 500_000 + 100 * 8_000_000  # 0.0011 USD
    day = limits.day("usd_day", T0).key("team")
    assert counters.read([day]) == {day: cost} and spent == [cost]
    assert gate.usage()["keys"][0]["usd_today"] == pytest.approx(0.0011)


# Each call below reserves 1,500 tokens (936 bytes, the overhead, 500 output) and costs at most
# 0.006 USD (1,000 prompt tokens at 2e6 picodollars, 500 output at 8e6): two land on 3,000
# tokens or 0.012 USD.
@pytest.mark.parametrize(
    ("budget", "exact", "short", "used"),
    [
        ("tokens_per_minute", 3000, 2999, "(1500 tokens used, 1500 tokens held for this call)"),
        ("tokens_per_day", 3000, 2999, "(1500 tokens used, 1500 tokens held for this call)"),
        ("tokens_per_month", 3000, 2999, "(1500 tokens used, 1500 tokens held for this call)"),
        ("usd_per_day", 0.012, 0.011999999999, "(0.006000 USD used, 0.006000 USD held"),
        ("usd_per_month", 0.012, 0.011999999999, "(0.006000 USD used, 0.006000 USD held"),
    ],
)
def test_a_budget_admits_the_call_that_lands_exactly_on_it_not_one_unit_more(
    budget, exact, short, used
) -> None:
    call = {"max_tokens": 500}
    assert 936 + OVER + 500 == 1500
    gate = _gate(_key(**{budget: exact}), prices=PRICES)
    key = gate.authenticate(_bearer())
    gate.admit(key, "m", call, stream=False, route=routes.CHAT, size=936)
    second = gate.admit(key, "m", call, stream=False, route=routes.CHAT, size=936)  # exactly full
    if budget == "tokens_per_minute":
        assert dict(second.headers)["x-ratelimit-remaining-tokens"] == "0"
    with pytest.raises(RateLimited):  # full: even a call reserving nothing is refused
        gate.admit(key, "m", None, stream=False)
    gate = _gate(_key(**{budget: short}), prices=PRICES)  # one token, one picodollar less
    key = gate.authenticate(_bearer())
    gate.admit(key, "m", call, stream=False, route=routes.CHAT, size=936)
    with pytest.raises(RateLimited) as caught:
        gate.admit(key, "m", call, stream=False, route=routes.CHAT, size=936)
    assert used in caught.value.message


def test_a_money_budget_needs_a_price_for_the_model() -> None:
    gate = _gate(_key(usd_per_month=5), prices=PRICES)
    key = gate.authenticate(_bearer())
    with pytest.raises(ModelNotPriced) as caught:
        gate.admit(key, "other", {}, stream=False, route=routes.CHAT)
    assert (caught.value.status, caught.value.code) == (403, "model_not_priced")
    unpriced = _gate(_key(usd_per_month=5))  # no price table at all
    with pytest.raises(ModelNotPriced):
        unpriced.admit(key, "m", {}, stream=False, route=routes.CHAT)


def test_concurrent_streams_are_counted_until_settled() -> None:
    gate = _gate(_key(max_streams=2))
    key = gate.authenticate(_bearer())
    grants = [gate.admit(key, "m", {}, stream=True) for _ in range(2)]
    assert gate.usage()["keys"][0]["streams_open"] == 2
    gate.admit(key, "m", {}, stream=False)  # not a stream: not counted
    with pytest.raises(RateLimited, match="2 streams open"):
        gate.admit(key, "m", {}, stream=True)
    gate.settle(grants[0], None, False)
    gate.admit(key, "m", {}, stream=True)


class Recorded(limits.MemoryCounters):
    """The stand-in counters, recording each batch a call sends them (a round trip each to
    Memcached): the counters' keys' kinds and deltas."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple[str, int]]] = []
        self.keys: list[str] = []

    def apply(self, counts):
        self.batches.append([(c.key.split(":")[4], c.delta) for c in counts])
        self.keys += [c.key for c in counts]
        return super().apply(counts)


def test_a_call_counts_in_one_batch_only_the_limits_its_key_has() -> None:
    counters = Recorded()
    gate = _gate(_key(requests_per_minute=9, tokens_per_day=10_000, max_streams=3), counters)
    key = gate.authenticate(_bearer())
    grant = gate.admit(key, "m", {"max_tokens": 100}, stream=True, route=routes.CHAT, size=36)
    gate.settle(grant, Usage({"total_tokens": 30}), True)
    held = 36 + OVER + 100
    assert counters.batches == [
        [("streams", 1), ("requests", 1), ("tokens_day", held)],  # the grant
        [("tokens_day", 30 - held), ("streams", -1)],  # the settlement
    ]
    counters.batches.clear()
    for gate in (_gate(_key(requests_per_minute=9), counters), _gate(_key(), counters)):
        key = gate.authenticate(_bearer())
        grant = gate.admit(key, "m", {"max_tokens": 100}, stream=True, route=routes.CHAT)
        gate.settle(grant, Usage({"total_tokens": 30}), True)
    assert counters.batches == [[("requests", 1)]]  # nothing to settle; nothing at all


def test_each_budget_counts_in_its_own_calendar_window() -> None:
    """The windows' starts worked out here with datetime, not with app/tenancy/limits.py."""
    counters = Recorded()
    budgets = {"tokens_per_minute": 10**6, "tokens_per_day": 10**7, "tokens_per_month": 10**8,
               "usd_per_day": 50.0, "usd_per_month": 500.0}  # fmt: skip
    gate = _gate(_key(**budgets), counters, prices=PRICES)
    gate.admit(gate.authenticate(_bearer()), "m", {}, stream=False, route=routes.CHAT)
    at = datetime.fromtimestamp(T0, UTC)
    minute = at.replace(second=0, microsecond=0)
    day = minute.replace(hour=0, minute=0)
    month = day.replace(day=1)
    starts = {"tokens": minute, "tokens_day": day, "tokens_month": month, "usd_day": day,
              "usd_month": month}  # fmt: skip
    assert counters.keys == [
        f"{limits.PREFIX}team:{what}:{int(start.timestamp())}" for what, start in starts.items()
    ]


def test_a_refusal_gives_back_every_share_in_one_batch() -> None:
    counters = Recorded()
    gate = _gate(_key(requests_per_minute=1, tokens_per_minute=1000), counters)
    key = gate.authenticate(_bearer())
    gate.admit(key, "m", {"max_tokens": 10}, stream=False, route=routes.CHAT)
    with pytest.raises(RateLimited, match="requests per minute"):
        gate.admit(key, "m", {"max_tokens": 10}, stream=False, route=routes.CHAT)
    with pytest.raises(RateLimited, match="Request too large"):  # refused before counting
        gate.admit(key, "m", {"max_tokens": 5000}, stream=False, route=routes.CHAT)
    want = OVER + 10
    assert counters.batches == [
        [("requests", 1), ("tokens", want)],
        [("requests", 1), ("tokens", want)],
        [("requests", -1), ("tokens", -want)],
    ]


def test_counters_down_fail_open_or_closed() -> None:
    errors = []
    gate = _gate(
        _key(requests_per_minute=1), DownCounters(), on_counter_error=lambda: errors.append(1)
    )
    key = gate.authenticate(_bearer())
    for _ in range(3):
        assert gate.admit(key, "m", {}, stream=False).headers == []  # uncounted, no headers
    assert len(errors) == 3
    closed = _gate(_key(requests_per_minute=1), DownCounters(), fail_open=False)
    with pytest.raises(LimitsUnavailable) as caught:
        closed.admit(key, "m", {}, stream=False)
    assert caught.value.status == 503


def test_the_keys_file_is_re_read_when_it_changes(tmp_path) -> None:
    path = tmp_path / "keys.toml"
    table = f'[[keys]]\nname = "team"\nsha256 = "{hash_key(SECRET)}"\n'
    path.write_text(table)
    now = [0.0]
    source = KeySource(str(path), clock=lambda: now[0])
    assert source.current().authenticate(_bearer(), T0).name == "team"
    path.write_text(table + "revoked = true\n")
    assert source.current().authenticate(_bearer(), T0)  # checked at most every 0.25 s
    now[0] = 0.3
    with pytest.raises(InvalidApiKey):
        source.current().authenticate(_bearer(), T0)
    path.write_text("this is not toml")
    now[0] = 0.6
    with pytest.raises(InvalidApiKey):  # a bad edit is ignored: the keys in force stay
        source.current().authenticate(_bearer(), T0)
    assert source.reload_errors == 1


# -- the usage chunk -------------------------------------------------------------------------
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}\n\n'  # noqa: E501
CHUNK = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'


def test_the_usage_chunk_is_taken_out_and_kept_for_the_count() -> None:
    seen: list[Usage] = []
    batches = [[CHUNK], [CHUNK, USAGE, b"data: [DONE]\n\n"], [USAGE]]
    out = list(without_usage_chunk(iter(batches), seen.append))
    bare = CHUNK.replace(b',"usage":null', b"")  # the null the asking caused goes too
    assert out == [[bare], [bare, b"data: [DONE]\n\n"]]  # a batch left empty is no write
    assert seen == [Usage({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})] * 2
    assert usage_chunk(CHUNK) is None and usage_chunk(b": ping\n\n") is None


def test_the_null_usage_the_gateway_caused_is_taken_out_of_every_chunk() -> None:
    last = b'data: {"id":"c","usage":null,"choices":[]}\n\n'  # a member first, then others
    alone = b'data: {"usage":null}\n\n'  # the only member: left as it is
    text = b'data: {"id":"c","choices":[{"delta":{"content":"\\"usage\\":null"}}]}\n\n'
    first = b'data: {"usage":null,"id":"c","choices":[]}\n\n'  # the first member
    resumable = b"id: 7\n" + last  # a resumable stream's event: its id line kept
    batch = [CHUNK, last, first, alone, text, b": ping\n\n", resumable]
    out = list(without_usage_chunk(iter([batch]), print))
    assert out == [[CHUNK.replace(b',"usage":null', b""),
                    b'data: {"id":"c","choices":[]}\n\n', b'data: {"id":"c","choices":[]}\n\n',
                    alone, text, b": ping\n\n",
                    b'id: 7\ndata: {"id":"c","choices":[]}\n\n']]  # fmt: skip
    assert json.loads(out[0][0][6:]) == {
        "id": "c",
        "choices": [{"index": 0, "delta": {"content": "hi"}}],
    }


def test_chunks_without_usage_pass_as_they_are_without_a_parse(monkeypatch) -> None:
    # Servers that write no ``"usage":null`` (many OpenAI-compatible ones, the simulator's
    # scripted streams): each such chunk goes on as the same bytes, without the usage
    # chunk's test or a split.
    plain = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    looked: list[bytes] = []

    def usage_chunk_seen(raw: bytes) -> Usage | None:
        looked.append(raw)
        return usage_chunk(raw)

    monkeypatch.setattr(metering, "usage_chunk", usage_chunk_seen)
    seen: list[Usage] = []
    batch = [plain, plain, b": ping\n\n", USAGE, b"data: [DONE]\n\n"]
    out = list(without_usage_chunk(iter([batch]), seen.append))
    assert out == [[plain, plain, b": ping\n\n", b"data: [DONE]\n\n"]]
    assert out[0][0] is plain  # kept, not copied
    assert seen == [Usage({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})]
    assert plain not in looked and looked == [b": ping\n\n", USAGE, b"data: [DONE]\n\n"]


def test_usage_is_requested_editing_only_stream_options() -> None:
    raw = b'{ "model" : "m",\n  "stream": true }'
    asked = with_usage_requested(raw, json.loads(raw))
    assert asked == b'{ "model" : "m",\n  "stream": true,"stream_options":{"include_usage":true} }'
    raw = b'{"stream_options": {"include_obfuscation": false}, "model": "m"}'
    asked = with_usage_requested(raw, json.loads(raw))
    assert json.loads(asked)["stream_options"] == {
        "include_obfuscation": False,
        "include_usage": True,
    }
    assert asked.endswith(b', "model": "m"}')
    raw = b'{"stream_options":{"include_usage":true}}'
    assert with_usage_requested(raw, json.loads(raw)) is raw
    assert with_member(b"{}", "a", b"1") == b'{"a":1}'


def test_usage_reports_null_where_the_key_counts_nothing() -> None:
    gate = _gate(_key(tokens_per_day=1000))
    key = gate.authenticate(_bearer())
    gate.settle(gate.admit(key, "m", None, stream=False), Usage({"total_tokens": 55}), True)
    (row,) = gate.usage()["keys"]
    assert row["tokens_today"] == 55 and row["limits"]["tokens_per_day"] == 1000
    uncounted = ("tokens_this_month", "requests_this_minute", "streams_open", "usd_today")
    assert [row[name] for name in uncounted] == [None] * 4  # not a misleading 0


def test_every_keys_file_field_is_documented() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    missing = [name for name in keyring._FIELDS if f"`{name}`" not in text]
    assert not missing, f"docs/security.md does not document {missing}"
