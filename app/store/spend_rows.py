"""A settled call's row in the spend ledger, and the ledger's columns. No I/O here.

The ledger (app/store/spend_db.py, app/store/spend_ledger.py) keeps one row per call of a
gateway key that settled: what the key's budgets were charged, and the receipt behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The row's columns, in SpendRow's order.
COLUMNS = (
    "request_id",
    "at",
    "key_name",
    "model",
    "upstream",
    "tokens_in",
    "tokens_cached",
    "tokens_written",
    "tokens_out",
    "tokens",
    "cost_pico",
    "basis",
    "upstream_request_id",
    "prices_version",
)
# What a window's counter counts, by the column that holds it (app/tenancy/limits.py).
TOTALS = {"tokens": "tokens", "cost": "cost_pico"}


@dataclass(frozen=True, slots=True)
class SpendRow:
    """One settled call of a gateway key: what its key's budgets were charged (``tokens``,
    ``cost_pico``) and the receipt behind it. ``at`` is when the call was admitted (Unix
    seconds): it decides the day and month the call counts in, as it did for the counters.
    ``basis``: ``usage`` (the upstream's own bill), ``reservation`` (kept: no whole answer
    with the upstream's usage) or ``none`` (not billed: a cache hit, a coalesced follower, the
    gateway's own error). The four token counts are the usage's as sent, None where absent."""

    request_id: str
    at: float
    key_name: str
    model: str | None
    upstream: str | None
    tokens_in: int | None
    tokens_cached: int | None
    tokens_written: int | None
    tokens_out: int | None
    tokens: int
    cost_pico: int
    basis: str
    upstream_request_id: str | None
    prices_version: str | None
