"""Gateway keys and their limits, per call: authenticate, admit, and settle afterwards.

``Access.admit`` runs before any upstream work: the caller's key (app/tenancy/keyring.py), what it
may use, and its limits counted in the shared counters (app/tenancy/limits.py). It returns a
``Grant`` that holds what the call took (a request, a stream slot, a token reservation),
the headers the answer carries (OpenAI's ``x-ratelimit-*``), and ``settle()``, which the end
of the call runs once with the answer's ``usage``.

With a spend ledger (app/store/spend_ledger.py) every settlement also appends the call's row
to it (app/tenancy/receipts.py), and a day's or a month's budget counter that Memcached no
longer holds (restarted, flushed, evicted, or a new window) is made again from it before the
call is counted: the ledger's total for the key and window, plus the call's share. The
grant that finds it missing waits for that read (the ledger's timeout at most); a ledger
that cannot say leaves the count unreachable, as a Memcached that cannot answer does
(LLMGATE_LIMITS_FAIL). docs/security.md states what a rebuild can miss.

The keys come from a ``KeySource`` (app/tenancy/key_source.py), which re-reads the keys file
when it changes, so a revoked key stops working everywhere within a quarter of a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from app.core.errors import LimitsUnavailable, ModelNotPriced, RateLimited
from app.request import bounds
from app.request.call import Trace
from app.request.routes import PASSTHROUGH, Route
from app.request.usage import Usage
from app.store.spend_rows import SpendRow
from app.tenancy import limits
from app.tenancy.budgets import PER, Want, amount, cost_budgets, token_budgets, too_large
from app.tenancy.key_source import KeySource
from app.tenancy.keyring import GatewayKey
from app.tenancy.limits import MISSING, Count, Counters, Window
from app.tenancy.prices import Price, PriceTable, usd
from app.tenancy.receipts import spend_row

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
    at: float = 0.0  # when it was admitted: the day and month it counts in
    model: str | None = None
    calls: int = 1  # upstream calls reserved for: more when a stream is continued


class Ledger(Protocol):
    """The spend ledger as Access uses it (app/store/spend_ledger.py)."""

    def append(self, row: SpendRow) -> None: ...

    def total(self, key_name: str, what: str, start: float, end: float) -> int | None: ...


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
        ledger: Ledger | None = None,
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
        self.ledger = ledger
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
        price = self.prices.price_of(model) if self.prices else None
        grant = Grant(key, price=price, at=now, model=model)
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
        rebuilt = self.ledger is not None
        counts = [want.count(key.name, now, rebuilt=rebuilt) for want in wanted]
        values = self.counters.apply(counts)
        if MISSING in values:
            values = self._rebuilt(key.name, wanted, counts, values)
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

    def _rebuilt(
        self, name: str, wanted: list[Want], counts: list[Count], values: list[int | None]
    ) -> list[int | None]:
        """``values`` with each budget's counter found missing made again from the ledger:
        what the key was charged in that window, plus this call's share (one read per window
        of the key in the worker at a time: the ledger shares it). None where the ledger
        cannot say: that count is unreachable."""
        assert self.ledger is not None
        made: list[tuple[int, Count]] = []
        for i, (want, count) in enumerate(zip(wanted, counts, strict=True)):
            if values[i] != MISSING:
                continue
            window = want.window
            what = "cost" if window.what.startswith("usd") else "tokens"
            spent = self.ledger.total(name, what, window.start, window.end)
            values[i] = None
            if spent is not None:
                made.append((i, replace(count, create=True, start=spent)))
        if made:
            for (i, _), value in zip(made, self.counters.apply([c for _, c in made]), strict=True):
                values[i] = value
        return values

    def _wanted(self, grant: Grant, stream: bool, now: float) -> list[Want]:
        """What the call takes, from each limit its key has (none: nothing is counted), in
        the order a refusal names them. A call that could never fit a budget is refused here,
        before anything is counted."""
        key = grant.key
        wanted = []
        if stream and key.max_streams:
            wanted.append(Want(limits.streams(self.stream_hold_s), key.max_streams, 1))
        if key.requests_per_minute:
            wanted.append(Want(limits.minute("requests", now), key.requests_per_minute, 1))
        budgets = token_budgets(key, now, grant.tokens) + cost_budgets(key, now, grant.cost)
        for budget in budgets:
            if budget.delta > budget.limit:
                raise too_large(key.name, budget.window, budget.limit, budget.delta)
        return wanted + budgets

    def _check(self, grant: Grant, want: Want, value: int, now: float) -> None:
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
                    f"{PER[window.what]} reached for key {key.name!r}: "
                    f"{amount(window, limit)} ({amount(window, value - want.delta)} used, "
                    f"{amount(window, want.delta)} held for this call).",
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
        self,
        grant: Grant,
        usage: Usage | None,
        billed: bool,
        *,
        served: bool = True,
        trace: Trace | None = None,
    ) -> None:
        """The call is over: count its real tokens and cost (none when nothing was billed, a
        cache hit say) in place of the reservation, and free its stream slot; with a ledger,
        append the call's row (``trace``: its facts, the receipt's). Runs once.

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
        # A budget's counter gone since the grant stays gone: the ledger's row below holds
        # this call, and the next grant makes the counter again from the ledger.
        keep = self.ledger is None
        counts = [
            Count(window.key(name), delta, window.ttl(now), create=keep or not window.budget)
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
        if self.ledger is not None:
            basis = ("usage" if usage else "reservation") if billed else "none"
            version = self.prices.version if self.prices is not None else None
            bill = usage if billed and usage else None
            row = spend_row(name, grant.at, grant.model, bill, (spent, cost, basis), trace, version)
            self.ledger.append(row)

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


def _trio(what: str, limit: int, remaining: int, reset_s: float) -> list[tuple[str, str]]:
    return [
        (f"x-ratelimit-limit-{what}", str(limit)),
        (f"x-ratelimit-remaining-{what}", str(remaining)),
        (f"x-ratelimit-reset-{what}", limits.reset_text(reset_s)),
    ]
