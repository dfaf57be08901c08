"""The upstreams file of a gateway with one upstream of each kind, all on one simulator: the
model ``m-openai`` goes to an OpenAI-compatible upstream, ``m-anthropic`` to an Anthropic
one, ``m-gemini`` to a Gemini one (docs/providers.md). Used by the provider tests and
``python -m bench --only translation``."""

from __future__ import annotations

KINDS = ("openai", "anthropic", "gemini")
# The upstream's name for each kind, as X-LLMGate-Upstream says it.
NAMES = {"openai": "oai", "anthropic": "claude", "gemini": "gem"}


def kinds_toml(sim_url: str) -> str:
    """Three [[upstreams]] tables on the simulator at ``sim_url``, one per kind."""
    return f"""
[[upstreams]]
name = "oai"
base_url = "{sim_url}/v1"
models = ["m-openai"]

[[upstreams]]
name = "claude"
kind = "anthropic"
base_url = "{sim_url}/v1"
models = ["m-anthropic"]

[[upstreams]]
name = "gem"
kind = "gemini"
base_url = "{sim_url}/v1beta"
models = ["m-gemini"]
"""
