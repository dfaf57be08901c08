"""An upstream that sets no ``continuation`` continues by its kind's own way: an Anthropic one
by prefill, a Gemini one by a model turn, an OpenAI-compatible one not at all
(docs/streams.md, "On by kind"). The upstreams file names no continuation (tests/support/
kinds.py); the OpenAI SDK reads the stream as users run it; the simulator cuts the stream
once (its connection reset after a few words) and counts the calls itself."""

from __future__ import annotations

import uuid

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.kinds import NAMES
from tests.support.sim import sim_stats

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about the sea."}]
TOKENS = 12


def ask(client: openai.OpenAI, kind: str, **sim: str) -> tuple[str, Exception | None]:
    """The joined text of a chat stream, and the error that ended it (None: it ended well)."""
    headers = {"x-sim-tokens": str(TOKENS), **{f"x-sim-{k}": v for k, v in sim.items()}}
    said: list[str] = []
    try:
        for chunk in client.chat.completions.create(
            model=f"m-{kind}", messages=MESSAGES, stream=True, extra_headers=headers
        ):
            said += [c.delta.content for c in chunk.choices if c.delta.content]
    except (openai.APIError, openai.APIConnectionError) as exc:
        return "".join(said), exc
    return "".join(said), None


def continued(gw, kind: str) -> float:
    name = "llmgate_stream_continuations_total"
    return gw.metric(name, default=0.0, upstream=NAMES[kind], outcome="continued")


@pytest.mark.parametrize("kind", ["anthropic", "gemini", "openai"])
def test_a_cut_stream_continues_where_the_kind_has_its_own_way(
    kinds_gw, openai_client, upstream_sim, kind
) -> None:
    whole, error = ask(openai_client, kind)
    assert error is None and len(whole.split()) == TOKENS
    asked, was = sim_stats(upstream_sim)["requests"], continued(kinds_gw, kind)
    cut = {"fault": "reset", "reset-after": "4", "fail-times": "1",
           "fail-key": uuid.uuid4().hex}  # fmt: skip
    said, error = ask(openai_client, kind, **cut)
    calls = sim_stats(upstream_sim)["requests"] - asked
    if kind == "openai":  # no continuation unless the upstream says how
        assert error is not None and said != whole and whole.startswith(said)
        assert calls == 1 and continued(kinds_gw, kind) == was
    else:
        assert error is None and said == whole  # one answer, no word lost or repeated
        assert calls == 2 and continued(kinds_gw, kind) == was + 1
