"""Whether a call is served through the cache, under which key and as the caller directs.
No I/O here: the request's facts in, a key and a directive out (or None: not cached).

The directive is the caller's: ``Cache-Control`` headers, then the body's ``cache`` object,
then the namespace checked against the deployment's (app/cache/policy.py). The key is the
tenant's (the gateway key's, or the caller's own credentials when keys are off or a namespace
is named), the upstreams serving its model (their serving id), and the body's canonical
form (app/cache/keys.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.cache import keys, policy
from app.cache.policy import Directive
from app.core.config import Settings
from app.request import schema
from app.request.body_readings import BodyReading
from app.request.headers import tenant_of
from app.request.routes import Route


@dataclass(frozen=True)
class CachePlan:
    key: str
    directive: Directive


# Plans a reading keeps (different queries, Cache-Control values or tenants of one body);
# past it they are made again.
MAX_PLANS = 16


def cache_plan(
    settings: Settings,
    *,
    route: Route,
    headers: list[tuple[str, str]],
    query: str,
    reading: BodyReading,
    upstream: Callable[[str | None], str],
    tenant: str | None,
) -> CachePlan | None:
    """The call's cache key and directive, or None when its route or body is not cached.
    ``reading``: its body's (app/request/body_readings.py), which keeps the plans made for
    it; ``upstream``: the serving id of the upstreams serving a model; ``tenant``: the gateway
    key's, when keys are on, else the caller's credentials decide it."""
    controls = tuple(v for k, v in headers if k.lower() == "cache-control")
    tenant = tenant if tenant is not None else tenant_of(headers)
    known = (query, controls, tenant)
    plans = reading.cache_plans
    if known in plans:
        planned: CachePlan | None = plans[known]
        return planned
    planned = _plan(settings, route, controls, query, reading, upstream, tenant)
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[known] = planned
    return planned


def _plan(
    settings: Settings,
    route: Route,
    controls: tuple[str, ...],
    query: str,
    reading: BodyReading,
    upstream: Callable[[str | None], str],
    tenant: str,
) -> CachePlan | None:
    body = reading.body
    if not policy.is_cacheable(route, body, settings.cache_mode):
        return None
    directive = policy.parse_cache_control(controls)
    directive = policy.apply_body_controls(directive, body.get("cache"))
    directive = policy.check_namespace(directive, settings.allowed_namespaces)
    if directive.namespace is not None:
        tenant = tenant_of((), namespace=directive.namespace)
    if reading.canonical is None:
        reading.canonical = keys.canonical_body(body)
    key = keys.cache_key(
        upstream=upstream(schema.model_of(body)),
        route=route.name,
        tenant=tenant,
        body=body,
        query=query,
        canonical=reading.canonical,
    )
    return CachePlan(key, directive)
