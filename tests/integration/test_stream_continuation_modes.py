"""The chat door's continuation in two more modes (docs/streams.md): a Gemini-kind upstream's
``model_turn`` (the answer so far as the request's last content, a model turn), and
``instruction`` (the answer so far as a whole assistant turn, then a user turn asking to go
on), on each kind, its repeat of the answer's end trimmed.

As in test_stream_continuation.py: two simulators, ``first`` and ``second``, serve the model
``m`` and continue; ``first`` is cut once (its ``fail_times``) after 4 words, by each cut;
``second`` writes the rest (simulator/continuing.py: after an instruction it repeats the
answer's last words first, deterministically). The caller reads the stream as raw bytes and
through the OpenAI SDK: the joined text is the uncut answer's, one ``[DONE]``, one finish,
the usage the documented sum; each simulator counts its call once; the key pays both calls.
A third upstream, ``plain`` (model ``p``, not continued), gives one cut call's reservation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from llmgate_wire import sse
from simulator import continuing
from simulator import text as sim_text
from tests.support.continuing import (
    ENV,
    FAULTS,
    MAX_TOKENS,
    TOKENS,
    asked,
    cut_once,
    http,
    reset,
    three_sims,
    upstreams,
)
from tests.support.keys_file import keys_toml
from tests.support.sdks import openai_sdk
from tests.support.sim import sim_requests
from tests.support.sse_reader import chat_stream
from tests.support.stack import NOWHERE, file_stack

CUTS = FAULTS
# (kind, mode) of each stack: Gemini's own way, and the instruction on every kind.
PLANS = [("gemini", "model_turn"), ("openai", "instruction"), ("anthropic", "instruction")]
PLANS += [("gemini", "instruction")]
SECRET = "llmg-meter-modes-secret"
# ``plain`` serves another model and is cut once too: a cut call nobody continues.
PLAIN = ("p", 1)


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Iterator[dict[str, str]]:
    yield from three_sims(tmp_path_factory.mktemp("modes-sims"))


@pytest.fixture(scope="module")
def stacks(make_stack, tmp_path_factory, sims):
    """One gateway per plan, started when a test first asks for it."""
    made: dict[tuple[str, str], object] = {}

    def get(kind: str, mode: str):
        if (kind, mode) not in made:
            made[kind, mode] = file_stack(
                make_stack,
                tmp_path_factory.mktemp(f"modes-{kind}-{mode}"),
                upstreams(sims, kind, mode, plain=PLAIN),
                keys=keys_toml([("meter", "tokens_per_day = 100000000")], lambda _: SECRET),
                env=ENV,
                workers=1,
                upstream_url=NOWHERE,
            )
        return made[kind, mode]

    return get


def sim_headers(**sim: str) -> dict[str, str]:
    return {"x-sim-tokens": str(TOKENS), **{f"x-sim-{k}": v for k, v in sim.items()}}


def body(prompt: str, model: str = "m") -> dict:
    return {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}],
    }


def stream(gw, prompt: str, model: str = "m", **sim: str) -> list[sse.Event]:
    """Every event of one chat stream (comments included), as the caller's bytes decode."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {SECRET}"}
    return chat_stream(http, gw.url, body(prompt, model), {**headers, **sim_headers(**sim)})


def chunks(events: list[sse.Event]) -> list[dict]:
    return [json.loads(e.data) for e in events if e.data and e.data != sse.DONE]


def text(events: list[sse.Event]) -> str:
    got = chunks(events)
    return "".join(c["delta"].get("content") or "" for k in got for c in k.get("choices", []))


def continued_request(sims: dict[str, str], kind: str) -> tuple[list[tuple[str, str]], int]:
    """The turns ``second`` was asked (its own request log: each (role, text)) and the
    prompt's tokens as the simulator counts them."""
    sent = sim_requests(sims["second"])[0]["body"]
    if kind == "gemini":
        turns = [(c["role"], sim_text.gemini_prompt(None, [c])) for c in sent["contents"]]
    else:
        turns = [(m["role"], sim_text.chat_prompt([m])) for m in sent["messages"]]
    return turns, sim_text.word_count("\n".join(t for _, t in turns))


def continued(gw) -> float:
    name = "llmgate_stream_continuations_total"
    return gw.metric(name, default=0.0, upstream="first", outcome="continued")


def charged(gw) -> int:
    resp = http.request("GET", gw.url + "/admin/usage")
    return {k["name"]: k for k in json.loads(resp.data)["keys"]}["meter"]["tokens_today"] or 0


@pytest.mark.parametrize("fault", CUTS)
@pytest.mark.parametrize(("kind", "mode"), PLANS)
def test_a_cut_stream_is_continued_in_the_upstream_s_mode(stacks, sims, kind, mode, fault):
    gw = stacks(kind, mode)
    reset(sims)
    whole = stream(gw, "uncut")
    assert len(text(whole).split()) == TOKENS
    reset(sims)
    was = continued(gw)
    cut = stream(gw, "uncut", **cut_once(fault))
    assert text(cut) == text(whole)  # no word lost, none repeated
    assert [e.data for e in cut].count(sse.DONE) == 1 and cut[-1].data == sse.DONE
    got = chunks(cut)
    assert {(c["id"], c["created"]) for c in got} == {(got[0]["id"], got[0]["created"])}
    assert [c["finish_reason"] for k in got for c in k["choices"] if c["finish_reason"]] == ["stop"]
    notes = [e.comments for e in cut if e.is_comment and e.comments != ("ping",)]
    assert len(notes) == 1 and "upstream=second" in notes[0][0], notes
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    turns, prompt = continued_request(sims, kind)
    so_far = " ".join(text(whole).split()[:4])
    if mode == "model_turn":
        assert turns[-1] == ("model", so_far)
        written = TOKENS - 4
    else:
        assert turns[-2][1] == so_far and turns[-1][0] == "user"
        assert "exactly where it stopped" in turns[-1][1]
        written = TOKENS - 4 + len(continuing.repeated(so_far))  # the repeat is billed
    # The documented sum: the cut call's prompt estimated (the continuation's less the
    # answer so far), every output token the two calls wrote.
    usage = got[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        prompt - 4 + prompt,
        4 + written,
    )
    assert continued(gw) == was + 1


@pytest.mark.parametrize("fault", CUTS)
@pytest.mark.parametrize(("kind", "mode"), [("gemini", "model_turn"), ("openai", "instruction")])
def test_the_openai_sdk_reads_one_answer(stacks, sims, kind, mode, fault) -> None:
    """The OpenAI SDK, streaming: the continuation's comment skipped, one answer's text, its
    finish and usage, under one id."""
    gw = stacks(kind, mode)

    def read(**sim: str) -> tuple[str, list[str], dict, set[str]]:
        with openai_sdk(gw.url, api_key=SECRET) as sdk:
            got = list(sdk.chat.completions.create(**body("sdk"), extra_headers=sim_headers(**sim)))
        said = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
        finishes = [c.choices[0].finish_reason for c in got if c.choices]
        usage = [c.usage for c in got if c.usage is not None]
        assert len(usage) == 1
        return said, [f for f in finishes if f], usage[0].model_dump(), {c.id for c in got}

    reset(sims)
    whole, _, _, _ = read()
    reset(sims)
    said, finishes, usage, ids = read(**cut_once(fault))
    assert said == whole and len(whole.split()) == TOKENS
    assert finishes == ["stop"] and len(ids) == 1
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    _, prompt = continued_request(sims, kind)
    assert usage["prompt_tokens"] == 2 * prompt - 4


@pytest.mark.parametrize(("kind", "mode"), [("gemini", "model_turn"), ("openai", "instruction")])
def test_the_key_pays_both_calls(stacks, sims, kind, mode) -> None:
    """The cut call's usage is an estimate (the simulator reports it at the end only), so
    the key keeps both calls' reservations: twice what a cut stream not continued keeps
    (``plain``'s, for a request of the same size)."""
    gw = stacks(kind, mode)
    reset(sims)
    before = charged(gw)
    lost = stream(gw, "pay me", model="p", **cut_once("reset"))
    assert sse.DONE not in [e.data for e in lost] and "error" in chunks(lost)[-1]
    one = charged(gw) - before
    assert one > 0 and asked(sims) == {"first": 0, "second": 0, "plain": 1}
    reset(sims)
    before = charged(gw)
    stream(gw, "pay me", **cut_once("reset"))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    assert charged(gw) - before == 2 * one
