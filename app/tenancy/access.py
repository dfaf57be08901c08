"""Gateway keys and their limits, per call: authenticate, admit, and settle afterwards.

``Access.admit`` runs before any upstream work: the caller's key (app/tenancy/keyring.py), what it
may use, and its limits counted in the shared counters (app/tenancy/limits.py). It returns a
``Grant`` that holds what the call took (a request, a stream slot, a token reservation),
the headers the answer carries (OpenAI's ``x-ratelimit-*``), and ``settle()``, which the end
of the call runs once with the answer's ``usage``.

The keys come from a ``KeySource`` (app/tenancy/key_source.py), which re-reads the keys file
when it changes, so a revoked key stops working everywhere within a quarter of a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import LimitsUnavailable, ModelNotPriced, RateLimited
from app.request import bounds
from app.request.routes import PASSTHROUGH, Route
from app.request.usage import Usage
from app.tenancy import limits
from app.tenancy.key_source import KeySource
from app.tenancy.keyring import GatewayKey
from app.tenancy.limits import Count, Counters, Window
from app.tenancy.prices import Price, PriceTable, to_pico, usd

log = logging.getLogger("llmgate.access")
_WARN_EVERY_S = 10.0


@dataclass
class Grant:
    """What one call took from its key's limits, until ``settle()`` gives back the rest."""

    key: GatewayKey
    headers: list[tuple[str, str]] = field(default_factory=list)
    tokens: int = 0  # reserved: the most the call can be billed (app/request/bounds.py)
    cost: int = 0  # reserved, in picodollars (app/tenancy/prices.py)
    price: Price | None = None  # the model's, when the config file has prices
    # The output bound the call is sent: the key's max_tokens, for a call naming none.
    output_cap: int | None = None
    token_windows: list[Window] = field(default_factory=list)
    cost_windows: list[Window] = field(default_factory=list)
    request_window: Window | None = None
    stream_window: Window | None = None
    settled: bool = False
    calls: int = 1  # upstream calls reserved for: more when a stream is continued


@dataclass(frozen=True)
class _Want:
    """The call's share of one limit: ``delta`` taken from ``window``'s counter."""

    window: Window
    limit: int
    delta: int
    quota: bool = False  # a day's or a month's budget: spent until it resets, hours away

    def count(self, name: str, now: float) -> Count:
        window = self.window
        return Count(window.key(name), self.delta, window.ttl(now), renew=bool(window.hold))


class Access:
    """The gate of one worker: keys from ``source``, limits in ``counters``."""

    def __init__(
        self,
        source: KeySource,
        counters: Counters,
        *,
        fail_open: bool = True,
        stream_hold_s: float = 600.0,
        prices: PriceTable | None = None,
        default_output_tokens: int = 16384,
        on_usage: Callable[[GatewayKey, Usage | None, int], None] | None = None,
        on_counter_error: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.counters = counters
        self.fail_open = fail_open
        self.stream_hold_s = stream_hold_s  # the longest a stream can last
        self.prices = prices
        self.default_output_tokens = default_output_tokens
        self._on_usage = on_usage
        self._on_counter_error = on_counter_error
        self._clock = clock
        self._warned = float("-inf")

    def now(self) -> float:
        """The gate's clock (Unix seconds): what its windows are counted by."""
        return self._clock()

    def authenticate(self, headers: list[tuple[str, str]]) -> GatewayKey:
        """The caller's key, or InvalidApiKey (401). First, before the body is even read."""
        return self.source.current().authenticate(headers, self._clock())

    def admit(
        self,
        key: GatewayKey,
        model: str | None,
        body: Mapping[str, Any] | None,
        *,
        stream: bool,
        route: Route = PASSTHROUGH,
        size: int = 0,
        raw: bytes | None = None,
    ) -> Grant:
        """The call's grant, or the error to answer with: 403, 400, 429 (or 503 when the
        counters are down and limits fail closed). ``size``: the body's bytes; ``raw``: the
        bytes it was parsed from, when known (app/request/bounds.py ``prompt_bound``)."""
        now = self._clock()
        if model is not None or body is not None:
            key.check_request(model, body)
        grant = Grant(key, price=self.prices.price_of(model) if self.prices else None)
        if key.counts_money and grant.price is None:
            raise ModelNotPriced(
                f"The key {key.name!r} has a budget in money and the gateway has no price "
                f"for the model {model!r}.",
                param="model",
            )
        if body is not None:
            self._reserve(grant, route, body, size, raw)
        wanted = self._wanted(grant, stream, now)
        if not wanted:
            return grant
        counts = [want.count(key.name, now) for want in wanted]
        values = self.counters.apply(counts)
        try:
            for want, value in zip(wanted, values, strict=True):
                if value is None:
                    self._counters_down(now)
                else:
                    self._check(grant, want, value, now)
        except BaseException:
            # Refused: every share the call took is given back, together.
            taken = zip(counts, values, strict=True)
            back = [Count(c.key, -c.delta) for c, value in taken if value is not None and c.delta]
            if back:
                self.counters.apply(back)
            raise
        return grant

    def _wanted(self, grant: Grant, stream: bool, now: float) -> list[_Want]:
        """What the call takes, from each limit its key has (none: nothing is counted), in
        the order a refusal names them. A call that could never fit a budget is refused here,
        before anything is counted."""
        key = grant.key
        wanted = []
        if stream and key.max_streams:
            wanted.append(_Want(limits.streams(self.stream_hold_s), key.max_streams, 1))
        if key.requests_per_minute:
            wanted.append(_Want(limits.minute("requests", now), key.requests_per_minute, 1))
        budgets = _token_budgets(key, now, grant.tokens) + _cost_budgets(key, now, grant.cost)
        for budget in budgets:
            if budget.delta > budget.limit:
                raise _too_large(key.name, budget.window, budget.limit, budget.delta)
        return wanted + budgets

    def _check(self, grant: Grant, want: _Want, value: int, now: float) -> None:
        """One limit's count after the call's share: RateLimited when over; else the grant
        remembers the window (given back or settled at the end) and its headers."""
        key, window, limit = grant.key, want.window, want.limit
        reset = window.reset_s(now)
        if window.what == "streams":
            if value > limit:
                raise RateLimited(
                    f"The key {key.name!r} has {limit} streams open already.",
                    kind="requests",
                    retry_after_s=1,
                )
            grant.stream_window = window
        elif window.what == "requests":
            if value > limit:
                raise RateLimited(
                    f"Rate limit reached for key {key.name!r}: "
                    f"{key.requests_per_minute} requests per minute.",
                    kind="requests",
                    retry_after_s=int(reset + 0.999),
                )
            grant.request_window = window
            grant.headers += _trio("requests", limit, max(0, limit - value), reset)
        else:
            # Refused: a call that would cross the limit, or any once it is reached.
            if value > limit or (want.delta == 0 and value >= limit):
                raise RateLimited(
                    f"{_PER[window.what]} reached for key {key.name!r}: "
                    f"{_amount(window, limit)} ({_amount(window, value - want.delta)} used, "
                    f"{_amount(window, want.delta)} held for this call).",
                    kind="tokens",
                    retry_after_s=int(reset + 0.999),
                    quota=want.quota,
                )
            is_money = window.what.startswith("usd")
            (grant.cost_windows if is_money else grant.token_windows).append(window)
            if window.what == "tokens":
                grant.headers += _trio("tokens", limit, max(0, limit - value), reset)

    def _counters_down(self, now: float) -> None:
        """A count that could not be made: the call passes it uncounted when limits fail
        open, and is refused (LimitsUnavailable) when they fail closed."""
        if self._on_counter_error is not None:
            self._on_counter_error()
        if now - self._warned >= _WARN_EVERY_S:
            self._warned = now
            state = "open: calls pass uncounted" if self.fail_open else "closed: calls refused"
            log.warning("limit counters unreachable; limits fail %s", state)
        if not self.fail_open:
            raise LimitsUnavailable("Limits cannot be checked right now; retry shortly.")

    def _reserve(
        self, grant: Grant, route: Route, body: Mapping[str, Any], size: int, raw: bytes | None
    ) -> None:
        """The most the call can be billed, in tokens and money; the cap it is sent."""
        key, price = grant.key, grant.price
        if key.max_tokens and route.output_field and bounds.own_output_bound(body) is None:
            grant.output_cap = key.max_tokens  # the cap holds for calls that name none too
        if not key.counts_tokens:
            return
        ceiling = grant.output_cap or (price.max_output_tokens if price else 0)
        prompt = bounds.prompt_bound(size, body, raw)
        output = bounds.output_bound(route, body, ceiling or self.default_output_tokens)
        grant.tokens = prompt + output
        if key.counts_money and price is not None:
            grant.cost = price.bound(prompt, output)

    def settle(
        self, grant: Grant, usage: Usage | None, billed: bool, *, served: bool = True
    ) -> None:
        """The call is over: count its real tokens and cost (none when nothing was billed, a
        cache hit say) in place of the reservation, and free its stream slot. Runs once.

        A billed call whose usage never came (the caller left mid-stream, before the usage
        chunk) keeps its reservation: leaving early must not make a call free. A call not
        ``served`` (the gateway's own refusal or failure before any upstream answer: busy,
        draining, the upstream unreachable) gives its request back too: it is not the
        caller's."""
        if grant.settled:
            return
        grant.settled = True
        spent, cost = 0, 0
        if billed and usage:
            spent = usage.total()
            cost = grant.price.cost(usage) if grant.price is not None else 0
        elif billed:
            spent, cost = grant.tokens, grant.cost
        name, now = grant.key.name, self._clock()
        changes = (
            (grant.token_windows, spent - grant.tokens),
            (grant.cost_windows, cost - grant.cost),
        )
        counts = [
            Count(window.key(name), delta, window.ttl(now))
            for windows, delta in changes
            for window in windows
            if delta
        ]
        if grant.stream_window is not None:
            counts.append(Count(grant.stream_window.key(name), -1))
        if not served and grant.request_window is not None:
            counts.append(Count(grant.request_window.key(name), -1))
        if counts:
            self.counters.apply(counts)  # all at once; what they come to, nobody reads
        if self._on_usage is not None:
            self._on_usage(grant.key, usage if billed else None, cost)

    def usage(self) -> dict[str, Any]:
        """Every key's counts in the current windows, with its limits (GET /admin/usage). A
        count is null where the key has no such limit: nothing is counted there."""
        now = self._clock()
        ring = self.source.current()
        # (report field, its window, the key's limit field)
        fields = [
            ("requests_this_minute", limits.minute("requests", now), "requests_per_minute"),
            ("tokens_this_minute", limits.minute("tokens", now), "tokens_per_minute"),
            ("tokens_today", limits.day("tokens_day", now), "tokens_per_day"),
            ("tokens_this_month", limits.month("tokens_month", now), "tokens_per_month"),
            ("usd_today", limits.day("usd_day", now), "usd_per_day"),
            ("usd_this_month", limits.month("usd_month", now), "usd_per_month"),
            ("streams_open", limits.streams(self.stream_hold_s), "max_streams"),
        ]
        wanted = [w.key(k.name) for k in ring.keys for _, w, limit in fields if getattr(k, limit)]
        counts = self.counters.read(wanted) if wanted else {}
        keys = []
        for k in ring.keys:
            row: dict[str, Any] = {"name": k.name, "revoked": k.revoked}
            for name, window, limit in fields:
                value = (counts or {}).get(window.key(k.name), 0)
                counted = getattr(k, limit)
                row[name] = None if not counted else usd(value) if name.startswith("usd") else value
            row["limits"] = {limit: getattr(k, limit) for _, _, limit in fields}
            keys.append(row)
        return {
            "counters_available": counts is not None,
            "prices_version": None if self.prices is None else self.prices.version,
            "keys": keys,
        }


_PER = {
    "tokens": "Token limit per minute",
    "tokens_day": "Token budget per day",
    "tokens_month": "Token budget per month",
    "usd_day": "Budget per day",
    "usd_month": "Budget per month",
}


# Each window is built only for a limit the key has: a calendar month is two timegm calls
# and a money limit a Decimal conversion, on every call of the key.
def _token_budgets(key: GatewayKey, now: float, want: int) -> list[_Want]:
    budgets: list[_Want] = []
    if key.tokens_per_minute:
        budgets.append(_Want(limits.minute("tokens", now), key.tokens_per_minute, want))
    if key.tokens_per_day:
        budgets.append(_Want(limits.day("tokens_day", now), key.tokens_per_day, want, quota=True))
    if key.tokens_per_month:
        month = limits.month("tokens_month", now)
        budgets.append(_Want(month, key.tokens_per_month, want, quota=True))
    return budgets


def _cost_budgets(key: GatewayKey, now: float, want: int) -> list[_Want]:
    budgets: list[_Want] = []
    if key.usd_per_day and (limit := to_pico(key.usd_per_day)):
        budgets.append(_Want(limits.day("usd_day", now), limit, want, quota=True))
    if key.usd_per_month and (limit := to_pico(key.usd_per_month)):
        budgets.append(_Want(limits.month("usd_month", now), limit, want, quota=True))
    return budgets


def _amount(window: Window, value: int) -> str:
    """A count of the window's unit, as a person reads it."""
    return f"{usd(value):.6f} USD" if window.what.startswith("usd") else f"{value} tokens"


def _too_large(name: str, window: Window, limit: int, want: int) -> RateLimited:
    """A call that could never fit: however long the caller waits, the answer stays no."""
    error = RateLimited(
        f"Request too large for key {name!r}: it may cost up to {_amount(window, want)} "
        f"(its prompt's bound and its output's, docs/security.md), more than the whole "
        f"{_PER[window.what].lower()} of {_amount(window, limit)}. Send a shorter prompt or "
        f"a smaller max_tokens.",
        kind="tokens",
        retry_after_s=None,  # no wait makes it fit
    )
    return error


def _trio(what: str, limit: int, remaining: int, reset_s: float) -> list[tuple[str, str]]:
    return [
        (f"x-ratelimit-limit-{what}", str(limit)),
        (f"x-ratelimit-remaining-{what}", str(remaining)),
        (f"x-ratelimit-reset-{what}", limits.reset_text(reset_s)),
    ]
