"""A key's budgets with a spend ledger behind them (app/tenancy/access.py): every settlement's
row, and a day's or month's counter that the counters lost made again from the ledger before
the next grant, once per key and window, never per call; the minute windows as before.

The counters are ``MemoryCounters`` (the contract Memcached's keep: tests/integration/
test_limit_counters.py); losing them is a new, empty one, as a restarted Memcached is. The
ledger is ``Book``: the protocol Access uses, over a list, summing the rows it was given (the
real one's database: tests/integration/test_spend_db.py). A pinned clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.core.errors import LimitsUnavailable, RateLimited
from app.request import bounds, routes
from app.request.call import Trace
from app.request.usage import Usage
from app.store.spend_rows import SpendRow
from app.tenancy import limits
from app.tenancy.access import Access
from app.tenancy.key_source import KeySource
from app.tenancy.keyring import GatewayKey, KeyRing, hash_key
from app.tenancy.prices import Price, PriceTable
from app.tenancy.receipts import spend_row
from app.tenancy.reserve_again import reserve_again
from tests.support.clock import Clock

SECRET = "llmg-test-secret"
T0 = 1_790_000_020.0  # 2026-09-21 (UTC)
PRICES = PriceTable("2026-12", {"m": Price(2_000_000, cached_input=500_000, output=8_000_000)})
BODY: dict[str, Any] = {"max_tokens": 100}
SIZE = 36  # the body's bytes: with the overhead and the output, 200 tokens reserved
USAGE = Usage({"prompt_tokens": 20, "completion_tokens": 60, "total_tokens": 80})


class Book:
    """The spend ledger as Access uses it, over a list; ``down``: it cannot say."""

    def __init__(self) -> None:
        self.rows: list[SpendRow] = []
        self.reads: list[tuple[str, str]] = []
        self.down = False

    def append(self, row: SpendRow) -> None:
        self.rows.append(row)

    def total(self, key_name: str, what: str, start: float, end: float) -> int | None:
        self.reads.append((key_name, what))
        if self.down:
            return None
        column = "tokens" if what == "tokens" else "cost_pico"
        return sum(
            getattr(r, column) for r in self.rows if r.key_name == key_name and start <= r.at < end
        )


class Fixed(KeySource):
    def __init__(self, *keys: GatewayKey) -> None:
        self.ring = KeyRing(keys)

    def current(self) -> KeyRing:
        return self.ring


def gate(book: Book | None, *keys: GatewayKey, clock=lambda: T0, **kw) -> Access:
    return Access(
        Fixed(*keys), limits.MemoryCounters(), ledger=book, clock=clock, prices=PRICES, **kw
    )


def key(name: str = "team", **budgets: Any) -> GatewayKey:
    return GatewayKey(name=name, sha256=hash_key(f"{SECRET}-{name}"), **budgets)


def call(access: Access, k: GatewayKey, usage: Usage | None = USAGE) -> None:
    """One call of ``k``: admitted, then settled on ``usage`` (RateLimited when refused)."""
    grant = access.admit(k, "m", BODY, stream=False, route=routes.CHAT, size=SIZE)
    access.settle(grant, usage, True)


def calls_until_refused(access: Access, k: GatewayKey, most: int = 100) -> int:
    for n in range(most):
        try:
            call(access, k)
        except RateLimited:
            return n
    raise AssertionError("never refused")


def counted(access: Access, window: limits.Window, name: str = "team") -> int | None:
    return access.counters.read([window.key(name)]).get(window.key(name))  # type: ignore[union-attr]


def test_the_reservation_these_tests_count_on() -> None:
    assert SIZE + bounds.PROMPT_OVERHEAD + 100 == 200


@pytest.mark.parametrize("budget", ["tokens_per_month", "tokens_per_day"])
def test_a_lost_counter_is_made_again_and_refuses_where_it_would_have(budget: str) -> None:
    # 1,000 tokens: each call reserves 200 and is charged 80. Four spent (320), then the
    # counters are lost; the refusal comes after as many calls as it would have without: 7,
    # the last landing on 1,000 with its reservation (320 + 6 x 80 + 200).
    budgets: dict[str, Any] = {budget: 1000}
    control, book = gate(Book(), key(**budgets)), Book()
    lost = gate(book, key(**budgets))
    for access in (control, lost):
        for _ in range(4):
            call(access, access.source.current().keys[0])
    assert len(book.rows) == 4 and sum(r.tokens for r in book.rows) == 320
    lost.counters = limits.MemoryCounters()  # a restarted Memcached: empty
    k = lost.source.current().keys[0]
    book.reads.clear()
    assert calls_until_refused(lost, k) == calls_until_refused(control, k) == 7
    month = budget.endswith("month")
    window = limits.month("tokens_month", T0) if month else limits.day("tokens_day", T0)
    assert counted(lost, window) == counted(control, window) == 320 + 7 * 80
    assert book.reads == [("team", "tokens")]  # once for the key and window, not per call


def test_a_money_budget_is_made_again_from_the_rows_costs() -> None:
    book = Book()
    access = gate(book, key(usd_per_month=0.01))
    k = access.source.current().keys[0]
    call(access, k)
    cost = 20 * 2_000_000 + 60 * 8_000_000
    assert [r.cost_pico for r in book.rows] == [cost]
    book.reads.clear()
    access.counters = limits.MemoryCounters()
    grant = access.admit(k, "m", BODY, stream=False, route=routes.CHAT, size=SIZE)
    assert counted(access, limits.month("usd_month", T0)) == cost + grant.cost
    assert book.reads == [("team", "cost")]


def test_each_window_and_key_is_read_once_and_the_minute_windows_never() -> None:
    book = Book()
    budgets = {
        "tokens_per_minute": 10**6,
        "requests_per_minute": 10**6,
        "tokens_per_day": 10**6,
        "tokens_per_month": 10**6,
    }
    access = gate(book, key("a", **budgets), key("b", **budgets))
    a, b = access.source.current().keys
    for _ in range(3):
        call(access, a)
        call(access, b)
    # A new window's counter is missing too: read (and found empty) once each.
    assert sorted(book.reads) == [("a", "tokens")] * 2 + [("b", "tokens")] * 2
    book.reads.clear()
    access.counters = limits.MemoryCounters()
    for _ in range(3):
        call(access, a)
    assert book.reads == [("a", "tokens"), ("a", "tokens")]  # the day and the month, once
    minute = limits.minute("tokens", T0)
    assert counted(access, minute, "a") == 3 * 80  # the minute starts again, as it always did
    assert counted(access, limits.day("tokens_day", T0), "a") == 6 * 80


def test_a_ledger_that_cannot_say_leaves_the_count_unreachable() -> None:
    book, errors = Book(), []
    access = gate(book, key(tokens_per_month=1000), on_counter_error=lambda: errors.append(1))
    k = access.source.current().keys[0]
    call(access, k)
    access.counters, book.down = limits.MemoryCounters(), True
    call(access, k)  # limits fail open: passes uncounted, as with Memcached down
    month = limits.month("tokens_month", T0)
    assert errors == [1] and counted(access, month) is None  # not made at 0
    closed = gate(book, key(tokens_per_month=1000), fail_open=False)
    with pytest.raises(LimitsUnavailable):
        call(closed, k)
    book.down = False
    call(access, k)  # made again now: both rows and this call's share, settled
    assert counted(access, month) == 3 * 80


def test_a_settlement_never_makes_a_lost_counter() -> None:
    book = Book()
    access = gate(book, key(tokens_per_month=10_000))
    k = access.source.current().keys[0]
    grant = access.admit(k, "m", BODY, stream=False, route=routes.CHAT, size=SIZE)
    access.counters = limits.MemoryCounters()
    big = Usage({"prompt_tokens": 100, "completion_tokens": 400, "total_tokens": 500})
    access.settle(grant, big, True)  # 300 over its reservation: an incr, on a lost counter
    month = limits.month("tokens_month", T0)
    assert counted(access, month) is None and book.rows[-1].tokens == 500
    call(access, k)  # the next grant makes it from the ledger, this call's row with it
    assert counted(access, month) == 500 + 80


def test_every_settlement_appends_its_row_with_the_calls_receipt() -> None:
    book, clock = Book(), Clock(T0)
    access = gate(book, key(tokens_per_day=10**6), clock=clock)
    k = access.source.current().keys[0]
    trace = Trace(model="m", upstream="primary", upstream_request_id="req_123")
    grant = access.admit(k, "m", BODY, stream=False, route=routes.CHAT, size=SIZE)
    clock.now += 30  # a long answer: the row keeps when the call was admitted
    access.settle(grant, USAGE, True, trace=trace)
    kept = access.admit(k, "m", BODY, stream=True, route=routes.CHAT, size=SIZE)
    access.settle(kept, None, True)  # the caller left: the reservation stands
    hit = access.admit(k, "m", BODY, stream=False, route=routes.CHAT, size=SIZE)
    access.settle(hit, None, False)  # a cache hit: nothing billed
    usage, reserved, nothing = book.rows
    cost = 20 * 2_000_000 + 60 * 8_000_000
    assert usage == SpendRow(
        trace.request_id,
        T0,
        "team",
        "m",
        "primary",
        20,
        None,
        None,
        60,
        80,
        cost,
        "usage",
        "req_123",
        "2026-12",
    )
    assert (reserved.basis, reserved.tokens, reserved.tokens_in, reserved.at) == (
        "reservation",
        200,
        None,
        T0 + 30,
    )
    assert (nothing.basis, nothing.tokens, nothing.cost_pico) == ("none", 0, 0)
    assert len({r.request_id for r in book.rows}) == 3


@pytest.mark.parametrize(
    ("sent", "counts"),
    [
        # Anthropic's: the prompt is the three counts together; cache writes apart.
        (
            {
                "input_tokens": 5,
                "cache_read_input_tokens": 30,
                "cache_creation_input_tokens": 40,
                "output_tokens": 7,
            },
            (75, 30, 40, 7),
        ),
        (
            {
                "prompt_tokens": 50,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 10, "cache_write_tokens": 20},
            },
            (50, 10, 20, 7),
        ),
        (
            {
                "input_tokens": 50,
                "output_tokens": 7,
                "input_tokens_details": {"cached_tokens": 10, "cache_write_tokens": 3},
            },
            (50, 10, 3, 7),
        ),
        # Not whole numbers >= 0: null, never a row the database refuses.
        (
            {"prompt_tokens": "50", "completion_tokens": -1, "prompt_tokens_details": []},
            (None, None, None, None),
        ),
        ({"prompt_tokens": 2**64, "completion_tokens": True}, (None, None, None, None)),
    ],
)
def test_a_rows_counts_are_the_usages_as_sent(sent, counts) -> None:
    row = spend_row("team", T0, "m", Usage(sent), (1, 2, "usage"), None, None)
    assert (row.tokens_in, row.tokens_cached, row.tokens_written, row.tokens_out) == counts
    assert len(row.request_id) == 32  # no trace: a request id of its own


def test_cache_writes_are_none_where_the_usage_has_none() -> None:
    cached_only = {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}
    for sent in (cached_only, {"input_tokens": 5}):
        assert (
            spend_row("team", T0, "m", Usage(sent), (1, 2, "usage"), None, None).tokens_written
            is None
        )


def test_a_continuations_reservation_never_makes_a_lost_counter() -> None:
    """A stream continued after Memcached lost the key's month (app/tenancy/reserve_again.py):
    its second reservation leaves the counter missing for the next grant to make from the
    ledger, and the continuation is not made; without the loss it is counted as any."""
    book = Book()
    access = gate(book, key(tokens_per_month=10_000))
    k = access.source.current().keys[0]
    month = limits.month("tokens_month", T0)
    grant = access.admit(k, "m", BODY, stream=True, route=routes.CHAT, size=SIZE)
    assert reserve_again(access, grant) and counted(access, month) == 2 * 200
    access.settle(grant, USAGE, True)
    grant = access.admit(k, "m", BODY, stream=True, route=routes.CHAT, size=SIZE)
    access.counters = limits.MemoryCounters()  # a restarted Memcached: empty
    assert not reserve_again(access, grant)
    assert counted(access, month) is None  # not made at one call's 200
    access.settle(grant, USAGE, True)
    call(access, k)  # the next grant makes it from the ledger: three calls' rows
    assert counted(access, month) == 3 * 80
