"""Cache keys, the caller's cache controls, TTL jitter and the entry format (all pure)."""

from __future__ import annotations

import pytest

from app.cache import keys, policy
from app.cache.entry import Entry, EntryError
from app.core.errors import BadRequest
from app.request import routes
from app.request.headers import tenant_of

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
ALICE = [("Authorization", "Bearer sk-alice")]
BOB = [("Authorization", "Bearer sk-bob")]


def _key(body=BODY, headers=ALICE, route="chat", upstream="http://u/v1", namespace=None):
    tenant = tenant_of(headers, namespace=namespace)
    return keys.cache_key(upstream=upstream, route=route, tenant=tenant, body=body)


def test_key_is_a_valid_memcached_key() -> None:
    key = _key()
    assert key.startswith("llmgate:v1:") and len(key) == len("llmgate:v1:") + 64
    assert " " not in key and len(keys.lease_key(key)) < 250


def test_fields_that_do_not_change_the_answer_do_not_change_the_key() -> None:
    same = {
        **BODY,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u1",
        "cache": {"ttl": 5},
    }
    reordered = dict(reversed(list(BODY.items())))
    assert _key(same) == _key() == _key(reordered)


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.5},
        {"model": "other"},
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"max_tokens": 5},
        {"seed": 1},
    ],
)
def test_fields_that_change_the_answer_change_the_key(change) -> None:
    assert _key({**BODY, **change}) != _key()


def test_tenants_never_share_a_key() -> None:
    assert _key(headers=ALICE) != _key(headers=BOB)
    assert _key(headers=[]) != _key(headers=ALICE)
    project = [*ALICE, ("OpenAI-Project", "p2")]
    assert _key(headers=project) != _key(headers=ALICE)
    # The credential is hashed, never part of the key.
    assert "sk-alice" not in _key() and "sk-alice" not in tenant_of(ALICE)


def test_a_namespace_is_shared_across_credentials_but_not_across_routes_or_upstreams() -> None:
    assert _key(headers=ALICE, namespace="docs") == _key(headers=BOB, namespace="docs")
    assert _key(namespace="docs") != _key(namespace="other")
    assert _key(route="completions") != _key()
    assert _key(upstream="http://other/v1") != _key()


@pytest.mark.parametrize(
    ("route", "body", "mode", "expected"),
    [
        ("chat", BODY, "deterministic", True),
        ("chat", {**BODY, "temperature": 0.7}, "deterministic", False),
        ("chat", {"model": "m", "messages": [], "seed": 3}, "deterministic", True),
        ("chat", {"model": "m", "messages": []}, "deterministic", False),
        ("chat", {"model": "m", "messages": []}, "all", True),
        ("embeddings", {"model": "m", "input": "x"}, "deterministic", True),
        ("chat", BODY, "off", False),
        ("responses", BODY, "all", False),  # store defaults to true
        ("responses", {**BODY, "store": False}, "all", True),
        ("responses", {**BODY, "store": False}, "deterministic", True),  # temperature 0
        ("responses", {"model": "m", "input": "x", "store": False}, "deterministic", False),
        ("responses", {**BODY, "store": True}, "all", False),
        ("responses", {**BODY, "store": False, "background": True}, "all", False),
        ("responses", {**BODY, "store": False, "conversation": "conv_1"}, "all", False),
        ("passthrough", BODY, "all", False),
    ],
)
def test_cacheable(route, body, mode, expected) -> None:
    assert policy.is_cacheable(routes.of_name(route), body, mode) is expected


def test_cache_control_header() -> None:
    d = policy.parse_cache_control(["no-cache, max-age=120", "s-maxage=30, bogus, max-age=x"])
    assert (d.lookup, d.store, d.ttl, d.max_age) == (False, True, 120, 30.0)
    assert d.status_on_miss == policy.REFRESH
    assert policy.parse_cache_control(["No-Store"]).store is False
    assert policy.parse_cache_control(["max-age=0"]).store is False
    assert policy.parse_cache_control([]) == policy.Directive()


def test_litellm_body_controls_win_over_the_header() -> None:
    base = policy.parse_cache_control(["max-age=100"])
    d = policy.apply_body_controls(
        base, {"ttl": 7, "no-store": True, "s-maxage": 3, "namespace": "docs"}
    )
    assert (d.ttl, d.store, d.max_age, d.namespace) == (7, False, 3.0, "docs")
    assert policy.apply_body_controls(base, {"no-cache": True}).lookup is False


@pytest.mark.parametrize(
    "controls", ["yes", {"ttl": -1}, {"ttl": "10"}, {"s-maxage": True}, {"namespace": ""}]
)
def test_malformed_body_controls_are_400(controls) -> None:
    with pytest.raises(BadRequest):
        policy.apply_body_controls(policy.Directive(), controls)


def test_namespaces_only_when_allowed() -> None:
    d = policy.Directive(namespace="docs")
    assert policy.check_namespace(d, frozenset({"docs"})) is d
    assert policy.check_namespace(d, frozenset({"*"})) is d
    with pytest.raises(BadRequest, match="not allowed"):
        policy.check_namespace(d, frozenset())


def test_ttl_jitter_spreads_entries_and_respects_limits() -> None:
    d = policy.Directive()
    assert policy.entry_ttl(d, 3600, 360, rand=lambda: 0.0) == 3600
    assert policy.entry_ttl(d, 3600, 360, rand=lambda: 0.999999) == 3960
    spread = {policy.entry_ttl(d, 3600, 360) for _ in range(200)}
    assert len(spread) > 50 and min(spread) >= 3600 and max(spread) <= 3960
    assert policy.entry_ttl(policy.Directive(ttl=42), 3600, 360) == 42
    # Above 30 days Memcached would read the TTL as a Unix time and expire it at once.
    assert policy.entry_ttl(policy.Directive(ttl=10**9), 3600, 360) < 2_592_000


def test_acceptable_age() -> None:
    assert policy.acceptable_age(policy.Directive(), 10**6)
    assert policy.acceptable_age(policy.Directive(max_age=30), 30)
    assert not policy.acceptable_age(policy.Directive(max_age=30), 31)


def test_entry_round_trip_and_garbage() -> None:
    stream = Entry(
        1000.0, 1.5, 60, 200, "text/event-stream", events=(b"data: {}\n\n", b"data: [DONE]\n\n")
    )
    body = Entry(1000.0, 0.2, 60, 200, "application/json", body='{"é": 1}'.encode())
    for entry in (stream, body):
        data = entry.to_bytes()
        assert Entry.from_bytes(data) == entry
        assert len(data) < 200
    assert body.age(1012.5) == 12.5 and body.age(900) == 0.0
    assert not body.expired(1059.9) and body.expired(1060.0)
    for garbage in (b"", b"LGE1nope", b"pickle", b"LGE1" + b"x" * 10):
        with pytest.raises(EntryError):
            Entry.from_bytes(garbage)
    with pytest.raises(EntryError):
        Entry(0, 0, 1, 200, "", body=b"x", events=(b"y",))


def test_xfetch_refreshes_slow_entries_near_expiry_first() -> None:
    def due(now, compute_s, rand, beta=1.0):
        return policy.refresh_early(
            now=now, expires=1000.0, compute_s=compute_s, beta=beta, rand=lambda: rand
        )

    # -ln(0.5) ≈ 0.69: a 10 s computation is renewed from ~7 s before expiry, a 1 s one
    # only in the last ~0.7 s; beta 0 never.
    assert due(993.5, 10.0, 0.5) and not due(992.0, 10.0, 0.5)
    assert not due(993.5, 1.0, 0.5) and due(999.4, 1.0, 0.5)
    assert not due(999.99, 10.0, 0.5, beta=0.0)
    assert due(1000.0, 0.0, 0.5)  # expired is always due
