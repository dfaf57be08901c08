"""Cache and coalescing keys. No I/O here: a request in, a key string out.

A key is SHA-256 over a key version, the upstream it goes to, the endpoint, the tenant and the
canonical request body (sorted keys, no whitespace) without the fields that do not change the
answer. The tenant is a hash of the caller's credential (plus organisation and project), so
two API keys never share an entry; an operator may allow callers to name a shared namespace
instead. Keys are `llmgate:v1:<64 hex>`: valid Memcached keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

KEY_VERSION = "v1"
PREFIX = f"llmgate:{KEY_VERSION}:"

# Fields that change how an answer is delivered, or who asked, but not the answer itself.
# `stream` is among them on purpose: one stored answer serves both shapes.
IGNORED_FIELDS = frozenset({"stream", "stream_options", "user", "cache"})

_TENANT_HEADERS = ("authorization", "openai-organization", "openai-project")


def tenant_of(headers: Iterable[tuple[str, str]], *, namespace: str | None = None) -> str:
    """The cache tenant: an allowed shared namespace, else a hash of the caller's credential.

    The hash is salted with its purpose so a tenant id found in logs or keys cannot be
    compared against hashes of known keys made for anything else.
    """
    if namespace is not None:
        return "ns:" + namespace
    wanted = {name: "" for name in _TENANT_HEADERS}
    for name, value in headers:
        lower = name.lower()
        if lower in wanted:
            wanted[lower] = value.strip()
    material = "\n".join(f"{k}={v}" for k, v in wanted.items())
    return "cred:" + hashlib.sha256(b"llmgate-tenant\n" + material.encode()).hexdigest()[:32]


def canonical_body(body: Mapping[str, Any]) -> bytes:
    """The body as sorted, compact JSON without the fields that do not change the answer."""
    kept = {k: v for k, v in body.items() if k not in IGNORED_FIELDS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def cache_key(*, upstream: str, route: str, tenant: str, body: Mapping[str, Any]) -> str:
    digest = hashlib.sha256()
    for part in (KEY_VERSION.encode(), upstream.encode(), route.encode(), tenant.encode()):
        digest.update(len(part).to_bytes(4, "big") + part)  # length-prefixed: no ambiguity
    digest.update(canonical_body(body))
    return PREFIX + digest.hexdigest()


def lease_key(key: str) -> str:
    return key + ":lease"
