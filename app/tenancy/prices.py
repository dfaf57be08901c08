"""What a call costs: the price table of the config file, per model. No I/O here.

``LLMGATE_CONFIG``'s file may hold a ``[prices]`` table; every call then gets a cost in its
log line, every gateway key a cost counter, and keys may have budgets in money
(``usd_per_day``, ``usd_per_month``) reserved and settled like token budgets::

    [prices]
    version = "openai-2026-11"        # named in every receipt; change it with the prices
    [prices.models."gpt-4o-mini"]     # the model as callers name it; "*": any other model
    input = 0.15                      # USD per million prompt tokens
    cached_input = 0.075              # USD per million cached prompt tokens (default: input)
    cache_write = 0.15                # USD per million prompt tokens written to the provider's
                                      # cache (Anthropic's 5-minute writes; default: input)
    cache_write_1h = 0.15             # its 1-hour writes (default: cache_write)
    output = 0.60                     # USD per million output tokens (reasoning included)
    max_output_tokens = 16384         # the model's ceiling, for budgets (app/request/bounds.py)

Money is counted in integer picodollars (10^-12 USD): a price per million tokens with up
to six decimals is a whole number of picodollars per token, so sums are exact and the
shared counters (Memcached ``incr``, 64-bit) hold up to about 18 million dollars.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from app.request.usage import Usage

PICO_PER_USD = 10**12
_PER_TOKEN = 10**6  # picodollars per token in one USD per million tokens
_FIELDS = {"input", "cached_input", "cache_write", "cache_write_1h", "output", "max_output_tokens"}


@dataclass(frozen=True)
class Price:
    """One model's prices, in picodollars per token."""

    input: int
    cached_input: int
    output: int
    max_output_tokens: int = 0  # 0: not given (LLMGATE_DEFAULT_MAX_OUTPUT_TOKENS applies)
    # Prompt tokens written to the provider's prompt cache: Anthropic's 5-minute and 1-hour
    # writes (1.25x and 2x its input price); -1: the input price (a provider that charges
    # nothing apart for a write, as OpenAI and Gemini), and the 1-hour ones the 5-minute's.
    cache_write: int = -1
    cache_write_1h: int = -1

    def cost(self, usage: Usage) -> int:
        """What ``usage`` (any API's, as the provider sent it) costs: each prompt token once,
        at the price of what the provider's cache did with it (app/request/usage.py)."""
        parts = usage.prompt_parts()
        _, output, _ = usage.billable()
        write = self.input if self.cache_write < 0 else self.cache_write
        hour = write if self.cache_write_1h < 0 else self.cache_write_1h
        return (
            parts.uncached * self.input
            + parts.read * self.cached_input
            + (parts.written - parts.written_1h) * write
            + parts.written_1h * hour
            + output * self.output
        )

    def bound(self, prompt_tokens: int, output_tokens: int) -> int:
        """The most a call of these token bounds can cost (its prompt at the dearest rate)."""
        dearest = max(self.input, self.cached_input, self.cache_write, self.cache_write_1h)
        return prompt_tokens * dearest + output_tokens * self.output


@dataclass(frozen=True)
class PriceTable:
    version: str
    models: Mapping[str, Price] = field(default_factory=dict)

    def price_of(self, model: str | None) -> Price | None:
        """The model's price, else the ``"*"`` entry's, else None (not priced)."""
        found = self.models.get(model) if model is not None else None
        return found if found is not None else self.models.get("*")


def usd(picodollars: int) -> float:
    return picodollars / PICO_PER_USD


def to_pico(dollars: float) -> int:
    """A budget in USD as picodollars."""
    return int(Decimal(str(dollars)) * PICO_PER_USD)


def load(section: Any, fail: Callable[[str, str], Exception]) -> PriceTable:
    """The ``[prices]`` table, or ``fail(field, why)`` raised naming what is wrong."""
    if not isinstance(section, dict):
        raise fail("prices", "must be a table")
    unknown = set(section) - {"version", "models"}
    if unknown:
        raise fail(f"prices.{sorted(unknown)[0]}", "is not a known field")
    version = section.get("version")
    if not isinstance(version, str) or not version.strip():
        raise fail("prices.version", "must be a non-empty string (it names the receipts' prices)")
    models = section.get("models", {})
    if not isinstance(models, dict) or not models:
        raise fail("prices.models", 'must hold a table per model: [prices.models."name"]')
    return PriceTable(version, {name: _price(name, t, fail) for name, t in models.items()})


def _price(name: str, table: Any, fail: Callable[[str, str], Exception]) -> Price:
    where = f"prices.models.{name!r}"
    if not isinstance(table, dict):
        raise fail(where, "must be a table")
    unknown = set(table) - _FIELDS
    if unknown:
        raise fail(f"{where}.{sorted(unknown)[0]}", "is not a known field")
    for required in ("input", "output"):
        if required not in table:
            raise fail(f"{where}.{required}", "is missing (USD per million tokens)")
    rates = {k: _rate(table[k], f"{where}.{k}", fail) for k in ("input", "output")}
    cached = table.get("cached_input")
    ceiling = table.get("max_output_tokens", 0)
    if isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 0:
        raise fail(f"{where}.max_output_tokens", "must be a whole number >= 0")
    if cached is not None:
        rates["cached_input"] = _rate(cached, f"{where}.cached_input", fail)
    for name in ("cache_write", "cache_write_1h"):
        if name in table:
            rates[name] = _rate(table[name], f"{where}.{name}", fail)
    return Price(
        input=rates["input"],
        cached_input=rates.get("cached_input", rates["input"]),
        output=rates["output"],
        max_output_tokens=ceiling,
        cache_write=rates.get("cache_write", -1),
        cache_write_1h=rates.get("cache_write_1h", -1),
    )


def _rate(value: Any, where: str, fail: Callable[[str, str], Exception]) -> int:
    """USD per million tokens as picodollars per token: exact, or refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(where, "must be a number (USD per million tokens)")
    pico = Decimal(str(value)) * _PER_TOKEN  # the decimal as written: 0.15 is exact
    if not pico.is_finite() or pico < 0 or pico != pico.to_integral_value():
        raise fail(where, "must be a finite number >= 0 with at most 6 decimals")
    return int(pico)
