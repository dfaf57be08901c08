"""A body read once while it repeats (app/request/body_readings.py, through ``Gateway.plan``):
what the bytes decide comes from the reading; what the caller decides (its tenant, its
Cache-Control, its query) is decided for each call; a refused body is refused each time."""

from __future__ import annotations

import json

import pytest

from app.cache.plan import MAX_PLANS, cache_plan
from app.cache.store import AnswerCache
from app.cache.tiered import TieredCache
from app.core.config import Settings
from app.core.errors import BadRequest, ModelNotServed
from app.gateway import Caller, Gateway, Plan
from app.request import routes
from app.request.body_readings import BodyReading
from app.request.call import Call
from app.store.memory import MemoryBackend
from app.upstream.catalog import UpstreamSpec
from app.upstream.exchange import Upstream

SETTINGS = Settings(upstream_url="http://127.0.0.1:9/v1", cache_lease_s=0)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
RAW = json.dumps(BODY).encode()


def _gateway() -> Gateway:
    l1 = MemoryBackend(1 << 20)
    answers = AnswerCache(TieredCache(l1, None, l1_ttl=60), SETTINGS, shared=False)
    specs = [UpstreamSpec("only", "http://127.0.0.1:9/v1", models=("m",))]
    return Gateway(SETTINGS, Upstream(SETTINGS, specs), answers)


def _plan(gateway: Gateway, raw: bytes = RAW, *, route: str = "chat",
          path: str = "/v1/chat/completions", headers=(), query: str = "") -> Plan:  # fmt: skip
    call = Call(routes.of_name(route), "POST", path, query, list(headers), raw)
    return gateway.plan(call, Caller(None))


def test_the_same_bytes_on_the_same_route_and_path_are_read_once() -> None:
    gateway = _gateway()
    both = json.dumps({**BODY, "prompt": "hi"}).encode()  # a chat call's and a completion's
    first = _plan(gateway, both)
    assert _plan(gateway, both).body is first.body
    assert _plan(gateway, both, headers=[("api-key", "b")], query="v=2").body is first.body
    assert len(gateway.readings) == 1
    # Any other bytes (the same JSON spaced otherwise), route or path: read on its own.
    spaced = _plan(gateway, json.dumps(json.loads(both), indent=1).encode())
    assert spaced.body == first.body and spaced.body is not first.body
    other_route = _plan(gateway, both, route="completions", path="/v1/completions")
    assert other_route.body == first.body and other_route.body is not first.body
    assert _plan(gateway, both, path="/v1/chat/completions/").body is not first.body
    assert len(gateway.readings) == 4


def test_what_the_caller_decides_is_decided_for_each_call() -> None:
    """One reading, and still each call's own tenant, Cache-Control and query in its key
    and directive, and its own trace of what it asked."""
    gateway = _gateway()
    plans = {
        "a": _plan(gateway, headers=[("api-key", "a")]),
        "b": _plan(gateway, headers=[("api-key", "b")]),
        "a, query": _plan(gateway, headers=[("api-key", "a")], query="v=2"),
        "a, no-store": _plan(gateway, headers=[("api-key", "a"), ("Cache-Control", "no-store")]),
        "a again": _plan(gateway, headers=[("api-key", "a")]),
    }
    assert len(gateway.readings) == 1
    cached = {name: plan.cache for name, plan in plans.items()}
    assert all(c is not None for c in cached.values())
    keys = {name: c.key for name, c in cached.items() if c is not None}
    assert len({keys["a"], keys["b"], keys["a, query"]}) == 3
    assert keys["a again"] == keys["a"] == keys["a, no-store"]
    stores = {name: c.directive.store for name, c in cached.items() if c is not None}
    assert stores == {"a": True, "b": True, "a, query": True, "a, no-store": False,
                      "a again": True}  # fmt: skip
    for plan in plans.values():
        assert (plan.call.trace.model, plan.call.trace.stream) == ("m", False)


def test_a_call_the_cache_does_not_serve_keeps_no_reading() -> None:
    """A sampled answer, or a gateway without a cache: read each time (without a cache, the
    same bytes again are rare)."""
    gateway = _gateway()
    sampled = json.dumps({**BODY, "temperature": 0.7}).encode()
    assert _plan(gateway, sampled).body is not _plan(gateway, sampled).body
    assert len(gateway.readings) == 0
    specs = [UpstreamSpec("only", "http://127.0.0.1:9/v1", models=("m",))]
    uncached = Gateway(SETTINGS, Upstream(SETTINGS, specs), None)
    assert _plan(uncached).body is not _plan(uncached).body
    assert len(uncached.readings) == 0


def test_the_gateways_cache_object_is_taken_out_of_what_goes_upstream_once_for_all() -> None:
    gateway = _gateway()
    raw = json.dumps({**BODY, "cache": {"ttl": 60}}).encode()
    for _ in range(2):
        plan = _plan(gateway, raw)
        assert plan.cache is not None and plan.cache.directive.ttl == 60
    kept = gateway.readings.get(routes.CHAT, "/v1/chat/completions", raw)
    assert kept is not None and kept.body["cache"] == {"ttl": 60}
    assert json.loads(kept.forward) == BODY  # what goes upstream, for every call


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        (b"{", BadRequest),
        (json.dumps({"messages": []}).encode(), BadRequest),
        (json.dumps({**BODY, "model": "elsewhere"}).encode(), ModelNotServed),
    ],
)
def test_a_refused_body_is_refused_each_time_and_never_kept(raw, refused) -> None:
    gateway = _gateway()
    for _ in range(3):
        with pytest.raises(refused):
            _plan(gateway, raw)
    assert len(gateway.readings) == 0


def test_a_readings_plans_are_each_callers_own_past_their_bound() -> None:
    """More tenants than a reading keeps plans for: each still gets its own key, the same
    key a gateway that never saw the others gives it."""
    gateway = _gateway()
    tenants = [f"k{n}" for n in range(MAX_PLANS + 5)]
    for _ in range(2):
        found = [_plan(gateway, headers=[("api-key", t)]).cache for t in tenants]
        keys = [c.key for c in found if c is not None]
        assert len(set(keys)) == len(tenants)
        reading = gateway.readings.get(routes.CHAT, "/v1/chat/completions", RAW)
        assert reading is not None and len(reading.cache_plans) <= MAX_PLANS
    alone = [_plan(_gateway(), headers=[("api-key", t)]).cache for t in tenants]
    assert keys == [c.key for c in alone if c is not None]


def test_a_gateway_keys_tenant_and_a_shared_namespace_decide_the_key() -> None:
    """The tenant a grant names (keys on), and a namespace the body asks for, which the
    operator allows: the same bytes and headers, each its own key."""
    settings = Settings(upstream_url="http://127.0.0.1:9/v1", cache_namespaces="team")
    raw = json.dumps({**BODY, "cache": {"namespace": "team"}}).encode()
    reading = BodyReading(json.loads(raw), RAW, False)
    headers = [("api-key", "a")]

    def plan(tenant: str | None, reading: BodyReading = reading) -> str:
        planned = cache_plan(
            settings,
            route=routes.CHAT,
            headers=headers,
            query="",
            reading=reading,
            upstream=lambda model: "u",
            tenant=tenant,
        )
        assert planned is not None
        return planned.key

    shared = plan("grant-a")
    assert plan("grant-b") == shared == plan(None)  # the namespace, whoever asks
    own = BodyReading(BODY, RAW, False)
    assert len({plan("grant-a", own), plan("grant-b", own), plan(None, own)}) == 3
    refusing = _gateway()  # a namespace the operator did not allow: refused each time
    for _ in range(2):
        with pytest.raises(BadRequest):
            _plan(refusing, raw)
