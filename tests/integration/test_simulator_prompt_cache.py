"""The simulator's prompt cache over real TCP (simulator/prompt_cache.py): each dialect's usage
names what the account's cache did with the prompt (OpenAI's ``cached_tokens``, Anthropic's
reads and writes with their split by lifetime, Gemini's ``cachedContentTokenCount``), the
prefill time of the words computed delays the first token and a cached word costs almost
none, each key is its own account, and /sim/stats counts it all per account. Lower bounds
on time only, and an upper one far from the figures."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.sim import SimProcess

pytestmark = pytest.mark.usefixtures("fresh_sim")
CACHE = {"x-sim-prompt-cache": "1", "x-sim-cache-min-tokens": "256"}
ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "acct-1", **CACHE}


def _words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


def _post(sim: SimProcess, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    status, _, data = sim.send("POST", path, body, headers)
    assert status == 200, data
    return json.loads(data)


def test_openai_reports_its_reads_and_each_key_is_an_account(sim: SimProcess) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": _words(700, "w")}]}
    key_a = {"Authorization": "Bearer key-a", **CACHE}
    first = _post(sim, "/v1/chat/completions", body, key_a)["usage"]
    assert first["prompt_tokens"] == 700 and first["prompt_tokens_details"]["cached_tokens"] == 0
    again = _post(sim, "/v1/chat/completions", body, key_a)["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == 640  # 5 steps of 128
    other = _post(sim, "/v1/chat/completions", body, {**key_a, "Authorization": "Bearer key-b"})
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    responses = {"model": "m", "input": _words(700, "w")}
    _post(sim, "/v1/responses", responses, key_a)  # the same words: the same prefix
    usage = _post(sim, "/v1/responses", responses, key_a)["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == 640
    counts = sim.stats()["prompt_cache"]
    assert sorted(c["requests"] for c in counts.values()) == [1, 4]
    assert "key-a" not in json.dumps(counts)  # accounts by a digest of their key


def test_anthropic_reports_reads_and_writes_only_up_to_its_marks(sim: SimProcess) -> None:
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": _words(400, "s"), "cache_control": mark}]
    turn: list[Any] = [{"role": "user", "content": _words(100, "u")}]
    body = {"model": "m", "max_tokens": 5, "system": system, "messages": turn}
    first = _post(sim, "/v1/messages", body, ANTHROPIC)["usage"]
    assert first == {
        "input_tokens": 100,
        "cache_creation_input_tokens": 400,
        "cache_read_input_tokens": 0,
        "output_tokens": 5,
        "cache_creation": {"ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 0},
    }
    turn += [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": _words(50, "a"), "cache_control": mark}],
        },
        {"role": "user", "content": _words(30, "v")},
    ]
    second = _post(sim, "/v1/messages", body, ANTHROPIC)["usage"]
    assert (second["cache_read_input_tokens"], second["cache_creation_input_tokens"]) == (400, 150)
    assert second["input_tokens"] == 30
    # With no mark at all Anthropic reads nothing, though the same words are stored.
    plain = [{**m, "content": _words(50, "a")} if m["role"] == "assistant" else m for m in turn]
    unmarked = {**body, "system": _words(400, "s"), "messages": plain}
    usage = _post(sim, "/v1/messages", unmarked, ANTHROPIC)["usage"]
    assert (usage["cache_read_input_tokens"], usage["input_tokens"]) == (0, 580)


def test_gemini_reports_its_implicit_reads(sim: SimProcess) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": _words(300, "g")}]}]}
    headers = {"x-goog-api-key": "g-1", **CACHE}
    path = "/v1beta/models/gemini-x:generateContent"
    assert "cachedContentTokenCount" not in _post(sim, path, body, headers)["usageMetadata"]
    assert _post(sim, path, body, headers)["usageMetadata"]["cachedContentTokenCount"] == 256


def test_prefill_time_is_paid_for_computed_words_only(sim: SimProcess) -> None:
    """3,000 words at 200 us each: 0.6 s the first time; read back, 3,000 x 2 % x 200 us
    (12 ms) and the 56 words past the last step."""
    body = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": _words(3000, "p")}],
    }
    headers = {"Authorization": "Bearer p", "x-sim-prefill-us": "200", **CACHE}

    def first_token() -> float:
        started = time.monotonic()
        status, _, data = sim.send("POST", "/v1/chat/completions", body, headers)
        assert status == 200 and b"[DONE]" in data
        return time.monotonic() - started

    cold, warm = first_token(), first_token()
    assert cold >= 0.6 and warm < 0.3, (cold, warm)
    # With the cache off, the prefill is paid every time.
    off = {**headers, "x-sim-prompt-cache": "0"}
    started = time.monotonic()
    sim.send("POST", "/v1/chat/completions", body, off)
    assert time.monotonic() - started >= 0.6


def test_a_reset_empties_the_caches(sim: SimProcess) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": _words(300, "r")}]}
    headers = {"Authorization": "Bearer r", **CACHE}
    _post(sim, "/v1/chat/completions", body, headers)
    sim.reset()
    usage = _post(sim, "/v1/chat/completions", body, headers)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert list(sim.stats()["prompt_cache"].values()) == [
        {"requests": 1, "read": 0, "written": 0, "written_1h": 0, "uncached": 300}
    ]
