"""Monthly budgets that survive Memcached (issue 46), through a stack shaped as `make run` makes
it (nginx, one gunicorn of two workers, one Memcached), its spend ledger in the run
directory's SQLite file, and again in a PostgreSQL of its own.

A key spends part of its month (tokens, or USD), Memcached is restarted (or flushed), and the
key's next calls are refused at the point where a twin key, with the same budget and the same
calls but no fault, was refused. The month's counter after it is read from Memcached's own
mouth and the spend from the database itself (tests/support/postgres.py ``ledger_query``),
never through the gateway's code. The same calls without a ledger are let through further
(the negative control: the old "a lost node gives every key its month back").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import urllib3

from app.tenancy import limits
from runner.stack import Stack, StackOptions
from tests.conftest import require_binary
from tests.support.bodies import chat_about
from tests.support.keys_file import keys_toml, priced_config
from tests.support.memcached import (
    flush_memcached,
    memcached_get,
    start_stack_memcached,
    stop_stack_memcached,
)
from tests.support.postgres import ledger_query
from tests.support.stack import NOWHERE, StackHandle
from tests.support.waiting import wait_for

# A call: a two-word prompt and 50 tokens out: charged 52 tokens, and 0.1 USD at the prices
# below; it reserves its body's bytes, the overhead and 50 (about 200 tokens, 0.25 USD).
BODY = chat_about("hello there", max_tokens=50)
PRICE_IN, PRICE_OUT = 1000.0, 2000.0  # USD per million tokens: dear, so a few calls spend it
BUDGETS = {"tokens": "tokens_per_month = 1000", "usd": "usd_per_month = 1.5"}
FAULTS = ("restart", "flush", "off")  # off: the same calls and fault, no ledger (the control)
PART = 4  # calls spent before the fault
http = urllib3.PoolManager(retries=False, maxsize=8)
# Two stacks start before the first test: longer than a fast test may take.
pytestmark = pytest.mark.slow


def secret(name: str) -> str:
    return f"llmg-{name}-survives-secret"


def key_names() -> list[str]:
    roles = ("twin", "lost")
    return [f"{role}-{fault}-{budget}" for role in roles for fault in FAULTS for budget in BUDGETS]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _stack(runs_dir: Path, sim_url: str, kind: str, ledger: bool) -> Stack:
    folder = runs_dir / f"survives-{kind}-{'on' if ledger else 'off'}"
    folder.mkdir(mode=0o755)
    (folder / "llmgate.toml").write_text(
        priced_config(sim_url, version="survives-1", price_in=PRICE_IN, price_out=PRICE_OUT)
    )
    keys = [(name, BUDGETS[name.rsplit("-", 1)[1]]) for name in key_names()]
    (folder / "keys.toml").write_text(keys_toml(keys, secret))
    env = {
        "LLMGATE_CONFIG": str(folder / "llmgate.toml"),
        "LLMGATE_KEYS_FILE": str(folder / "keys.toml"),
        "LLMGATE_CACHE_MODE": "off",
    }
    if not ledger:
        env["LLMGATE_LEDGER_URL"] = "off"
    postgres = kind == "postgres" and ledger
    options = StackOptions(run_dir=folder / "run", env=env, upstream_url=NOWHERE, postgres=postgres)
    return Stack(options).start()


@pytest.fixture(scope="module")
def stacks(kind: str, runs_dir: Path, upstream_sim: str) -> Iterator[dict[bool, StackHandle]]:
    """The stack with its ledger, and the same without one (only the control uses it)."""
    require_binary("nginx")
    require_binary("memcached")
    if kind == "postgres":
        from tests.conftest import require_postgres

        require_postgres()
    made = {True: _stack(runs_dir, upstream_sim, kind, True)}
    try:
        made[False] = _stack(runs_dir, upstream_sim, kind, False)
        yield {ledger: StackHandle(stack) for ledger, stack in made.items()}
    finally:
        for stack in made.values():
            stack.stop(graceful=False)


def call(gw: StackHandle, key: str) -> int:
    resp = gw.post("/v1/chat/completions", BODY, headers={"Authorization": f"Bearer {secret(key)}"})
    if resp.status == 429:
        assert json.loads(resp.data)["error"]["code"] == "insufficient_quota", resp.data
    else:
        assert resp.status == 200, resp.data
    return resp.status


def until_refused(gw: StackHandle, key: str, most: int = 60) -> int:
    """Calls of ``key`` one after another until one is refused: how many were answered."""
    for n in range(most):
        if call(gw, key) == 429:
            return n
    raise AssertionError(f"{key} was never refused")


def spent(url: str, key: str, what: str) -> tuple[int, int]:
    """(rows, tokens or picodollars) of ``key`` in the ledger, read from the database."""
    column = "tokens" if what == "tokens" else "cost_pico"
    sql = f"SELECT COUNT(*), COALESCE(SUM({column}), 0) FROM llmgate_spend WHERE key_name = ?"
    rows, total = ledger_query(url, sql, (key,))[0]
    return int(rows), int(total)


def has_rows(url: str, key: str, rows: int) -> bool:
    return spent(url, key, "usd")[0] == rows


def month_counter(gw: StackHandle, key: str, what: str) -> int | None:
    window = limits.month("tokens_month" if what == "tokens" else "usd_month", time.time())
    port = int(gw.stack.memcached_addr.rsplit(":", 1)[1])
    raw = memcached_get(port, window.key(key))
    return None if raw is None else int(raw.strip())


def fault(gw: StackHandle, how: str) -> None:
    if how == "flush":
        flush_memcached(int(gw.stack.memcached_addr.rsplit(":", 1)[1]))
    else:  # restart (the control's fault too): a new, empty node where the old one was
        start_stack_memcached(gw.stack, stop_stack_memcached(gw.stack))


@pytest.mark.parametrize("what", list(BUDGETS))
@pytest.mark.parametrize("how", ["restart", "flush"])
def test_a_month_spent_in_part_is_refused_where_it_would_have_been(stacks, how, what) -> None:
    gw = stacks[True]
    url = gw.stack.ledger_url
    twin, lost = f"twin-{how}-{what}", f"lost-{how}-{what}"
    answered = until_refused(gw, twin)  # the point without a fault
    assert answered >= PART + 3
    for _ in range(PART):
        assert call(gw, lost) == 200
    # The ledger holds the part spent within a flush window (LLMGATE_LEDGER_FLUSH_S).
    assert wait_for(lambda: spent(url, lost, what)[0] == PART, timeout=10)
    fault(gw, how)
    assert month_counter(gw, lost, what) is None  # Memcached has forgotten the month
    assert PART + until_refused(gw, lost) == answered
    # Each key's month in the ledger is the same, and the lost key's counter holds it again.
    assert wait_for(lambda: spent(url, lost, what) == spent(url, twin, what), timeout=10)
    assert spent(url, lost, what)[0] == answered
    assert month_counter(gw, lost, what) == spent(url, lost, what)[1]


def test_without_a_ledger_the_fault_gives_the_month_back(stacks) -> None:
    """The negative control: the same calls and restart, no ledger: the key is let through
    further than its twin (what the issue measured on `make run`)."""
    gw = stacks[False]
    answered = until_refused(gw, "twin-off-tokens")
    for _ in range(PART):
        assert call(gw, "lost-off-tokens") == 200
    fault(gw, "restart")
    assert PART + until_refused(gw, "lost-off-tokens") > answered


def test_the_admin_usage_of_a_month_is_the_ledgers(stacks) -> None:
    gw = stacks[True]
    url = gw.stack.ledger_url
    # Two keys no other test of this stack uses (the "off" keys are the control's).
    for name, calls in (("twin-off-usd", 3), ("lost-off-usd", 2)):
        for _ in range(calls):
            assert call(gw, name) == 200
        assert wait_for(partial(has_rows, url, name, calls), timeout=10)
    month = time.strftime("%Y-%m", time.gmtime())
    resp = http.request("GET", f"{gw.url}/admin/usage?period={month}")
    assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
    report = json.loads(resp.data)
    assert report["source"] == "ledger" and report["from"] == f"{month}-01T00:00:00Z"
    by_key = {k["name"]: k for k in report["keys"]}
    names = ledger_query(url, "SELECT DISTINCT key_name FROM llmgate_spend")
    assert sorted(by_key) == sorted(name for (name,) in names) and len(by_key) >= 2
    for name, row in by_key.items():
        rows, tokens = spent(url, name, "tokens")
        assert (row["calls"], row["tokens"]) == (rows, tokens)
        assert row["usd"] == pytest.approx(spent(url, name, "usd")[1] / 1e12)
    (line,) = by_key["twin-off-usd"]["by"]
    assert (line["model"], line["upstream"], line["calls"]) == ("sim-model", "sim", 3)
    assert line["tokens_out"] == 150 and line["tokens_written"] == 0
    bad = http.request("GET", f"{gw.url}/admin/usage?period=2026-13")
    error = json.loads(bad.data)["error"]
    assert bad.status == 400 and error["param"] == "period"
    off = http.request("GET", f"{stacks[False].url}/admin/usage?period={month}")
    assert off.status == 404 and "ledger is off" in json.loads(off.data)["error"]["message"]
