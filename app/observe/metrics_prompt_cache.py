"""The provider prompt caches' metric: what each upstream's cache did with the prompt tokens
it was sent (docs/providers.md#prompt-caches). prometheus_client is imported here as in
app/observe/metrics.py, which builds it with one line."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

# What the provider's cache did with a prompt token (app/request/usage.py, PromptParts).
KINDS = ("read", "write", "uncached")


def prompt_cache_tokens(registry: CollectorRegistry) -> Counter:
    """``llmgate_prompt_cache_tokens_total{upstream,kind}``."""
    return Counter(
        "llmgate_prompt_cache_tokens_total",
        "Prompt tokens the upstream reported for calls it answered for this gateway, by what "
        "its prompt cache did with them: read (served from it), write (written to it: only "
        "Anthropic reports writes) or uncached; read over all three is its hit ratio.",
        ["upstream", "kind"],
        registry=registry,
    )
