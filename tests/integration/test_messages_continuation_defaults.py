"""On ``/v1/messages`` too, an upstream that sets no ``continuation`` continues by its kind's
own way: an Anthropic one by prefill, a Gemini one by a model turn, an OpenAI-compatible one
not at all (docs/streams.md, "On by kind"). The upstreams file names no continuation
(tests/support/kinds.py); the Anthropic SDK streams as users run it; the simulator cuts the
stream once (its connection reset after a few words) and counts the calls itself."""

from __future__ import annotations

import uuid

import anthropic
import pytest

from tests.support.kinds import NAMES
from tests.support.sim import sim_stats

TOKENS = 12


def ask(client: anthropic.Anthropic, kind: str, **sim: str) -> tuple[str, Exception | None]:
    """The joined text of a message stream, and the error that ended it (None: it ended
    well, with one message_stop: the SDK's final message has its stop reason)."""
    headers = {"x-sim-tokens": str(TOKENS), **{f"x-sim-{k}": v for k, v in sim.items()}}
    said: list[str] = []
    try:
        with client.messages.stream(
            model=f"m-{kind}",
            max_tokens=64,
            messages=[{"role": "user", "content": "Tell me about the sea."}],
            extra_headers=headers,
        ) as stream:
            said += list(stream.text_stream)
            assert stream.get_final_message().stop_reason == "end_turn"
    except (anthropic.APIError, anthropic.APIConnectionError) as exc:
        return "".join(said), exc
    return "".join(said), None


def continued(gw, kind: str) -> float:
    name = "llmgate_stream_continuations_total"
    return gw.metric(name, default=0.0, upstream=NAMES[kind], outcome="continued")


@pytest.mark.parametrize("kind", ["anthropic", "gemini", "openai"])
def test_a_cut_message_continues_where_the_kind_has_its_own_way(
    kinds_gw, anthropic_client, upstream_sim, kind
) -> None:
    whole, error = ask(anthropic_client, kind)
    assert error is None and len(whole.split()) == TOKENS
    asked, was = sim_stats(upstream_sim)["requests"], continued(kinds_gw, kind)
    cut = {"fault": "reset", "reset-after": "4", "fail-times": "1", "fail-key": uuid.uuid4().hex}
    said, error = ask(anthropic_client, kind, **cut)
    calls = sim_stats(upstream_sim)["requests"] - asked
    if kind == "openai":  # no continuation unless the upstream says how
        assert error is not None and said != whole and whole.startswith(said)
        assert calls == 1 and continued(kinds_gw, kind) == was
    else:
        assert error is None and said == whole  # one message, no word lost or repeated
        assert calls == 2 and continued(kinds_gw, kind) == was + 1
