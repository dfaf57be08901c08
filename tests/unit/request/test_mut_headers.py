"""Header filtering edges the mutation run found untested (app/request/headers.py).

RFC 9110 7.6.1: Connection is a comma-separated list of field names (optional whitespace
around the commas); every field it names is hop-by-hop and must not be forwarded, either way.
"""

from __future__ import annotations

import pytest

from app.request.headers import downstream_headers, upstream_request_headers


@pytest.mark.parametrize("connection", ["x-a, close", "x-a,close", "close ,X-A", " X-A "])
def test_every_field_named_by_connection_is_dropped_upstream(connection: str) -> None:
    out = upstream_request_headers(
        [("Connection", connection), ("X-A", "1"), ("X-B", "2")], stream=False
    )
    assert out == {"X-B": "2", "Accept-Encoding": "gzip, deflate"}


def test_every_field_named_by_connection_is_dropped_downstream() -> None:
    kept = downstream_headers(
        [("Connection", "x-hop,close"), ("X-Hop", "1"), ("x-request-id", "r")]
    )
    assert kept == [("x-request-id", "r")]


def test_downstream_takes_a_list_of_pairs_and_keeps_repeated_fields() -> None:
    # A list keeps what a mapping cannot: the same field name twice, in order.
    pairs = [
        ("x-ratelimit-limit-requests", "10"),
        ("Link", "<a>"),
        ("Link", "<b>"),
        ("Date", "Mon, 30 Nov 2026 00:00:00 GMT"),
        ("Set-Cookie", "a=b"),
    ]
    assert downstream_headers(pairs) == [
        ("x-ratelimit-limit-requests", "10"),
        ("Link", "<a>"),
        ("Link", "<b>"),
    ]


def test_our_own_headers_from_an_upstream_never_reach_the_caller() -> None:
    """An upstream that is itself such a gateway says where its answer came from in our own
    namespace: the caller hears it from us alone, of our own call."""
    pairs = [
        ("X-LLMGate-Cache", "HIT; level=l1"),
        ("x-llmgate-stream-id", "A" * 24),
        ("X-LLMGATE-Upstream", "theirs"),
        ("X-LLMGate", "kept: not our namespace"),
        ("x-llmgatekeeper", "kept"),
        ("x-request-id", "r"),
    ]
    assert downstream_headers(pairs) == [
        ("X-LLMGate", "kept: not our namespace"),
        ("x-llmgatekeeper", "kept"),
        ("x-request-id", "r"),
    ]


# -- an upstream's own key ------------------------------------------------------------------
def test_an_upstream_key_replaces_every_caller_credential() -> None:
    from app.request.headers import with_upstream_key

    sent = {"Authorization": "Bearer c", "API-Key": "c", "x-api-key": "c", "X-Other": "o"}
    assert with_upstream_key(dict(sent), "k") == {"X-Other": "o", "Authorization": "Bearer k"}
    assert with_upstream_key(dict(sent), "k", auth="api-key") == {"X-Other": "o", "api-key": "k"}


def test_a_fallback_key_only_for_callers_without_one() -> None:
    from app.request.headers import with_upstream_key

    for own in ("Authorization", "API-KEY", "X-Api-Key"):
        assert with_upstream_key({own: "c"}, "k", fallback_only=True) == {own: "c"}
    assert with_upstream_key({"X-Other": "o"}, "k", fallback_only=True) == {
        "X-Other": "o",
        "Authorization": "Bearer k",
    }
    assert with_upstream_key({"X-Other": "o"}, "k", auth="api-key", fallback_only=True) == {
        "X-Other": "o",
        "api-key": "k",
    }


def test_no_key_leaves_the_headers_as_they_are() -> None:
    from app.request.headers import with_upstream_key

    headers = {"Authorization": "Bearer c"}
    assert with_upstream_key(headers, "") is headers
    assert with_upstream_key(headers, "", fallback_only=True) is headers


# -- with gateway keys, the caller's identity stays with the gateway --------------------------
def test_without_credentials_drops_every_identity_header_in_any_case() -> None:
    from app.request.headers import without_credentials

    sent = {
        "Authorization": "Bearer gateway-key",
        "API-KEY": "k",
        "x-api-key": "k",
        "OpenAI-Organization": "org",
        "openai-project": "p",
        "X-Request-ID": "r",
        "Content-Type": "application/json",
    }
    assert without_credentials(sent) == {"X-Request-ID": "r", "Content-Type": "application/json"}
