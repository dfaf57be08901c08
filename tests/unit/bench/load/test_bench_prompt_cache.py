"""The prompt cache section's figures (issue 43): a row's input cost and spread come from the
simulator's per-account counts, and the goal figures compare cache-affine's row with
weighted random's and one upstream's of the same run (fabricated counts here, no process)."""

from __future__ import annotations

import json

import pytest

from bench.kit.report import Cell
from bench.load import agent_loop, prompt_cache
from bench.load.agent_loop import Calls
from bench.load.prompt_cache import AFFINE, GATEWAY, ONE, WEIGHTED


def got(first_token: list[float], accounts: dict[str, dict[str, int]]) -> dict[str, object]:
    return {"calls": Calls(first_token=first_token, errors=["one failed"]), "accounts": accounts}


def test_a_row_prices_what_the_accounts_read_wrote_and_computed() -> None:
    accounts = {
        "u1": {"requests": 6, "read": 1_000_000, "written": 200_000, "uncached": 100_000},
        "u2": {"requests": 3, "read": 0, "written": 0, "uncached": 300_000},
        "u3": {},  # an account that saw nothing is not in the simulator's counts
    }
    row = prompt_cache.row(AFFINE, GATEWAY, got([0.1, 0.3, 0.2], accounts), 2.0)
    assert len(row) == len(prompt_cache.COLUMNS)
    by = dict(zip(prompt_cache.COLUMNS, row, strict=True))
    assert (by["calls"], by["errors"]) == (4, 1)  # the answered and the failed
    assert by["first token p50 ms"] == pytest.approx(200)
    # 0.4 M computed at 3 USD, 1 M read at 0.30, 0.2 M written at 3.75 (USD per million)
    assert by["input USD"] == pytest.approx(1.2 + 0.3 + 0.75)
    assert by["input x weighted"] == pytest.approx(2.25 / 2.0)
    assert by["prompt read"] == pytest.approx(1.0 / 1.6)
    assert [by["u1 %"], by["u2 %"], by["u3 %"]] == pytest.approx([200 / 3, 100 / 3, 0])


def rows(affine_p50: float, affine_cost: float, shares: list[float]) -> dict:
    def one(routing: str, p50: float, cost: float, spread: list[float]) -> list[Cell]:
        return [routing, GATEWAY, 240, 0, p50, 900.0, cost, None, 0.8, *spread]

    return {
        (WEIGHTED, GATEWAY): one(WEIGHTED, 400.0, 2.0, [33.0, 33.0, 34.0]),
        (AFFINE, GATEWAY): one(AFFINE, affine_p50, affine_cost, shares),
        (ONE, GATEWAY): one(ONE, 180.0, 0.7, [100.0, 0.0, 0.0]),
    }


def test_the_goals_are_cache_affines_figures_over_the_other_rows() -> None:
    p50_random, p50_one, cost, spread = prompt_cache.checks(
        rows(200.0, 0.8, [40.0, 30.0, 30.0]), GATEWAY
    )
    assert (p50_random.op, p50_random.target, p50_random.measured) == ("<=", 0.5, 0.5)
    assert p50_one.target == 1.15 and p50_one.measured == pytest.approx(200 / 180)
    assert cost.target == 0.4 and cost.measured == pytest.approx(0.4)
    assert spread.target == 0.25 and spread.measured == pytest.approx(40 / (100 / 3) - 1)
    assert all(c.met for c in (p50_random, p50_one, cost, spread))
    missed = prompt_cache.checks(rows(205.0, 0.9, [45.0, 35.0, 20.0]), GATEWAY)
    assert [c.met for c in missed] == [False, True, False, False]
    assert missed[3].measured == pytest.approx(0.4)  # 20 % against a third: 0.4 below it


def test_the_agents_own_breakpoints_are_its_system_prompt_and_newest_message() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "r"},
    ]
    mark = {"type": "ephemeral"}
    assert agent_loop._marked(messages) == [
        {"role": "system", "content": [{"type": "text", "text": "s", "cache_control": mark}]},
        messages[1],
        messages[2],
        {"role": "user", "content": [{"type": "text", "text": "r", "cache_control": mark}]},
    ]


def test_only_a_chunks_content_counts_as_the_first_token() -> None:
    def chunk(delta: dict[str, str]) -> bytes:
        return b"data: " + json.dumps({"choices": [{"delta": delta}]}).encode()

    assert agent_loop._delta(chunk({"role": "assistant", "content": ""})) == ""
    assert agent_loop._delta(chunk({"content": "Hi"})) == "Hi"
    assert agent_loop._delta(b"data: [DONE]") == ""
    assert agent_loop._delta(b": keep-alive") == ""
