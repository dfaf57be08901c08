"""The cache tenant covers every credential the upstream can see; keys never cross tenants."""

from __future__ import annotations

import pytest

from app.cache import keys
from app.request import headers

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def _key(hdrs: list[tuple[str, str]], query: str = "") -> str:
    tenant = headers.tenant_of(hdrs)
    return keys.cache_key(upstream="u", route="chat", tenant=tenant, body=BODY, query=query)


@pytest.mark.parametrize(
    "name",
    ["Authorization", "api-key", "x-api-key", "OpenAI-Organization", "OpenAI-Project"],
)
def test_each_credential_header_separates_tenants(name: str) -> None:
    assert _key([(name, "one")]) != _key([(name, "two")])
    assert _key([(name, "one")]) != _key([])  # having it at all matters too


@pytest.mark.parametrize("name", ["x-goog-api-key", "X-Custom-Token", "x-auth", "x-secret"])
def test_headers_named_like_credentials_are_keyed_too(name: str) -> None:
    assert _key([(name, "one")]) != _key([(name, "two")])


def test_headers_that_do_not_identify_the_caller_do_not_split_the_cache() -> None:
    base = [("Authorization", "Bearer k")]
    noise = [("X-Request-ID", "1"), ("x-stainless-retry-count", "2"), ("User-Agent", "a")]
    assert _key(base) == _key(base + noise)


def test_case_order_and_surrounding_space_do_not_change_the_tenant() -> None:
    assert _key([("API-KEY", " k "), ("authorization", "b")]) == _key(
        [("Authorization", "b"), ("api-key", "k")]
    )


def test_values_cannot_be_shifted_between_headers() -> None:
    assert _key([("api-key", "a"), ("x-api-key", "")]) != _key(
        [("api-key", ""), ("x-api-key", "a")]
    )


def test_the_query_string_is_part_of_the_key() -> None:
    assert _key([], "api-key=one") != _key([], "api-key=two")
    assert _key([], "") != _key([], "x=1")


def test_a_namespace_replaces_the_credential() -> None:
    assert headers.tenant_of([("api-key", "a")], namespace="team") == headers.tenant_of(
        [("api-key", "b")], namespace="team"
    )


def test_every_tenant_header_is_forwarded_and_every_forwarded_credential_is_keyed() -> None:
    """One list drives both: what identifies the caller upstream is what keys the cache."""
    sent = [(name, "v") for name in headers.TENANT_HEADERS] + [("x-goog-api-key", "v")]
    forwarded = headers.upstream_request_headers(sent, stream=False)
    for name in forwarded:
        if name.lower() != "accept-encoding":
            assert headers.is_tenant_header(name), name
    assert {n.lower() for n in forwarded} >= set(headers.TENANT_HEADERS)


def test_the_names_remembered_are_bounded_and_each_keeps_its_answer() -> None:
    """Whether a name is a tenant header is remembered (a hit asks it of every header), for
    at most 1,024 names: a caller sending new names each call grows nothing, and a name
    pushed out is answered the same when it comes back."""
    names = [f"x-filler-{i}" for i in range(3000)] + [f"x-key-{i}" for i in range(3000)]
    first = {name: headers.is_tenant_header(name) for name in names}
    assert headers.is_tenant_header.cache_info().currsize <= 1024
    assert {name: headers.is_tenant_header(name) for name in names} == first
    assert not first["x-filler-0"] and first["x-key-0"]


def _with_fallback(sent: list[tuple[str, str]], key: str) -> dict[str, str]:
    """What goes upstream with the operator's fallback key (transport.py's _prepare)."""
    forwarded = headers.upstream_request_headers(sent, stream=False)
    return headers.with_upstream_key(forwarded, key, fallback_only=True)


@pytest.mark.parametrize("name", ["api-key", "x-api-key", "Authorization"])
def test_the_fallback_key_is_only_for_callers_without_a_credential(name: str) -> None:
    out = _with_fallback([(name, "mine")], "op")
    assert [k for k in out if k.lower() == "authorization"] == (
        ["Authorization"] if name == "Authorization" else []
    )
    assert out[name] == "mine"
    bare = _with_fallback([("Accept", "x")], "op")
    assert bare["Authorization"] == "Bearer op"
