"""A settled call's row in the spend ledger (app/store/spend_rows.py): what its key's budgets
were charged, and the receipt a finance team matches with the provider's invoice. No I/O.

The token counts are the usage's as the provider sent them (app/request/usage.py), each kept
only when it is a whole number >= 0 (anything else is null, never a failed batch). Cache
writes (``tokens_written``) are ``Usage.written``'s: null where the usage has none.
"""

from __future__ import annotations

import uuid
from typing import Any

from app.request.call import Trace
from app.request.usage import Usage
from app.store.spend_rows import SpendRow


def spend_row(
    key_name: str,
    at: float,
    model: str | None,
    usage: Usage | None,
    charged: tuple[int, int, str],
    trace: Trace | None,
    prices_version: str | None,
) -> SpendRow:
    """The row of a call of ``key_name`` admitted at ``at``; ``usage``: its bill, None when
    there is none; ``charged``: (tokens, picodollars, basis) its budgets were charged and why
    (SpendRow's ``basis``); ``trace``: the call's facts (none: a request id of its own)."""
    tokens, cost, basis = charged
    counts = (usage.prompt, usage.cached, usage.written, usage.output) if usage else (None,) * 4
    return SpendRow(
        request_id=trace.request_id if trace is not None else uuid.uuid4().hex,
        at=at,
        key_name=key_name,
        model=model,
        upstream=trace.upstream if trace is not None else None,
        tokens_in=_count(counts[0]),
        tokens_cached=_count(counts[1]),
        tokens_written=_count(counts[2]),
        tokens_out=_count(counts[3]),
        tokens=tokens,
        cost_pico=cost,
        basis=basis,
        upstream_request_id=trace.upstream_request_id if trace is not None else None,
        prices_version=prices_version,
    )


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None
