"""One more upstream call's reservation for a call under way: a stream continued on another
upstream (app/upstream/continuation.py) is billed for both calls, so its key reserves for the
continuation before it is sent, as it reserved for the call (app/tenancy/access.py).

The rule: the call's own bound again (its tokens and its cost, as ``Access.admit`` reserved
them), counted in the same windows, so that the call's settlement (``Access.settle``) puts
the usage of every call in place of every reservation at once. A budget with no room for it
refuses the continuation: every count it made is given back, and the stream ends as it would
have without one.
"""

from __future__ import annotations

from app.tenancy.access import Access, Grant
from app.tenancy.keyring import GatewayKey
from app.tenancy.limits import MISSING, Count, Window
from app.tenancy.prices import to_pico

# The key's limit each window counts against (the money ones in USD, counted in picodollars).
_LIMITS = {
    "tokens": "tokens_per_minute",
    "tokens_day": "tokens_per_day",
    "tokens_month": "tokens_per_month",
    "usd_day": "usd_per_day",
    "usd_month": "usd_per_month",
}


def reserve_again(access: Access, grant: Grant) -> bool:
    """Reserve one more call's bound on ``grant``; False, with nothing left counted, when a
    budget has no room, or its counter is gone and a ledger is to make it again, or limits
    fail closed and the counters are down, or the call is settled already."""
    if grant.settled:
        return False
    tokens, cost = grant.tokens // grant.calls, grant.cost // grant.calls
    wanted = [(window, tokens) for window in grant.token_windows if tokens]
    wanted += [(window, cost) for window in grant.cost_windows if cost]
    if wanted:
        name, now = grant.key.name, access.now()
        # With a ledger, a day's or month's counter gone since the call began (Memcached
        # restarted) is not made again here from this call alone: it stays missing for the
        # next grant to rebuild from the ledger, and the continuation is not made.
        keep = access.ledger is not None
        counts = [
            Count(window.key(name), delta, window.ttl(now), create=not (keep and window.budget))
            for window, delta in wanted
        ]
        values = access.counters.apply(counts)
        down, missing = None in values, MISSING in values
        over = any(
            value is not None and value > _limit_of(grant.key, window)
            for (window, _), value in zip(wanted, values, strict=True)
        )
        if over or missing or (down and not access.fail_open):
            taken = zip(counts, values, strict=True)
            back = [Count(c.key, -c.delta) for c, value in taken if value not in (None, MISSING)]
            if back:
                access.counters.apply(back)
            return False
    grant.tokens += tokens
    grant.cost += cost
    grant.calls += 1
    return True


def _limit_of(key: GatewayKey, window: Window) -> int:
    limit = getattr(key, _LIMITS[window.what])
    return to_pico(limit) if window.what.startswith("usd") else int(limit)
