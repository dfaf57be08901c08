"""Which headers cross the gateway, each way. No I/O here.

Hop-by-hop headers (RFC 9110 7.6.1) never cross. Toward the upstream we also drop what
describes the client's connection to us (forwarding addresses, cookies) and our own controls,
so nothing about the caller leaks to the provider; toward the caller we drop what the WSGI
server sets itself and what we changed (length, encoding after decoding).

Who is calling, by the headers that say so, is a fact of the request too: ``tenant_of``, the
hash of them the cache keys answers by and resumable streams are owned by.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.errors import BadRequest

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)

# Headers that carry a credential the upstream checks: Authorization (OpenAI, most hosts),
# api-key (Azure OpenAI), x-api-key (several providers and proxies).
AUTH_HEADERS = ("authorization", "api-key", "x-api-key", "x-goog-api-key")
# Everything that says whose call this is. The cache tenant is a hash of these (tenant_of),
# so two callers share cache entries only when the upstream would see the same identity.
TENANT_HEADERS = (*AUTH_HEADERS, "openai-organization", "openai-project")
# A forwarded header with one of these in its name may carry a credential we do not know by
# name (a provider's own key header): it is keyed as part of the tenant too.
_CREDENTIAL_MARKERS = ("auth", "key", "token", "secret", "credential", "signature")


# Asked of every header of every cached call (its key's tenant, tenant_of), a cache
# hit's too: a few names recur, each answer is the name's alone, and the names remembered
# are bounded (a caller inventing names only pushes older ones out).
@functools.lru_cache(maxsize=1024)
def is_tenant_header(name: str) -> bool:
    """True for a header that identifies the caller to the upstream (keyed in the tenant)."""
    lower = name.lower()
    return lower in TENANT_HEADERS or any(marker in lower for marker in _CREDENTIAL_MARKERS)


def tenant_of(headers: Iterable[tuple[str, str]], *, namespace: str | None = None) -> str:
    """The cache tenant: an allowed shared namespace, else a hash of the caller's identity.

    The identity is every header the upstream could tell callers apart by (TENANT_HEADERS:
    Authorization, api-key, x-api-key, organisation, project, and any header named like a
    credential), so a caller never reads an answer made with someone else's key. The hash is
    salted with its purpose so a tenant id found in logs or keys cannot be compared against
    hashes of known keys made for anything else.
    """
    if namespace is not None:
        return "ns:" + namespace
    found = sorted(
        (name.lower(), value.strip()) for name, value in headers if is_tenant_header(name)
    )
    material = "\n".join(f"{name}={value}" for name, value in found)
    return "cred:" + hashlib.sha256(b"llmgate-tenant\n" + material.encode()).hexdigest()[:32]


# The header each answer says its cache outcome in (HIT, MISS, ...: app/cache/policy.py; a
# resume's RESUMED: app/resume/service.py).
STATUS_HEADER = "X-LLMGate-Cache"

_NOT_UPSTREAM = frozenset(
    {
        "host",
        "content-length",
        "accept-encoding",
        "cookie",
        "forwarded",
        "x-real-ip",
        "x-request-start",
        "expect",
    }
)
_NOT_UPSTREAM_PREFIXES = ("x-forwarded-", "x-llmgate-")

_BREAKS_A_LINE = frozenset("\r\n\x00")

_NOT_DOWNSTREAM = frozenset(
    {"content-length", "content-encoding", "set-cookie", "server", "date", "alt-svc"}
)
# Our own namespace: what the gateway tells its caller is made from its own facts
# (app/edge/finish.py), never taken from an upstream, which may be a gateway of this kind
# answering X-LLMGate-Cache: HIT for a call this one made and must bill.
OWN_PREFIX = "x-llmgate-"


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def upstream_request_headers(
    incoming: Iterable[tuple[str, str]], *, stream: bool
) -> dict[str, str]:
    """Headers for the upstream request, from the caller's headers. The upstream's own key
    (or the operator's fallback key) is added per upstream: ``with_upstream_key``."""
    incoming = list(incoming)
    drop = HOP_BY_HOP | _NOT_UPSTREAM | _connection_tokens(incoming)
    out: dict[str, str] = {}
    for name, value in incoming:
        lower = name.lower()
        if lower in drop or lower.startswith(_NOT_UPSTREAM_PREFIXES):
            continue
        if _BREAKS_A_LINE.intersection(value):
            # nginx and gunicorn refuse these on HTTP/1.1; whatever front end comes next,
            # a value forwarded with them would start a header line of the caller's own.
            raise BadRequest(
                f"The value of header {name!r} has a CR, LF or NUL character.",
                code="invalid_header_value",
            )
        out[name] = value
    # gzip on an event stream holds events back in compressor buffers: ask for identity.
    out["Accept-Encoding"] = "identity" if stream else "gzip, deflate"
    return out


def check_header_values(incoming: list[tuple[str, str]]) -> None:
    """BadRequest (400) for what ``upstream_request_headers`` refuses, without building the
    headers: a call answered from the cache sends none, yet is refused as one that goes
    upstream. Almost no call has a CR, LF or NUL anywhere, and one pass over all the values
    says so; one that does is judged by the builder itself (a header that never goes
    upstream may have one)."""
    values = "".join(value for _, value in incoming)
    if "\r" in values or "\n" in values or "\x00" in values:
        upstream_request_headers(incoming, stream=False)


def without_credentials(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` without the caller's identity (TENANT_HEADERS): with gateway keys the
    caller's key is the gateway's, and only an upstream's configured key may go upstream."""
    return {k: v for k, v in headers.items() if k.lower() not in TENANT_HEADERS}


def with_upstream_key(
    headers: dict[str, str], key: str, *, auth: str = "bearer", fallback_only: bool = False
) -> dict[str, str]:
    """``headers`` carrying an upstream's own key: in place of the caller's credential, or,
    with ``fallback_only``, only when the caller brought none (in any credential header)."""
    if not key:
        return headers
    if fallback_only and any(name.lower() in AUTH_HEADERS for name in headers):
        return headers
    out = {k: v for k, v in headers.items() if k.lower() not in AUTH_HEADERS}
    if auth == "bearer":
        out["Authorization"] = f"Bearer {key}"
    else:  # the header the upstream reads its key from: api-key (Azure), x-api-key, ...
        out[auth] = key
    return out


def downstream_headers(
    upstream: Mapping[str, str] | Iterable[tuple[str, str]],
) -> list[tuple[str, str]]:
    """The upstream's response headers that reach the caller (x-request-id, ratelimits, ...):
    not hop-by-hop ones, not those describing bytes we send otherwise, none of our own."""
    items = list(upstream.items()) if isinstance(upstream, Mapping) else list(upstream)
    drop = HOP_BY_HOP | _NOT_DOWNSTREAM | _connection_tokens(items)
    return [
        (k, v)
        for k, v in items
        if (low := k.lower()) not in drop and not low.startswith(OWN_PREFIX)
    ]


# WSGI environ keys and the header names they stand for, spelled as Werkzeug's
# EnvironHeaders spells them ("" for a key that is no header): the same few keys every call.
# Bounded: past it, a caller's made-up names are spelled each time instead of kept.
_ENVIRON_NAMES: dict[str, str] = {}
_ENVIRON_NAMES_MAX = 1024


def environ_headers(environ: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The request's headers as Werkzeug's ``EnvironHeaders(environ).items()`` lists them:
    the same names, values and order, at a fraction of its cost (it spells each name again
    on every call, through a generator)."""
    names = _ENVIRON_NAMES
    found = []
    for key, value in environ.items():
        name = names.get(key)
        if name is None:
            name = _environ_name(key)
            if len(names) < _ENVIRON_NAMES_MAX:
                names[key] = name
        # CONTENT_TYPE and CONTENT_LENGTH only when set; an HTTP_ header even when empty.
        if name and (value or key[0] == "H"):
            found.append((name, value))
    return found


def _environ_name(key: str) -> str:
    if key.startswith("HTTP_"):
        if key in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
            return ""  # the body's own, which the server gives as CONTENT_TYPE/_LENGTH
        return key[5:].replace("_", "-").title()
    if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        return key.replace("_", "-").title()
    return ""
