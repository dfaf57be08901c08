"""The v1 cache key format, pinned (app/cache/keys.py).

Keys live in a Memcached shared by every worker and every gateway instance, including two
releases side by side during a rolling deploy. So the bytes of a `llmgate:v1:` key are a
contract: a release that computes them differently must bump KEY_VERSION, or old and new
instances silently stop sharing (or, worse, start mixing) entries. The format, as documented
here and in app/cache/keys.py:

- canonical body: the request body without `stream`, `stream_options`, `user` and `cache`,
  as JSON with sorted keys, no insignificant whitespace and non-ASCII text as UTF-8 (the
  RFC 8785 / JCS choices); a lone surrogate (json.loads makes one of an escaped `\\ud800`)
  as the three bytes UTF-8 would give it were it allowed (Python's `surrogatepass`);
- tenant: `ns:<namespace>` for an allowed shared namespace, else `cred:` and the first 32
  hex digits of SHA-256 over `llmgate-tenant\\n` and the caller's identity headers as
  `name=value` lines (name lower-cased, value trimmed, lines sorted, joined by LF);
- key: `llmgate:v1:` and the SHA-256 hex of the key version, upstream, route, tenant and
  query string, each UTF-8 and prefixed by its length as 4 big-endian bytes, then the
  canonical body; the lease of a key is the key plus `:lease`.
"""

from __future__ import annotations

import hashlib
import json
import struct

from app.cache import keys
from app.request.headers import tenant_of

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "été"}],
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
    "user": "u",
    "cache": {"ttl": 5},
}
CANONICAL = '{"messages":[{"content":"été","role":"user"}],"model":"m","temperature":0}'


def _expected_tenant(lines: list[str]) -> str:
    material = "\n".join(sorted(lines)).encode()
    return "cred:" + hashlib.sha256(b"llmgate-tenant\n" + material).hexdigest()[:32]


def _expected_key(upstream: str, route: str, tenant: str, query: str) -> str:
    digest = hashlib.sha256()
    for part in ("v1", upstream, route, tenant, query):
        data = part.encode("utf-8")
        digest.update(struct.pack(">I", len(data)) + data)
    digest.update(CANONICAL.encode("utf-8"))
    return "llmgate:v1:" + digest.hexdigest()


def test_canonical_body_is_sorted_compact_utf8_json_without_delivery_fields() -> None:
    assert keys.canonical_body(BODY) == CANONICAL.encode("utf-8")


def test_a_namespace_tenant_is_its_name() -> None:
    assert tenant_of([("Authorization", "Bearer k")], namespace="docs") == "ns:docs"


def test_a_credential_tenant_is_a_salted_hash_of_the_identity_headers() -> None:
    sent = [
        ("OpenAI-Project", " p1 "),
        ("Authorization", "Bearer sk-a"),
        ("X-Request-ID", "not an identity"),
        ("X-Goog-Api-Key", "g"),
    ]
    expected = _expected_tenant(
        ["openai-project=p1", "authorization=Bearer sk-a", "x-goog-api-key=g"]
    )
    assert tenant_of(sent) == expected
    assert tenant_of([]) == _expected_tenant([])


def test_the_key_is_the_length_prefixed_digest_of_its_parts_and_the_body() -> None:
    tenant = tenant_of([("Authorization", "Bearer sk-a")])
    key = keys.cache_key(
        upstream="https://api.example/v1", route="chat", tenant=tenant, body=BODY, query="a=1"
    )
    assert key == _expected_key("https://api.example/v1", "chat", tenant, "a=1")


def test_no_query_string_is_the_empty_query_string() -> None:
    key = keys.cache_key(upstream="u", route="chat", tenant="ns:t", body=BODY)
    assert key == _expected_key("u", "chat", "ns:t", "")
    assert key == keys.cache_key(upstream="u", route="chat", tenant="ns:t", body=BODY, query="")


def test_a_callers_kept_parts_give_the_same_keys_and_stay_bounded(monkeypatch) -> None:
    """The parts' digest is kept per caller (app/cache/keys.py ``_PARTS``): every key made
    from a kept one is still the pinned format, and no more than the bound are kept."""
    monkeypatch.setattr(keys, "_PARTS", {})
    monkeypatch.setattr(keys, "_PARTS_MAX", 3)
    for _ in range(3):  # first made, then from the kept digest, then after evictions
        for i in range(5):
            tenant, query = f"ns:t{i}", "a=1" if i % 2 else ""
            key = keys.cache_key(upstream="u", route="chat", tenant=tenant, body=BODY, query=query)
            assert key == _expected_key("u", "chat", tenant, query)
            assert len(keys._PARTS) <= 3
    assert keys.cache_key(upstream="u", route="chat", tenant="ns:t4", body={"model": "m"}) != key


def test_the_lease_key_is_the_key_with_a_lease_suffix() -> None:
    assert keys.lease_key("llmgate:v1:ab") == "llmgate:v1:ab:lease"


def test_a_lone_surrogate_in_the_body_has_a_key_of_its_own() -> None:
    # json.loads turns the escape "\ud800" into a str no UTF-8 text can hold; the body is a
    # valid request all the same (the upstream judges it), so it gets a key, and not the key
    # of a body that replaced the surrogate with something encodable.
    lone = json.loads('{"model": "m", "prompt": "a\\ud800b"}')
    assert keys.canonical_body(lone) == b'{"model":"m","prompt":"a\xed\xa0\x80b"}'
    others = [{"model": "m", "prompt": p} for p in ("a\ufffdb", "a?b", "ab", "a\\ud800b")]
    key = keys.cache_key(upstream="u", route="completions", tenant="ns:t", body=lone)
    assert key not in {
        keys.cache_key(upstream="u", route="completions", tenant="ns:t", body=other)
        for other in others
    }
