"""Whether a call is served through the cache, under which key and as the caller directs.
No I/O here: the request's facts in, a key and a directive out (or None: not cached).

The directive is the caller's: ``Cache-Control`` headers, then the body's ``cache`` object,
then the namespace checked against the deployment's (app/cache/policy.py). The key is the
tenant's (the gateway key's, or the caller's own credentials when keys are off or a namespace
is named), the upstream route's, and the body's canonical form (app/cache/keys.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.cache import keys, policy
from app.cache.policy import Directive
from app.core.config import Settings
from app.request.body_readings import BodyReading


@dataclass(frozen=True)
class CachePlan:
    key: str
    directive: Directive


def cache_plan(
    settings: Settings,
    *,
    route: str,
    headers: list[tuple[str, str]],
    query: str,
    reading: BodyReading,
    upstream: str,
    tenant: str | None,
) -> CachePlan | None:
    """The call's cache key and directive, or None when its route or body is not cached.
    ``reading``: its body's (app/request/body_readings.py), whose canonical form is kept there;
    ``upstream``: the route id of the upstreams serving its model; ``tenant``: the gateway
    key's, when keys are on."""
    body = reading.body
    if not policy.is_cacheable(route, body, settings.cache_mode):
        return None
    directive = policy.parse_cache_control(v for k, v in headers if k.lower() == "cache-control")
    directive = policy.apply_body_controls(directive, body.get("cache"))
    directive = policy.check_namespace(directive, settings.allowed_namespaces)
    if tenant is None or directive.namespace is not None:
        tenant = keys.tenant_of(headers, namespace=directive.namespace)
    if reading.canonical is None:
        reading.canonical = keys.canonical_body(body)
    key = keys.cache_key(upstream=upstream, route=route, tenant=tenant, body=body, query=query,
                         canonical=reading.canonical)  # fmt: skip
    return CachePlan(key, directive)
