"""The files a stack with gateway keys reads, as the integration tests write them: a keys
file (LLMGATE_KEYS_FILE) and an upstreams file with a price table (LLMGATE_CONFIG)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from app.tenancy.keyring import hash_key


def keys_toml(keys: Iterable[tuple[str, str]], secret: Callable[[str], str]) -> str:
    """One [[keys]] table per (name, extra lines), its hash that of ``secret(name)``."""
    return "\n".join(
        f'[[keys]]\nname = "{name}"\nsha256 = "{hash_key(secret(name))}"\n{extra}\n'
        for name, extra in keys
    )


def priced_config(sim_url: str, *, version: str, price_in: float, price_out: float) -> str:
    """One upstream, ``sim``, and the price of its ``sim-model`` in USD per million tokens."""
    return f"""
[[upstreams]]
name = "sim"
base_url = "{sim_url}/v1"

[prices]
version = "{version}"
[prices.models."sim-model"]
input = {price_in}
output = {price_out}
"""
