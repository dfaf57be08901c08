"""What a span says about an upstream: its address, its provider, an attempt at it. No I/O
here; the spans themselves are app/observe/tracing.py's."""

from __future__ import annotations

from collections.abc import Iterable

from app.observe.tracing import MAX_NAME, Value
from app.upstream.catalog import UpstreamSpec

# gen_ai.provider.name of the upstreams that speak another provider's dialect.
_PROVIDERS = {"anthropic": "anthropic", "gemini": "gcp.gemini"}


def provider_name(spec: UpstreamSpec) -> str:
    """gen_ai.provider.name of an upstream: by the dialect it speaks (its ``kind``); for an
    OpenAI-compatible one, Azure OpenAI when it takes an ``api-key`` header, else
    ``openai``."""
    if spec.kind in _PROVIDERS:
        return _PROVIDERS[spec.kind]
    return "azure.ai.openai" if spec.auth == "api-key" else "openai"


def upstream_attributes(spec: UpstreamSpec) -> dict[str, Value]:
    """Where an upstream is: the GenAI server's address and port, its configured name."""
    host, port = spec.host
    return {
        "server.address": host,
        "server.port": port,
        "gen_ai.provider.name": provider_name(spec),
        "llmgate.upstream": spec.name,
    }


def attempt_attributes(
    spec: UpstreamSpec, method: str, model: str | None, attempt: int, hedge: bool
) -> dict[str, Value | None]:
    """An upstream attempt's CLIENT span: the upstream, the model by its name there (an
    alias renamed), the attempt's number, whether it is a hedge's backup."""
    return {
        **upstream_attributes(spec),
        "http.request.method": method,
        "gen_ai.request.model": spec.model_for(model)[:MAX_NAME] if model else None,
        "llmgate.attempt": attempt,
        "llmgate.hedge": True if hedge else None,
    }


def whereabouts(specs: Iterable[UpstreamSpec], name: str) -> dict[str, Value]:
    """Where the upstream named ``name`` is, for the span of a request it answered (its own
    attempt's, or its leader's); nothing for a name no upstream has."""
    spec = next((spec for spec in specs if spec.name == name), None)
    return {} if spec is None else upstream_attributes(spec)
