"""The upstreams a gateway may call, and the order to try them in. No I/O here.

Where they come from: `LLMGATE_CONFIG` names a TOML file (read with the standard library's
``tomllib``) with one ``[[upstreams]]`` table per upstream; without it the environment's
`LLMGATE_UPSTREAM_URL` / `LLMGATE_UPSTREAM_API_KEY` make a single upstream named "default",
exactly as before the file existed. A wrong file is refused with the line and the field.

Which one answers: the upstreams that serve the request's model (``models``, ``*`` for any,
``aliases`` renaming a model for one upstream, e.g. an Azure deployment), those whose breaker
lets calls through first, best (lowest) ``priority`` first, and by ``weight`` within a
priority: for a call with an affinity key, the key's own order among them
(app/upstream/affinity.py: rendezvous hashing over the weights, by ``cache_group``, and a
bounded load), else at random (``candidates``). When every candidate's breaker is open they
are all tried anyway (as Envoy's panic threshold does): refusing every call would turn a
flapping upstream into a certain outage.

A ``cache_group`` names the upstreams that share one provider prompt cache (the same
account); without one, an upstream's group is its base URL and key.
"""

from __future__ import annotations

import functools
import hashlib
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.core.doors import ANTHROPIC
from app.core.tables import NAME, check_types
from app.dialects.continuation import DEFAULTS as CONTINUATION_DEFAULTS
from app.dialects.continuation import MODES as CONTINUATION_MODES
from app.dialects.continuation import OFF
from app.request.routes import Route
from app.tenancy import prices
from app.upstream.hedge import HedgePolicy

AUTH_STYLES = ("bearer", "api-key", "x-api-key", "x-goog-api-key")
# The dialect an upstream speaks (app/dialects/), and the header its key goes in by default.
KINDS = {"openai": "bearer", "anthropic": "x-api-key", "gemini": "x-goog-api-key"}
# How the 404 of a route no configured kind serves names the kinds.
_KIND_NAMES = {"openai": "OpenAI-compatible", "anthropic": "Anthropic", "gemini": "Gemini"}


def kind_speaks(kind: str, route: Route, path: str = "") -> bool:
    """Whether an upstream of ``kind`` can answer a call of ``route`` at ``path`` (below
    /v1): a kind among the route's (app/request/routes.py: an OpenAI-compatible one any
    route but count_tokens, the others the doors the gateway translates, Anthropic's own
    count_tokens), and an Anthropic one the rest of /v1/messages, forwarded as it is."""
    if kind in route.kinds:
        return True
    return route.forwarded and kind == ANTHROPIC and path.startswith("/messages/")


def served_by(route: Route, path: str = "") -> str:
    """Which kinds serve ``route`` at ``path``, in words, for the 404 of a call that none of
    the configured upstreams can answer."""
    kinds = [kind for kind in KINDS if kind_speaks(kind, route, path)]
    said = f"only {' and '.join(_KIND_NAMES[kind] for kind in kinds)} upstreams serve it"
    if kinds == ["openai"]:
        said += "; Anthropic and Gemini ones serve chat and messages"
    return said


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "kind": str,
    "max_tokens": int,
    "base_url": str,
    "key": str,
    "key_env": str,
    "auth": str,
    "headers": dict,
    "query": dict,
    "weight": (int, float),
    "priority": int,
    "models": list,
    "aliases": dict,
    "max_connections": int,
    "hedge_after": (int, float, str),
    "hedge_min_ms": (int, float),
    "hedge_max_ms": (int, float),
    "continuation": str,
    "continues_models": list,
    "hold_tool_calls": bool,
    "prompt_cache": str,
    "cache_group": str,
}
# ``prompt_cache``: "auto" places cache breakpoints for an Anthropic upstream and sets
# ``prompt_cache_key`` for an OpenAI one (app/upstream/prompt_cache.py); "off" sends the
# caller's request as it is.
PROMPT_CACHE = ("off", "auto")


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file, line and field."""


# How a table's check reports a field: fail(field, why) is the ConfigError to raise.
_Fail = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class UpstreamSpec:
    name: str
    base_url: str  # with its version path; may hold {model} (Azure deployment URLs)
    key: str = field(default="", repr=False)  # never printed: it is a secret
    # True: the key is sent only for callers that bring no credential of their own (the
    # environment's LLMGATE_UPSTREAM_API_KEY). False: the key replaces the caller's.
    key_fallback: bool = False
    auth: str = "bearer"
    headers: tuple[tuple[str, str], ...] = ()
    query: tuple[tuple[str, str], ...] = ()
    weight: float = 1.0
    priority: int = 0
    models: tuple[str, ...] = ("*",)
    aliases: tuple[tuple[str, str], ...] = ()
    max_connections: int = 0  # 0: LLMGATE_POOL_SIZE
    # Streams sent here first may get a backup (app/upstream/hedge.py).
    hedge: HedgePolicy | None = None
    kind: str = "openai"  # the dialect it speaks: openai, anthropic or gemini (KINDS)
    # The output bound sent to an Anthropic upstream for a call that names none: its API
    # requires one, and a model's own ceiling is not known here.
    max_tokens: int = 4096
    continuation: str = OFF  # how it continues a cut stream (dialects/continuation.py)
    hold_tool_calls: bool = False  # its streams' tool calls held until whole (upstream/hold.py)
    continues_models: tuple[str, ...] = ()  # other models' answers it continues (``continues``)
    prompt_cache: str = "off"  # PROMPT_CACHE
    cache_group: str = ""  # "": its base URL and key (``group``)

    @functools.cached_property
    def group(self) -> str:
        """The provider prompt cache it shares with others: its ``cache_group``, else its base
        URL and a digest of its key (two keys of one account are one group only when the
        file says so)."""
        if self.cache_group:
            return "group:" + self.cache_group
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:16] if self.key else ""
        return f"url:{self.base_url} {digest}"

    def speaks(self, route: Route, path: str = "") -> bool:
        """Whether this upstream can answer a call of ``route`` at ``path`` (below /v1):
        ``kind_speaks``."""
        return kind_speaks(self.kind, route, path)

    def serves(self, model: str | None) -> bool:
        if model is None or "*" in self.models:
            return True
        return model in self.models or any(model == alias for alias, _ in self.aliases)

    def continues(self, model: str | None) -> bool:
        """Whether this upstream may continue an answer of ``model``: it has a way to, and it
        serves that model, or the file lets it continue that model's answers with its own
        (``continues_models``)."""
        return self.continuation != OFF and (self.serves(model) or model in self.continues_models)

    def continued_as(self, model: str | None) -> str | None:
        """The model it continues ``model``'s answer with: that one, else its own first."""
        return model if self.serves(model) else self.models[0]

    def model_for(self, model: str) -> str:
        """The model's name at this upstream (an alias, or the name as asked)."""
        return dict(self.aliases).get(model, model)

    @property
    def host(self) -> tuple[str, int]:
        parts = urlsplit(self.base_url.replace("{model}", "m"))
        return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def from_environment(upstream_url: str, api_key: str) -> list[UpstreamSpec]:
    """Today's single upstream, from LLMGATE_UPSTREAM_URL and LLMGATE_UPSTREAM_API_KEY."""
    return [UpstreamSpec("default", upstream_url.rstrip("/"), key=api_key, key_fallback=True)]


def load(text: str, environ: Mapping[str, str], *, path: str = "config") -> list[UpstreamSpec]:
    """The upstreams of a config file's text, or ConfigError naming the line and field (its
    ``[prices]`` table is checked too: ``prices_of`` reads it)."""
    doc = _parse(text, path)
    unknown = set(doc) - {"upstreams", "prices"}
    if unknown:
        name = sorted(unknown)[0]
        raise ConfigError(f"{path}:{_line_of(text, name)}: unknown section or key {name!r}")
    tables = doc.get("upstreams")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{path}: no [[upstreams]] table: at least one upstream is needed")
    specs = [_spec(table, i, text, environ, path) for i, table in enumerate(tables)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            where = _line_of(text, "name", table=i)
            raise ConfigError(f"{path}:{where}: upstreams.name {spec.name!r} is used twice")
        seen.add(spec.name)
    prices_of(text, path=path, doc=doc)
    return specs


def prices_of(
    text: str, *, path: str = "config", doc: dict[str, Any] | None = None
) -> prices.PriceTable | None:
    """The config file's price table (app/tenancy/prices.py), None when it has none."""
    doc = _parse(text, path) if doc is None else doc
    if "prices" not in doc:
        return None

    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}:{_line_of(text, key.rpartition('.')[2])}: {key} {why}")

    return prices.load(doc["prices"], fail)


def _parse(text: str, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _spec(
    table: dict[str, Any], index: int, text: str, environ: Mapping[str, str], path: str
) -> UpstreamSpec:
    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}:{_line_of(text, key, table=index)}: upstreams.{key} {why}")

    check_types(table, _FIELDS, fail)
    for required in ("name", "base_url"):
        if required not in table:
            where = _line_of(text, "[[upstreams]]", table=index, header=True)
            raise ConfigError(f"{path}:{where}: upstreams.{required} is missing")
    name, base_url = table["name"], table["base_url"].rstrip("/")
    if not NAME.match(name):
        raise fail("name", "must be 1-63 of a-z 0-9 _ . - (it is a metrics label)")
    parts = urlsplit(base_url.replace("{model}", "m"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail("base_url", f"must be an http(s) URL, got {base_url!r}")
    if "key" in table and "key_env" in table:
        raise fail("key_env", "and upstreams.key are both set: choose one")
    key = _key(table, environ, fail)
    kind = table.get("kind", "openai")
    if kind not in KINDS:
        raise fail("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    if table.get("max_tokens", 1) < 1:
        raise fail("max_tokens", "must be >= 1")
    auth = table.get("auth", KINDS[kind])
    if auth not in AUTH_STYLES:
        raise fail("auth", f"must be one of {', '.join(AUTH_STYLES)}, got {auth!r}")
    weight = float(table.get("weight", 1.0))
    if weight <= 0:
        raise fail("weight", "must be > 0")
    if table.get("max_connections", 0) < 0:
        raise fail("max_connections", "must be >= 0")
    models = table.get("models", ["*"])
    if not models or not all(isinstance(m, str) and m for m in models):
        raise fail("models", 'must be a non-empty list of model names (or ["*"])')
    hedge = _hedge(table, fail)
    pairs = _string_pairs(table, fail)
    mode = table.get("continuation", CONTINUATION_DEFAULTS[kind])
    if mode not in CONTINUATION_MODES[kind]:
        modes = ", ".join(CONTINUATION_MODES[kind])
        raise fail("continuation", f"of a {kind} upstream must be one of {modes}, got {mode!r}")
    _continues_models(table, mode, models, fail)
    if table.get("prompt_cache", "off") not in PROMPT_CACHE:
        raise fail("prompt_cache", f"must be off or auto, got {table['prompt_cache']!r}")
    if "cache_group" in table and not NAME.match(table["cache_group"]):
        raise fail("cache_group", "must be 1-63 of a-z 0-9 _ . -")
    return UpstreamSpec(
        name=name,
        base_url=base_url,
        key=key,
        auth=auth,
        headers=pairs["headers"],
        query=pairs["query"],
        weight=weight,
        priority=table.get("priority", 0),
        models=tuple(models),
        aliases=pairs["aliases"],
        max_connections=table.get("max_connections", 0),
        hedge=hedge,
        kind=kind,
        max_tokens=table.get("max_tokens", 4096),
        continuation=mode,
        continues_models=tuple(table.get("continues_models", ())),
        hold_tool_calls=table.get("hold_tool_calls", False),
        prompt_cache=table.get("prompt_cache", "off"),
        cache_group=table.get("cache_group", ""),
    )


def _continues_models(table: dict[str, Any], mode: str, models: list[str], fail: _Fail) -> None:
    """``continues_models``: names, for an upstream that continues and names its models."""
    if "continues_models" not in table:
        return
    names = table["continues_models"]
    if not names or not all(isinstance(m, str) and m for m in names):
        raise fail("continues_models", "must be a non-empty list of model names")
    if mode == OFF:
        raise fail("continues_models", "needs upstreams.continuation (it continues nothing)")
    if "*" in models:  # it serves every model: it continues them all already
        raise fail("continues_models", 'is for an upstream with named models, not ["*"]')


def _key(table: dict[str, Any], environ: Mapping[str, str], fail: _Fail) -> str:
    """The upstream's key: written in the file, or read from the variable ``key_env`` names."""
    key: str = table.get("key", "")
    if "key_env" in table:
        key = environ.get(table["key_env"], "")
        if not key:
            raise fail("key_env", f"names {table['key_env']!r}, which is not set or empty")
    return key


def _hedge(table: dict[str, Any], fail: _Fail) -> HedgePolicy | None:
    """The upstream's hedging, None when ``hedge_after`` is not set (its bounds alone are a
    mistake: they would do nothing)."""
    if "hedge_after" in table:
        try:
            return HedgePolicy.parse(
                table["hedge_after"], table.get("hedge_min_ms", 50), table.get("hedge_max_ms", 2000)
            )
        except ValueError as exc:
            raise fail("hedge_after", str(exc)) from None
    if "hedge_min_ms" in table or "hedge_max_ms" in table:
        key_name = "hedge_min_ms" if "hedge_min_ms" in table else "hedge_max_ms"
        raise fail(key_name, "needs upstreams.hedge_after (hedging is off without it)")
    return None


def _string_pairs(table: dict[str, Any], fail: _Fail) -> dict[str, tuple[tuple[str, str], ...]]:
    """The headers, query and aliases tables as sorted (name, value) pairs: strings, and no
    CR or LF to split a header line."""
    pairs = {}
    for key_name in ("headers", "query", "aliases"):
        values = table.get(key_name, {})
        if not all(isinstance(v, str) for v in values.values()):
            raise fail(key_name, "values must be strings")
        if any(("\r" in k + v or "\n" in k + v) for k, v in values.items()):
            raise fail(key_name, "must not hold CR or LF")
        pairs[key_name] = tuple(sorted(values.items()))
    return pairs


def _line_of(text: str, key: str, *, table: int | None = None, header: bool = False) -> int:
    """The 1-based line of ``key`` (in the ``table``-th [[upstreams]] table), best effort:
    tomllib reports syntax errors with their line, not where a valid value sits."""
    lines = text.splitlines()
    start = 0
    if table is not None:
        headers = [i for i, line in enumerate(lines) if line.strip() == "[[upstreams]]"]
        if table < len(headers):
            start = headers[table]
            if header:
                return start + 1
    pattern = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*=|^\s*\[+\s*{re.escape(key)}\b")
    for i in range(start, len(lines)):
        if i > start and table is not None and lines[i].strip() == "[[upstreams]]":
            break
        if pattern.match(lines[i]):
            return i + 1
    return start + 1


def candidates(
    specs: Sequence[UpstreamSpec],
    model: str | None,
    *,
    allowed: Callable[[str], bool],
    rand: Callable[[], float],
) -> list[UpstreamSpec]:
    """The upstreams to try for ``model``, in order (see the module docstring); ``specs``
    are those that speak the call's route (``UpstreamSpec.speaks``)."""
    serving = [s for s in specs if s.serves(model)]
    usable = [s for s in serving if allowed(s.name)] or serving  # panic: try them all
    ordered: list[UpstreamSpec] = []
    for priority in sorted({s.priority for s in usable}):
        ordered += _weighted_order([s for s in usable if s.priority == priority], rand)
    return ordered


def _weighted_order(group: list[UpstreamSpec], rand: Callable[[], float]) -> list[UpstreamSpec]:
    """Weighted sampling without replacement: heavier upstreams tend to come first."""
    left = list(group)
    out = []
    while left:
        total = sum(s.weight for s in left)
        point = rand() * total
        for i, spec in enumerate(left):
            point -= spec.weight
            if point < 0 or i == len(left) - 1:
                out.append(left.pop(i))
                break
    return out


def serving_id(specs: Sequence[UpstreamSpec], model: str | None) -> str:
    """What a cache key names as "the upstream": every base URL that may answer ``model``,
    so a config change that sends the model elsewhere does not serve old answers."""
    return ",".join(sorted(s.base_url for s in specs if s.serves(model)))
