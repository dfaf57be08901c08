"""What may be cached, for how long, and what the caller asked for. No I/O here.

Modes (`LLMGATE_CACHE_MODE`): `off`; `deterministic` (the default: only answers that are meant
to repeat — `temperature` 0, a `seed`, or embeddings); `all`. A Responses API call is a
candidate only when it keeps no state at the provider: `store: false` (the API's default is
`true`: a stored response has an id the caller may fetch or continue from, and a replay would
hand out the id of someone else's call), no `background` run and no `conversation`.
Per-request controls are the ones users already know: the standard `Cache-Control` request
header (`no-cache`, `no-store`, `max-age=N`, `s-maxage=N`) and LiteLLM's body object
`cache: {ttl, no-cache, no-store, s-maxage, namespace}`, which is removed before the body
goes upstream.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.core.errors import BadRequest
from app.request.routes import Route

MODES = ("off", "deterministic", "all")
# Memcached reads a TTL above 30 days as an absolute Unix time.
MAX_TTL_S = 30 * 24 * 3600 - 1

HIT, MISS, BYPASS, REFRESH, COALESCED = "HIT", "MISS", "BYPASS", "REFRESH", "COALESCED"


@dataclass(frozen=True)
class Directive:
    lookup: bool = True  # False: `no-cache`, skip the lookup and refresh the entry
    store: bool = True  # False: `no-store`
    ttl: int | None = None  # `max-age` / `cache.ttl`: this entry's lifetime
    max_age: float | None = None  # `s-maxage`: accept an entry at most this many seconds old
    namespace: str | None = None  # a shared tenant, if the operator allows it

    @property
    def status_on_miss(self) -> str:
        return MISS if self.lookup else REFRESH


def is_cacheable(route: Route, body: Mapping[str, Any], mode: str) -> bool:
    """Whether a call's answer may be kept: its route's (``cacheable``; a ``stateful`` one's
    only when the call leaves no state behind), in the mode's measure: every body (``all``,
    or a ``deterministic`` route), or those asking for a repeatable answer."""
    if mode == "off" or not route.cacheable:
        return False
    if route.stateful and not is_stateless_response(body):
        return False
    if mode == "all" or route.deterministic:
        return True
    return body.get("temperature") == 0 or body.get("seed") is not None


def is_stateless_response(body: Mapping[str, Any]) -> bool:
    """A Responses call that leaves nothing behind at the provider (see the module doc)."""
    return (
        body.get("store") is False
        and body.get("background") in (None, False)
        and body.get("conversation") is None
    )


def _seconds(value: Any, what: str) -> int:
    # JSON's 1e999 is infinity to Python and NaN is accepted too: int() of either raised.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise BadRequest(f"Invalid cache control {what}: expected seconds >= 0.", param="cache")
    # Nothing lives longer than Memcached's longest TTL; a larger number means the same.
    return int(min(value, MAX_TTL_S))


def parse_cache_control(header_values: Iterable[str]) -> Directive:
    """The request's `Cache-Control` header(s); unknown or malformed directives are ignored
    (RFC 9111 5.2: a cache ignores directives it does not understand)."""
    directive = Directive()
    for value in header_values:
        for item in value.split(","):
            name, _, arg = item.strip().partition("=")
            name = name.strip().lower()
            arg = arg.strip().strip('"')
            if name == "no-cache":
                directive = replace(directive, lookup=False)
            elif name == "no-store":
                directive = replace(directive, store=False)
            elif name in ("max-age", "s-maxage") and arg.isascii() and arg.isdigit():
                # ASCII only: str.isdigit() takes '²', which int() refuses; and int() refuses
                # more than 4,300 digits, long past Memcached's longest TTL anyway.
                seconds = min(int(arg.lstrip("0")[:12] or "0"), MAX_TTL_S)
                if name == "max-age":
                    # max-age=0: the caller wants nothing kept.
                    directive = replace(
                        directive, ttl=seconds, store=directive.store and seconds > 0
                    )
                else:
                    directive = replace(directive, max_age=float(seconds))
    return directive


def apply_body_controls(directive: Directive, controls: Any) -> Directive:
    """LiteLLM's `cache` object on top of the header's directive (the body wins)."""
    if controls is None:
        return directive
    if not isinstance(controls, dict):
        raise BadRequest("Invalid value for 'cache': expected an object.", param="cache")
    if controls.get("no-cache") is True:
        directive = replace(directive, lookup=False)
    if controls.get("no-store") is True:
        directive = replace(directive, store=False)
    if "ttl" in controls:
        ttl = _seconds(controls["ttl"], "'ttl'")
        directive = replace(directive, ttl=ttl, store=directive.store and ttl > 0)
    if "s-maxage" in controls:
        directive = replace(directive, max_age=float(_seconds(controls["s-maxage"], "'s-maxage'")))
    if "namespace" in controls:
        namespace = controls["namespace"]
        if not isinstance(namespace, str) or not namespace or len(namespace) > 64:
            raise BadRequest("Invalid cache 'namespace': 1-64 characters.", param="cache")
        directive = replace(directive, namespace=namespace)
    return directive


def check_namespace(directive: Directive, allowed: frozenset[str]) -> Directive:
    """A namespace shares answers across credentials: only those the operator listed."""
    if directive.namespace is None:
        return directive
    if "*" in allowed or directive.namespace in allowed:
        return directive
    raise BadRequest(
        f"Cache namespace {directive.namespace!r} is not allowed on this gateway "
        "(LLMGATE_CACHE_NAMESPACES).",
        param="cache",
        code="cache_namespace_not_allowed",
    )


def entry_ttl(
    directive: Directive, base: int, spread: int, rand: Callable[[], float] = random.random
) -> int:
    """The entry's lifetime: the caller's max-age as asked, else base plus a random spread
    (so entries written together do not expire together), within Memcached's limit."""
    if directive.ttl is not None:
        return max(1, min(directive.ttl, MAX_TTL_S))
    return max(1, min(base + int(rand() * (spread + 1)), MAX_TTL_S))


def refresh_early(
    *,
    now: float,
    expires: float,
    compute_s: float,
    beta: float,
    rand: Callable[[], float] = random.random,
) -> bool:
    """XFetch (Vattani et al., "Optimal Probabilistic Cache Stampede Prevention", 2015):
    recompute when ``now - compute_s * beta * ln(rand) >= expires``. Entries that took long
    to compute, or are close to expiry, are renewed first; beta 0 never refreshes early."""
    if beta <= 0:
        return False
    return now - compute_s * beta * math.log(max(rand(), 1e-300)) >= expires


def acceptable_age(directive: Directive, age: float) -> bool:
    return directive.max_age is None or age <= directive.max_age
