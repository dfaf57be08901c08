"""Header filtering, request validation and the error shape: the pure edges of a call."""

from __future__ import annotations

import json

import pytest

from app.core import errors
from app.request import routes, schema
from app.request.headers import downstream_headers, upstream_request_headers, with_upstream_key


def test_upstream_headers_drop_hop_by_hop_and_client_details() -> None:
    out = upstream_request_headers(
        [
            ("Authorization", "Bearer sk-caller"),
            ("OpenAI-Organization", "org-1"),
            ("OpenAI-Project", "proj-1"),
            ("Connection", "keep-alive, X-Secret-Hop"),
            ("X-Secret-Hop", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Host", "gateway"),
            ("Content-Length", "10"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("X-Real-IP", "10.0.0.1"),
            ("Cookie", "a=b"),
            ("X-LLMGate-Cache", "no-store"),
            ("Content-Type", "application/json"),
            ("X-Stainless-Retry-Count", "0"),
        ],
        stream=True,
    )
    out = with_upstream_key(out, "sk-server", fallback_only=True)
    assert out == {
        "Authorization": "Bearer sk-caller",
        "OpenAI-Organization": "org-1",
        "OpenAI-Project": "proj-1",
        "Content-Type": "application/json",
        "X-Stainless-Retry-Count": "0",
        "Accept-Encoding": "identity",
    }


def test_server_key_only_for_callers_without_one() -> None:
    out = with_upstream_key(
        upstream_request_headers([], stream=False), "sk-server", fallback_only=True
    )
    assert out["Authorization"] == "Bearer sk-server"
    assert out["Accept-Encoding"] == "gzip, deflate"
    assert "Authorization" not in upstream_request_headers([], stream=False)


def test_downstream_keeps_provider_headers() -> None:
    kept = dict(
        downstream_headers(
            {
                "x-request-id": "req_1",
                "openai-processing-ms": "12",
                "x-ratelimit-remaining-tokens": "9",
                "retry-after-ms": "100",
                "retry-after": "1",
                "Content-Type": "application/json",
                "Content-Length": "99",
                "Content-Encoding": "gzip",
                "Transfer-Encoding": "chunked",
                "Connection": "keep-alive",
                "Set-Cookie": "__cf_bm=x",
                "Server": "cloudflare",
            }
        )
    )
    assert kept == {
        "x-request-id": "req_1",
        "openai-processing-ms": "12",
        "x-ratelimit-remaining-tokens": "9",
        "retry-after-ms": "100",
        "retry-after": "1",
        "Content-Type": "application/json",
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b"", "empty"), (b"{nope", "not valid JSON"), (b"[1]", "JSON object"), (b"\xff", "JSON")],
)
def test_parse_body_errors(raw: bytes, message: str) -> None:
    with pytest.raises(errors.BadRequest, match=message) as info:
        schema.parse_body(raw)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"model": "m", "messages": []}, "messages"),
        ("chat", {"model": "m", "messages": "hi"}, "messages"),
        ("chat", {"model": 3, "messages": [{}]}, "model"),
        ("chat", {"model": "m", "messages": [{}], "stream": "yes"}, "stream"),
        ("embeddings", {"model": "m"}, "input"),
        ("completions", {"model": "m"}, "prompt"),
        ("responses", {}, "model"),
    ],
)
def test_validate_names_the_parameter(route: str, body: dict, param: str) -> None:
    with pytest.raises(errors.BadRequest) as info:
        schema.validate(routes.of_name(route), body)
    assert info.value.param == param


def test_valid_bodies_pass() -> None:
    schema.validate(
        routes.CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    schema.validate(routes.PASSTHROUGH, {})
    assert schema.wants_stream({"stream": True}) and not schema.wants_stream({"stream": None})


def test_error_body_shape_and_retry_hint() -> None:
    exc = errors.UpstreamTimeout("idle", 120)
    body = exc.to_body()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert (exc.status, body["error"]["code"]) == (504, "idle_timeout")
    assert "idle" in body["error"]["message"]
    assert exc.response_headers()["x-should-retry"] == "false"
    assert "x-should-retry" not in errors.UpstreamUnreachable("x").response_headers()
    with pytest.raises(ValueError):
        errors.UpstreamTimeout("lunch", 1)


def test_upstream_error_bodies_keep_openai_json_and_wrap_the_rest() -> None:
    openai_body = b'{"error": {"message": "slow down", "type": "requests", "code": "rate"}}'
    assert errors.wrap_upstream_body(429, openai_body) is openai_body
    wrapped = json.loads(errors.wrap_upstream_body(502, b"<html>Bad Gateway</html>"))
    assert wrapped["error"]["type"] == "upstream_error"
    assert "Bad Gateway" in wrapped["error"]["message"]
