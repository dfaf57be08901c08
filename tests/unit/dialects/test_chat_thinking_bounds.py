"""The output bound a caller gives bounds everything the upstream may generate, thinking
included (issue 41, C), as OpenAI's ``max_completion_tokens`` bounds a reasoning model's.

Each ``reasoning_effort`` over each kind, with the caller's own bound (``max_tokens`` or
``max_completion_tokens``), with a key's cap (sent as the grant sends it: the key's
``max_tokens`` put in the body by app/request/metering.py's ``with_output_cap``), and with no
bound at all (the upstream's own ``max_tokens`` setting for Anthropic; none for Gemini). The
body sent is the request translator's (app/dialects/request_to_anthropic.py, request_to_gemini.py),
read here as the upstream would read it: Anthropic's ``max_tokens`` counts the thinking
(``budget_tokens`` must be at least 1,024 and below it), Gemini's ``maxOutputTokens`` counts
the thoughts too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.errors import BadRequest
from app.dialects import anthropic, anthropic_door, gemini
from app.request import bounds, routes
from app.request.metering import with_output_cap
from app.upstream.catalog import UpstreamSpec

EFFORTS = ("low", "medium", "high")
BOUNDS = (50, 100, 1024, 1025, 2000, 5000, 100_000)
MESSAGES = [{"role": "user", "content": "Think hard: 6 x 7?"}]
UPSTREAM_MAX_TOKENS = UpstreamSpec("claude", "https://x/v1", kind="anthropic").max_tokens
DEFAULT_CEILING = 16384  # LLMGATE_DEFAULT_MAX_OUTPUT_TOKENS's default: a reservation's ceiling


def _bodies(effort: str, bound: int) -> dict[str, dict[str, Any]]:
    """The chat body as the upstream's translation receives it, each way the bound comes."""
    plain = {"model": "m", "messages": MESSAGES, "reasoning_effort": effort}
    raw = json.dumps(plain).encode()
    return {
        "max_tokens": {**plain, "max_tokens": bound},
        "max_completion_tokens": {**plain, "max_completion_tokens": bound},
        "key_cap": json.loads(with_output_cap(raw, plain, routes.CHAT, bound)),
    }


def _sent_anthropic(body: dict[str, Any]) -> tuple[int, int | None]:
    """(max_tokens, thinking budget or None) of the Messages request sent."""
    sent = anthropic.request_body(body, default_max_tokens=UPSTREAM_MAX_TOKENS)
    thinking = sent.get("thinking")
    return sent["max_tokens"], thinking["budget_tokens"] if thinking else None


def _sent_gemini(body: dict[str, Any]) -> tuple[int | None, int | None]:
    """(maxOutputTokens, thinkingBudget) of the Gemini request sent (None: not sent)."""
    config = gemini.request_body(body).get("generationConfig", {})
    return config.get("maxOutputTokens"), config.get("thinkingConfig", {}).get("thinkingBudget")


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("effort", EFFORTS)
def test_anthropic_never_gets_a_bound_above_the_callers_or_the_keys(
    effort: str, bound: int
) -> None:
    for how, body in _bodies(effort, bound).items():
        max_tokens, budget = _sent_anthropic(body)
        assert max_tokens == bound, how  # never raised by the thinking budget
        if budget is None:  # no room for Anthropic's least budget: no thinking
            assert bound < 1024 + 1, how
        else:
            assert 1024 <= budget < max_tokens, how
            assert budget == min({"low": 1024, "medium": 4096, "high": 16384}[effort], bound - 1)


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("effort", EFFORTS)
def test_gemini_never_gets_a_bound_above_the_callers_or_the_keys(effort: str, bound: int) -> None:
    for how, body in _bodies(effort, bound).items():
        max_output, budget = _sent_gemini(body)
        assert max_output == bound, how
        if budget is None:
            assert bound < 1024 + 1, how
        else:
            assert 1024 <= budget < bound, how
            assert budget == min({"low": 1024, "medium": 8192, "high": 24576}[effort], bound - 1)


@pytest.mark.parametrize("effort", EFFORTS)
def test_with_no_bound_the_upstreams_default_holds_the_thinking_within_the_reservation(
    effort: str,
) -> None:
    """No bound and no key cap: Anthropic is sent the upstream's max_tokens setting, the
    thinking budget inside it, never above what the call reserved (the default ceiling);
    Gemini is sent no maxOutputTokens (its model's own limit, thoughts inside), and the
    effort's budget."""
    body = {"model": "m", "messages": MESSAGES, "reasoning_effort": effort}
    reserved = bounds.output_bound(routes.CHAT, body, DEFAULT_CEILING)
    max_tokens, budget = _sent_anthropic(body)
    assert max_tokens == UPSTREAM_MAX_TOKENS <= reserved
    assert budget is not None and 1024 <= budget < max_tokens
    max_output, gemini_budget = _sent_gemini(body)
    assert max_output is None
    assert gemini_budget == {"low": 1024, "medium": 8192, "high": 24576}[effort]


@pytest.mark.parametrize(("max_tokens", "max_completion_tokens"), [(100, 50), (50, 100)])
def test_both_bounds_given_the_smaller_is_sent(max_tokens: int, max_completion_tokens: int) -> None:
    """The reservation counts one of them (app/request/bounds.py takes max_tokens first):
    the smaller is never above it."""
    body = {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "max_completion_tokens": max_completion_tokens,
    }
    assert bounds.output_bound(routes.CHAT, body, DEFAULT_CEILING) >= 50
    assert _sent_anthropic(body) == (50, None)
    assert _sent_gemini(body) == (50, None)


@pytest.mark.parametrize("value", ["50", 5.0, True, None])
def test_a_bound_that_is_no_integer_is_a_bad_request(value: Any) -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": value}
    if value is None:  # null is no bound
        assert _sent_anthropic(body) == (UPSTREAM_MAX_TOKENS, None)
        assert _sent_gemini(body) == (None, None)
        return
    for translate in (_sent_anthropic, _sent_gemini):
        with pytest.raises(BadRequest) as refused:
            translate(body)
        assert refused.value.param == "max_tokens"
        assert refused.value.message == "Invalid value for 'max_tokens': expected an integer."


def test_an_explicit_thinking_is_passed_on_as_the_caller_wrote_it() -> None:
    thinking = {"type": "enabled", "budget_tokens": 2000}
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 3000, "thinking": thinking}
    assert _sent_anthropic({**body, "reasoning_effort": "high"}) == (3000, 2000)


@pytest.mark.parametrize("budget", [1024, 8000])
def test_the_messages_door_sends_no_bound_above_the_callers_max_tokens(budget: int) -> None:
    """An Anthropic SDK caller's ``thinking`` budget, through the door to an OpenAI or a
    Gemini upstream: the caller's ``max_tokens`` is the bound sent, never raised by it."""
    body = {
        "model": "m",
        "max_tokens": 2000,
        "thinking": {"type": "enabled", "budget_tokens": budget},
        "messages": [{"role": "user", "content": "Think hard."}],
    }
    chat = anthropic_door.chat_body(body)
    assert chat["max_tokens"] == 2000
    assert not {"max_completion_tokens", "reasoning_effort", "thinking"} & chat.keys()
    assert _sent_gemini(chat) == (2000, None)
