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
from app.request.usage import Usage
from app.tenancy import limits
from app.tenancy.key_source import KeySource
from app.tenancy.keyring import GatewayKey
from app.tenancy.limits import Counters, Window
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


@dataclass(frozen=True)
class _Budget:
    window: Window
    limit: int
    quota: bool  # a day's or a month's: spent until it resets, hours away


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
        route: str = "",
        size: int = 0,
    ) -> Grant:
        """The call's grant, or the error to answer with: 403, 400, 429 (or 503 when the
        counters are down and limits fail closed). ``size``: the body's bytes."""
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
            self._reserve(grant, route, body, size)
        taken: list[tuple[str, int]] = []  # given back if a later limit refuses the call
        try:
            if stream and key.max_streams:
                window = limits.streams(self.stream_hold_s)
                count = self._take(key.name, window, 1, now, taken)
                if count is not None and count > key.max_streams:
                    raise RateLimited(
                        f"The key {key.name!r} has {key.max_streams} streams open already.",
                        kind="requests",
                        retry_after_s=1,
                    )
                grant.stream_window = window if count is not None else None
            if key.requests_per_minute:
                self._take_request(grant, now, taken)
            grant.token_windows = self._take_budgets(
                grant, _token_budgets(key, now), grant.tokens, now, taken
            )
            grant.cost_windows = self._take_budgets(
                grant, _cost_budgets(key, now), grant.cost, now, taken
            )
        except BaseException:
            for counter, delta in taken:
                self.counters.decr(counter, delta)
            raise
        return grant

    def _reserve(self, grant: Grant, route: str, body: Mapping[str, Any], size: int) -> None:
        """The most the call can be billed, in tokens and money; the cap it is sent."""
        key, price = grant.key, grant.price
        if (
            key.max_tokens
            and route in bounds.OUTPUT_FIELD
            and bounds.own_output_bound(body) is None
        ):
            grant.output_cap = key.max_tokens  # the cap holds for calls that name none too
        if not key.counts_tokens:
            return
        ceiling = grant.output_cap or (price.max_output_tokens if price else 0)
        prompt = bounds.prompt_bound(size, body)
        output = bounds.output_bound(route, body, ceiling or self.default_output_tokens)
        grant.tokens = prompt + output
        if key.counts_money and price is not None:
            grant.cost = price.bound(prompt, output)

    def _take_request(self, grant: Grant, now: float, taken: list[tuple[str, int]]) -> None:
        key = grant.key
        window = limits.minute("requests", now)
        count = self._take(key.name, window, 1, now, taken)
        if count is None:
            return
        grant.request_window = window
        reset = window.reset_s(now)
        if count > key.requests_per_minute:
            raise RateLimited(
                f"Rate limit reached for key {key.name!r}: "
                f"{key.requests_per_minute} requests per minute.",
                kind="requests",
                retry_after_s=int(reset + 0.999),
            )
        remaining = max(0, key.requests_per_minute - count)
        grant.headers += _trio("requests", key.requests_per_minute, remaining, reset)

    def _take_budgets(
        self,
        grant: Grant,
        budgets: list[_Budget],
        want: int,
        now: float,
        taken: list[tuple[str, int]],
    ) -> list[Window]:
        """Take ``want`` from each budget (tokens or picodollars): the windows counted in, or
        RateLimited for the first that cannot hold it."""
        counted = []
        for budget in budgets:
            window, limit = budget.window, budget.limit
            if want > limit:
                raise _too_large(grant.key.name, window, limit, want)
            used = self._take(grant.key.name, window, want, now, taken)
            if used is None:
                continue
            counted.append(window)
            # Refused: a call that would cross the limit, or any once it is reached.
            if used > limit or (want == 0 and used >= limit):
                raise RateLimited(
                    f"{_PER[window.what]} reached for key {grant.key.name!r}: "
                    f"{_amount(window, limit)} ({_amount(window, used - want)} used, "
                    f"{_amount(window, want)} held for this call).",
                    kind="tokens",
                    retry_after_s=int(window.reset_s(now) + 0.999),
                    quota=budget.quota,
                )
            if window.what == "tokens":
                reset = window.reset_s(now)
                grant.headers += _trio("tokens", limit, max(0, limit - used), reset)
        return counted

    def _take(
        self, name: str, window: Window, delta: int, now: float, taken: list[tuple[str, int]]
    ) -> int | None:
        """Add ``delta`` to the key's counter of ``window``: its new value, or None when the
        counters are down and limits fail open (LimitsUnavailable when they fail closed)."""
        counter = window.key(name)
        value = self.counters.incr(counter, delta, window.ttl(now), renew=bool(window.hold))
        if value is None:
            if self._on_counter_error is not None:
                self._on_counter_error()
            if now - self._warned >= _WARN_EVERY_S:
                self._warned = now
                state = "open: calls pass uncounted" if self.fail_open else "closed: calls refused"
                log.warning("limit counters unreachable; limits fail %s", state)
            if not self.fail_open:
                raise LimitsUnavailable("Limits cannot be checked right now; retry shortly.")
            return None
        if delta:
            taken.append((counter, delta))
        return value

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
        for windows, delta in ((grant.token_windows, spent - grant.tokens),
                               (grant.cost_windows, cost - grant.cost)):  # fmt: skip
            for window in windows:
                if delta > 0:
                    self.counters.incr(window.key(name), delta, window.ttl(now))
                elif delta < 0:
                    self.counters.decr(window.key(name), -delta)
        if grant.stream_window is not None:
            self.counters.decr(grant.stream_window.key(name), 1)
        if not served and grant.request_window is not None:
            self.counters.decr(grant.request_window.key(name), 1)
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


def _token_budgets(key: GatewayKey, now: float) -> list[_Budget]:
    budgets = [
        _Budget(limits.minute("tokens", now), key.tokens_per_minute, False),
        _Budget(limits.day("tokens_day", now), key.tokens_per_day, True),
        _Budget(limits.month("tokens_month", now), key.tokens_per_month, True),
    ]
    return [b for b in budgets if b.limit]


def _cost_budgets(key: GatewayKey, now: float) -> list[_Budget]:
    budgets = [
        _Budget(limits.day("usd_day", now), to_pico(key.usd_per_day), True),
        _Budget(limits.month("usd_month", now), to_pico(key.usd_per_month), True),
    ]
    return [b for b in budgets if b.limit]


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
        retry_after_s=1,
    )
    error.retryable, error.headers = False, {}  # no wait makes it fit
    return error


def _trio(what: str, limit: int, remaining: int, reset_s: float) -> list[tuple[str, str]]:
    return [
        (f"x-ratelimit-limit-{what}", str(limit)),
        (f"x-ratelimit-remaining-{what}", str(remaining)),
        (f"x-ratelimit-reset-{what}", limits.reset_text(reset_s)),
    ]
