"""A gateway key's x-ratelimit-* headers against the upstream's (app/edge/finish.py
``with_key_limits``); through a stack with keys: tests/integration/test_gateway_keys.py."""

from __future__ import annotations

from app.edge.finish import with_key_limits

UPSTREAM = [
    ("Content-Type", "application/json"),
    ("X-RateLimit-Limit-Requests", "10000"),
    ("X-RateLimit-Remaining-Requests", "9999"),
    ("X-RateLimit-Reset-Requests", "6ms"),
    ("x-ratelimit-limit-tokens", "2000000"),
    ("x-ratelimit-remaining-tokens", "1999990"),
    ("x-ratelimit-reset-tokens", "0ms"),
    ("x-ratelimit-limit-tokens_usage_based", "5000"),
]
REQUESTS = [
    ("x-ratelimit-limit-requests", "60"),
    ("x-ratelimit-remaining-requests", "59"),
    ("x-ratelimit-reset-requests", "1s"),
]


def test_the_keys_trio_replaces_the_upstreams_of_its_dimension_whatever_the_case() -> None:
    out = with_key_limits(list(UPSTREAM), REQUESTS)
    assert out == [UPSTREAM[0], *UPSTREAM[4:], *REQUESTS]


def test_a_key_without_limits_leaves_the_headers_as_they_came() -> None:
    assert with_key_limits(list(UPSTREAM), []) == UPSTREAM
