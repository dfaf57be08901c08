"""A call's share of each limit its key has, and how a refusal words it. No I/O here.

``Access.admit`` (app/tenancy/access.py) asks ``token_budgets`` and ``cost_budgets`` what the
call takes from each budget window of its key, and ``too_large`` for the refusal of a call
that could never fit one. Each window is built only for a limit the key has: a calendar month
is two timegm calls and a money limit a Decimal conversion, on every call of the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.errors import RateLimited
from app.tenancy import limits
from app.tenancy.keyring import GatewayKey
from app.tenancy.limits import Count, Window
from app.tenancy.prices import to_pico, usd

PER = {
    "tokens": "Token limit per minute",
    "tokens_day": "Token budget per day",
    "tokens_month": "Token budget per month",
    "usd_day": "Budget per day",
    "usd_month": "Budget per month",
}


@dataclass(frozen=True)
class Want:
    """The call's share of one limit: ``delta`` taken from ``window``'s counter."""

    window: Window
    limit: int
    delta: int

    @property
    def quota(self) -> bool:
        """A day's or a month's budget: once spent, spent until it resets, hours away."""
        return self.window.budget

    def count(self, name: str, now: float, *, rebuilt: bool = False) -> Count:
        """The count for key ``name``; ``rebuilt``: a budget's counter found missing is left
        so, to be made again from the spend ledger (app/tenancy/access.py)."""
        window = self.window
        create = not (rebuilt and window.budget)
        return Count(
            window.key(name), self.delta, window.ttl(now), renew=bool(window.hold), create=create
        )


def token_budgets(key: GatewayKey, now: float, want: int) -> list[Want]:
    budgets: list[Want] = []
    if key.tokens_per_minute:
        budgets.append(Want(limits.minute("tokens", now), key.tokens_per_minute, want))
    if key.tokens_per_day:
        budgets.append(Want(limits.day("tokens_day", now), key.tokens_per_day, want))
    if key.tokens_per_month:
        budgets.append(Want(limits.month("tokens_month", now), key.tokens_per_month, want))
    return budgets


def cost_budgets(key: GatewayKey, now: float, want: int) -> list[Want]:
    budgets: list[Want] = []
    if key.usd_per_day and (limit := to_pico(key.usd_per_day)):
        budgets.append(Want(limits.day("usd_day", now), limit, want))
    if key.usd_per_month and (limit := to_pico(key.usd_per_month)):
        budgets.append(Want(limits.month("usd_month", now), limit, want))
    return budgets


def amount(window: Window, value: int) -> str:
    """A count of the window's unit, as a person reads it."""
    return f"{usd(value):.6f} USD" if window.what.startswith("usd") else f"{value} tokens"


def too_large(name: str, window: Window, limit: int, want: int) -> RateLimited:
    """A call that could never fit: however long the caller waits, the answer stays no."""
    error = RateLimited(
        f"Request too large for key {name!r}: it may cost up to {amount(window, want)} "
        f"(its prompt's bound and its output's, docs/security.md), more than the whole "
        f"{PER[window.what].lower()} of {amount(window, limit)}. Send a shorter prompt or "
        f"a smaller max_tokens.",
        kind="tokens",
        retry_after_s=None,  # no wait makes it fit
    )
    return error
