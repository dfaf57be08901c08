"""Cache and coalescing keys. No I/O here: a request in, a key string out.

A key is SHA-256 over a key version, the upstream it goes to, the endpoint, the tenant, the
query string and the canonical request body (sorted keys, no whitespace) without the fields
that do not change the answer. The tenant is a hash of every credential header the upstream
sees (plus organisation and project: app/request/headers.py ``tenant_of``), so two API keys
never share an entry; an operator may allow callers to name a shared namespace instead. Keys
are `llmgate:v1:<64 hex>`: valid Memcached keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

KEY_VERSION = "v1"
PREFIX = f"llmgate:{KEY_VERSION}:"

# Fields that change how an answer is delivered, or who asked, but not the answer itself.
# `stream` is among them on purpose: one stored answer serves both shapes.
IGNORED_FIELDS = frozenset({"stream", "stream_options", "user", "cache"})
# One encoder, built once: json.dumps builds one for each call given any option.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# The digest of a key's parts before its body, by parts: a caller's calls share them, so
# they are hashed once and the hash's state copied (the copy is the state, not the work).
# Oldest first; past the bound the oldest is dropped.
_PARTS: dict[tuple[str, str, str, str], Any] = {}
_PARTS_MAX = 1024


def canonical_body(body: Mapping[str, Any]) -> bytes:
    """The body as sorted, compact JSON without the fields that do not change the answer."""
    kept = {k: v for k, v in body.items() if k not in IGNORED_FIELDS}
    text = _CANONICAL.encode(kept)
    # json.loads turns an escaped lone surrogate ("\ud800") into a str UTF-8 cannot encode;
    # surrogatepass gives it bytes no valid text has, so the key stays one-to-one.
    return text.encode("utf-8", "surrogatepass")


def cache_key(
    *,
    upstream: str,
    route: str,
    tenant: str,
    body: Mapping[str, Any],
    query: str = "",
    canonical: bytes | None = None,
) -> str:
    """The key of one answer. The query string is part of it: it goes upstream too (and some
    callers put a key there). ``canonical``: ``canonical_body(body)``, when already made."""
    parts = (upstream, route, tenant, query)
    prefix = _PARTS.get(parts)
    if prefix is None:
        prefix = hashlib.sha256()
        for part in (p.encode() for p in (KEY_VERSION, *parts)):
            prefix.update(len(part).to_bytes(4, "big") + part)  # length-prefixed: no ambiguity
        if len(_PARTS) >= _PARTS_MAX:
            _PARTS.pop(next(iter(_PARTS)), None)
        _PARTS[parts] = prefix
    digest = prefix.copy()
    digest.update(canonical_body(body) if canonical is None else canonical)
    return PREFIX + digest.hexdigest()


def lease_key(key: str) -> str:
    return key + ":lease"
