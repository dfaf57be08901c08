"""A stream cut after it started is continued on the next upstream of the plan, in the same
stream: counted by the two simulators themselves, read as raw bytes by the caller.

Two simulators, ``first`` and ``second`` in the upstreams file, serve the model ``m``; both
continue a partial answer with a ``prefix: true`` assistant turn (docs/streams.md). The
first is cut (its connection reset, or its own error event) after a few tokens, once (its
``fail_times``); the second writes the rest from where the cut left it (the simulator
continues its own words deterministically: simulator/continuing.py). The caller's joined
text must be the uncut answer's, with one ``[DONE]``, and the simulators' counts show each
call once. A third upstream in the plan, ``plain``, has ``continuation = "off"`` (its kind's
default continues an Anthropic one): it is never asked.
A garbled event (the simulator's ``malformed-after``) is a cut too; where no upstream
continues, it is what it was. Another model continues only where ``continues_models`` says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from llmgate_wire import sse
from simulator.text import words
from tests.support.continuing import (
    FAULTS,
    MAX_TOKENS,
    TIGHT,
    TOKENS,
    asked,
    charged,
    continuations,
    continued_turn,
    cut_once,
    http,
    keyed_stack,
    reset,
    secret,
    three_sims,
    upstreams,
)
from tests.support.sim import sim_requests
from tests.support.sse_reader import chat_stream, drop, read_data
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Iterator[dict[str, str]]:
    yield from three_sims(tmp_path_factory.mktemp("continue-sims"))


@pytest.fixture(scope="module")
def gw(make_stack, tmp_path_factory, sims):
    return keyed_stack(make_stack, tmp_path_factory, "continue-config", upstreams(sims))


@pytest.fixture(scope="module")
def claude_gw(make_stack, tmp_path_factory, sims):
    """The same plan of Anthropic-kind upstreams: the chat door's calls are translated, and
    continued with a prefill."""
    return keyed_stack(
        make_stack, tmp_path_factory, "continue-claude-config", upstreams(sims, "anthropic")
    )


def stream(
    gw, key: str = "meter", prompt: str = "go on", model: str = "m", **sim: str
) -> list[sse.Event]:
    """Every event of one chat stream (comments included), as the caller's bytes decode."""
    body = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}],
    }
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {secret(key)}",
        "x-sim-tokens": str(TOKENS),
        **{f"x-sim-{k}": v for k, v in sim.items()},
    }
    return chat_stream(http, gw.url, body, headers)


def chunks(events: list[sse.Event]) -> list[dict]:
    return [json.loads(e.data) for e in events if e.data and e.data != sse.DONE]


def garbled(events: list[sse.Event]) -> list[bytes]:
    """The raw bytes of each data event that is not JSON (nor ``[DONE]``)."""
    out = []
    for e in events:
        if e.data is not None and e.data != sse.DONE:
            try:
                json.loads(e.data)
            except ValueError:
                out.append(e.raw)
    return out


def text(events: list[sse.Event]) -> str:
    return "".join(
        c["delta"].get("content") or ""
        for chunk in chunks(events)
        for c in chunk.get("choices", [])
    )


def attempts(gw, upstream: str, result: str | None = None):
    """The gateway's count of ``upstream``'s attempts by ``result`` (all of them: a dict)."""
    name = "llmgate_upstream_attempts_total"
    if result is not None:
        return gw.metric(name, default=0.0, upstream=upstream, result=result)
    return {r: attempts(gw, upstream, r) for r in ("ok", "failed")}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_cut_stream_is_continued_on_the_next_upstream_as_one_stream(
    request, sims, fault, kind
) -> None:
    gw = request.getfixturevalue("gw" if kind == "openai" else "claude_gw")
    reset(sims)
    whole = stream(gw, prompt="uncut")
    reset(sims)
    was = continuations(gw, "continued")
    tried = {name: attempts(gw, name) for name in ("first", "second")}
    cut = stream(gw, prompt="uncut", **cut_once(fault))
    assert garbled(cut) == []  # the caller's bytes hold no event that is not JSON
    assert text(cut) == text(whole) and len(text(whole).split()) == TOKENS
    assert [e.data for e in cut].count(sse.DONE) == 1 and cut[-1].data == sse.DONE
    got = chunks(cut)
    assert {(c["id"], c["created"]) for c in got} == {(got[0]["id"], got[0]["created"])}
    finishes = [c["finish_reason"] for chunk in got for c in chunk["choices"]]
    assert [f for f in finishes if f] == ["stop"]
    notes = [i for i, e in enumerate(cut) if e.is_comment and e.comments != ("ping",)]
    assert len(notes) == 1, cut
    shown = len([e for e in cut[: notes[0]] if e.data is not None])  # the events before it
    assert cut[notes[0]].comments == (f"llmgate: continued; upstream=second; after={shown}",)
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    so_far = continued_turn(sims, kind)
    assert text(cut).startswith(so_far) and len(so_far.split()) == 4  # the 4 tokens sent
    # The usage is the two calls' sum: each one's prompt (the continuation's has the answer
    # so far in it), and every output token once.
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [got[-1]["usage"][name] for name in counts] == [1 + (1 + 4), TOKENS, 6 + TOKENS]
    assert continuations(gw, "continued") == was + 1
    # The log line names the try: the upstream that broke, where, and which took over.
    assert wait_for(lambda: [r for r in gw.log_records() if r.get("continuations")], 10)
    fact = [r for r in gw.log_records() if r.get("continuations")][-1]["continuations"]
    assert [{k: v for k, v in f.items() if k != "cut"} for f in fact] == [
        {"upstream": "first", "after_events": shown, "after_chars": len(so_far),
         "outcome": "continued", "to": "second"}
    ]  # fmt: skip
    # Each call is counted as the breakers count it: the cut one failed, the other ok.
    assert attempts(gw, "first", "failed") == tried["first"]["failed"] + 1
    assert attempts(gw, "second", "ok") == tried["second"]["ok"] + 1


def test_both_calls_are_billed_to_the_key(gw, sims) -> None:
    """With the upstream's running usage (known at the cut), the key is charged the sum of
    the two calls; without it (an estimate), each call's reservation stands, as for any
    answer whose usage the upstream did not report."""
    reset(sims)
    before = charged(gw, "meter")
    stream(gw, usage="every", **cut_once("reset"))
    so_far = continued_turn(sims)
    prompt = 2  # "go on"
    assert charged(gw, "meter") - before == prompt + (prompt + len(so_far.split())) + TOKENS
    before = charged(gw, "meter")
    stream(gw, usage="none")
    one = charged(gw, "meter") - before  # one call's reservation, standing
    before = charged(gw, "meter")
    reset(sims)
    stream(gw, **cut_once("reset"))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    assert charged(gw, "meter") - before == 2 * one


def test_no_continuation_when_the_key_has_no_room_for_another_call(gw, sims) -> None:
    """``tight`` has room for one call's reservation, not two: the cut ends the stream as it
    would without continuation, and the key keeps the one reservation."""
    reset(sims)
    was = continuations(gw, "no_reservation")
    cut = stream(gw, key="tight", **cut_once("reset"))
    assert sse.DONE not in [e.data for e in cut]
    assert "error" in chunks(cut)[-1], chunks(cut)[-1]
    assert asked(sims) == {"first": 1, "second": 0, "plain": 0}
    assert continuations(gw, "no_reservation") == was + 1
    assert 0 < charged(gw, "tight") <= TIGHT < 2 * charged(gw, "tight")


def test_no_continuation_without_room_in_the_retry_budget(make_stack, tmp_path_factory, sims):
    """The retry budget (no retry at all, here) counts a continuation as a retry."""
    no_room = keyed_stack(
        make_stack,
        tmp_path_factory,
        "continue-no-budget",
        upstreams(sims),
        LLMGATE_RETRY_BUDGET_PERCENT="0",
        LLMGATE_RETRY_BUDGET_MIN="0",
    )
    reset(sims)
    cut = stream(no_room, **cut_once("reset"))
    assert sse.DONE not in [e.data for e in cut]
    assert asked(sims) == {"first": 1, "second": 0, "plain": 0}
    assert continuations(no_room, "no_budget") == 1
    assert continuations(no_room, "continued") == 0


def test_a_continued_stream_is_cached_and_replayed_as_one_answer(
    make_stack, tmp_path_factory, sims
) -> None:
    """With the cache on, the continued stream is stored whole: the same call again is
    answered from it, the same text and usage with one [DONE], and no upstream is asked."""
    cached = keyed_stack(
        make_stack, tmp_path_factory, "continue-cached", upstreams(sims), LLMGATE_CACHE_MODE="all"
    )
    reset(sims)
    first = stream(cached, prompt="cache me", **cut_once("reset"))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    again = stream(cached, prompt="cache me", **cut_once("reset"))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}  # nobody asked again
    assert text(again) == text(first) and len(text(first).split()) == TOKENS
    assert [e.data for e in again].count(sse.DONE) == 1
    assert chunks(again)[-1]["usage"] == chunks(first)[-1]["usage"]


def test_a_resumed_caller_reads_the_continued_stream(make_stack, tmp_path_factory, sims) -> None:
    """A resumable stream whose caller left is read to its end for a resume: the cut and the
    continuation happen meanwhile, and the caller who comes back gets the continued rest."""
    resumable = keyed_stack(
        make_stack,
        tmp_path_factory,
        "continue-resumable",
        upstreams(sims),
        LLMGATE_RESUME_WINDOW_S="30",
    )
    reset(sims)
    whole = stream(resumable, prompt="resume me")
    reset(sims)
    lines = len(resumable.log_records())
    mine = {"Authorization": f"Bearer {secret('meter')}"}
    body = {"model": "m", "max_tokens": MAX_TOKENS, "stream": True,
            "messages": [{"role": "user", "content": "resume me"}]}  # fmt: skip
    sim = {f"x-sim-{k}": v for k, v in cut_once("reset").items()}
    resp = http.request("POST", resumable.url + "/v1/chat/completions", body=json.dumps(body),
                        headers={"Content-Type": "application/json", "X-LLMGate-Resumable": "true",
                                 "x-sim-tokens": str(TOKENS), "x-sim-tps": "50", **mine, **sim},
                        preload_content=False)  # fmt: skip
    sid = resp.headers["X-LLMGate-Stream-ID"]
    seen = read_data(resp, 2, cut=True)
    drop(resp)
    # The stream's log line is written once it is over (read to its end for the resume).
    assert wait_for(lambda: len(resumable.log_records()) > lines, 10)
    back = http.request("GET", resumable.url + f"/v1/streams/{sid}", preload_content=False,
                        headers={"Last-Event-ID": f"{sid}:2", **mine})  # fmt: skip
    assert back.status == 200, back.data
    rest = read_data(back, None)
    assert text(seen) + text(rest) == text(whole)
    assert [e.data for e in rest].count(sse.DONE) == 1
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}


def test_coalesced_callers_read_the_continued_stream(make_stack, tmp_path_factory, sims) -> None:
    """Two identical calls at once share one upstream call (coalescing, cache on): both read
    the continued answer, the simulator's own words for the prompt, and each upstream was
    asked once."""
    shared = keyed_stack(
        make_stack,
        tmp_path_factory,
        "continue-coalesced",
        upstreams(sims),
        LLMGATE_CACHE_MODE="all",
    )
    reset(sims)
    cut = {**cut_once("reset"), "ttft-ms": "300"}  # the same headers for both: one call

    def call(_: int) -> list[sse.Event]:
        return stream(shared, prompt="share me", **cut)

    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(call, range(2)))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    uncut = "".join(words("share me", TOKENS))
    assert [text(events) for events in both] == [uncut, uncut]
    assert all([e.data for e in events].count(sse.DONE) == 1 for events in both)


def test_no_fallback_tried_on_a_malformed_stream_is_not_this_gateway_s_shape(gw, sims) -> None:
    """The field's shape: a stream that sends a garbled chunk is relayed garbled, and no
    fallback is tried. Here the garbled chunk is a cut: the caller never gets its bytes,
    the next upstream is asked once, and the log names the cut."""
    reset(sims)
    cut = stream(gw, prompt="garbled", **cut_once("malformed-after"))
    assert garbled(cut) == [] and [e.data for e in cut].count(sse.DONE) == 1
    assert text(cut) == "".join(words("garbled", TOKENS))  # the simulator's own words
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    assert wait_for(lambda: [r for r in gw.log_records() if r.get("continuations")], 10)
    fact = [r for r in gw.log_records() if r.get("continuations")][-1]["continuations"]
    assert [(f["cut"], f["outcome"]) for f in fact] == [("upstream_protocol_error", "continued")]


@pytest.fixture(scope="module")
def still_gw(make_stack, tmp_path_factory, sims):
    """No upstream continues: ``m`` at an OpenAI-kind upstream (its kind's default), ``a`` at
    an Anthropic one whose continuation is set ``off`` (its kind's default continues)."""
    plan = f"""
[[upstreams]]
name = "oa"
base_url = "{sims["plain"]}/v1"
models = ["m"]

[[upstreams]]
name = "an"
kind = "anthropic"
base_url = "{sims["plain"]}/v1"
models = ["a"]
continuation = "off"
"""
    return keyed_stack(make_stack, tmp_path_factory, "continue-none", plan)


def test_without_continuation_a_malformed_event_is_relayed_as_before(still_gw, sims) -> None:
    """With no upstream that continues, a garbled chunk is what it was: an OpenAI-kind upstream's
    is relayed as it came, and the stream goes on to its [DONE]; an Anthropic-kind one's is
    dropped by the translation. The piece it carried is lost either way."""
    lost = words("garbled", TOKENS)
    del lost[4]  # the piece of slot 4, garbled
    for model, relayed in (("m", 1), ("a", 0)):
        reset(sims)
        got = stream(still_gw, prompt="garbled", model=model, **cut_once("malformed-after"))
        bad = garbled(got)
        assert len(bad) == relayed and all(b.startswith(b"data: {") for b in bad), bad
        rest = [e for e in got if e.raw not in bad]
        assert text(rest) == "".join(lost) and [e.data for e in got].count(sse.DONE) == 1
        assert asked(sims) == {"first": 0, "second": 0, "plain": 1}


@pytest.fixture(scope="module")
def models_gw(make_stack, tmp_path_factory, sims):
    """``first`` serves ``m`` and ``k`` and does not continue; ``second`` serves ``n`` only,
    and may continue ``m``'s answers with it (``continues_models``), not ``k``'s."""
    plan = f"""
[[upstreams]]
name = "first"
base_url = "{sims["first"]}/v1"
models = ["m", "k"]
headers = {{ "x-sim-fail-times" = "1" }}

[[upstreams]]
name = "second"
base_url = "{sims["second"]}/v1"
models = ["n"]
continuation = "prefix"
continues_models = ["m"]
headers = {{ "x-sim-fail-times" = "0" }}
"""
    return keyed_stack(make_stack, tmp_path_factory, "continue-models", plan)


def test_another_model_continues_only_where_the_operator_allows_it(models_gw, sims) -> None:
    """A cut ``k`` stream is not continued at ``second`` (it may continue ``m`` only): it
    ends with its error, and ``second`` is never asked. A cut ``m`` stream is continued
    there with ``n`` (the simulator's request log says so), and the caller's stream keeps
    its own ``model`` from end to end."""
    reset(sims)
    cut = stream(models_gw, prompt="other", model="k", **cut_once("reset"))
    assert sse.DONE not in [e.data for e in cut] and "error" in chunks(cut)[-1]
    assert asked(sims) == {"first": 1, "second": 0, "plain": 0}
    reset(sims)
    whole = stream(models_gw, prompt="other")
    reset(sims)
    got = stream(models_gw, prompt="other", **cut_once("reset"))
    assert text(got) == text(whole) and [e.data for e in got].count(sse.DONE) == 1
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    assert sim_requests(sims["second"])[0]["body"]["model"] == "n"
    assert {c["model"] for c in chunks(got)} == {c["model"] for c in chunks(whole)} == {"m"}
    assert continuations(models_gw, "continued") == 1
