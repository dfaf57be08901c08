"""A stream on the ``/v1/messages`` door cut after it started is continued as one Anthropic
message: read by the real ``anthropic`` SDK as users stream, and as raw bytes; counted by the
simulators themselves.

The plan (tests/support/continuing.py): ``first`` and ``second`` serve ``m`` and continue,
``plain`` between them does not. Of kind ``anthropic`` the door's named events are relayed as
they come, and a continuation is a prefill; of kind ``openai`` the upstream's chat chunks are
translated to them, and a continuation is a ``prefix: true`` assistant turn. ``first`` is cut
once after 4 tokens (a reset, its own error event: Anthropic's ``overloaded_error``, an idle
stall, a clean end without ``message_stop``, a garbled event); ``second`` writes the rest
(the simulator continues its own words deterministically: simulator/continuing.py). The
caller must read the uncut answer's text, in one message: one ``message_start``, the text
going on in the same block, one ``message_delta`` with the stop reason and the usage of both
calls, one ``message_stop``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import pytest

from llmgate_wire import sse
from simulator.scripts import TIME_ARGS, WEATHER_ARGS
from simulator.text import words
from tests.support.continuing import (
    ENV,
    FAULTS,
    MAX_TOKENS,
    MODES,
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
from tests.support.sdks import anthropic_sdk
from tests.support.sim import sim_requests
from tests.support.sse_reader import chat_stream, drop, read_data
from tests.support.stack import NOWHERE, file_stack
from tests.support.waiting import wait_for

KINDS = ["anthropic", "openai"]


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Iterator[dict[str, str]]:
    yield from three_sims(tmp_path_factory.mktemp("messages-continue-sims"))


@pytest.fixture(scope="module")
def gws(make_stack, tmp_path_factory, sims) -> dict:
    """A gateway over the plan, of each kind."""
    return {
        kind: keyed_stack(
            make_stack, tmp_path_factory, f"messages-continue-{kind}", upstreams(sims, kind)
        )
        for kind in KINDS
    }


def body(prompt: str, **more) -> dict:
    return {
        "model": "m",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
        **more,
    }


def headers(key: str = "meter", **sim: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "x-api-key": secret(key),
        "anthropic-version": "2023-06-01",
        "x-sim-tokens": str(TOKENS),
        **{f"x-sim-{k}": v for k, v in sim.items()},
    }


def stream(gw, prompt: str = "uncut", key: str = "meter", more=None, **sim) -> list[sse.Event]:
    """Every event of one /v1/messages stream (comments too), as the caller's bytes decode."""
    return chat_stream(
        http, gw.url, body(prompt, **(more or {})), headers(key, **sim), "/v1/messages"
    )


def named(events: list[sse.Event], kind: str | None = None) -> list[dict]:
    """The data of each named event (of ``kind``), parsed."""
    return [
        json.loads(e.data or "") for e in events if e.event and (kind is None or e.event == kind)
    ]


def text(events: list[sse.Event]) -> str:
    return "".join(d["delta"].get("text", "") for d in named(events, "content_block_delta"))


def sdk_stream(gw, prompt: str, **sim: str) -> tuple[str, anthropic.types.Message]:
    """The joined text and the final message, as the SDK streams them."""
    extra = {f"x-sim-{k}": v for k, v in sim.items()} | {"x-sim-tokens": str(TOKENS)}
    with (
        anthropic_sdk(gw.url, api_key=secret("meter")) as sdk,
        sdk.messages.stream(
            model="m",
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": prompt}],
            extra_headers=extra,
        ) as s,
    ):
        joined = "".join(s.text_stream)
        return joined, s.get_final_message()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_cut_message_stream_is_continued_as_one_message(gws, sims, fault, kind) -> None:
    """Each cut of each kind: the field's shape (no fallback tried on a cut, stalled or
    malformed stream) is not this door's: the next upstream that continues is asked once,
    and the caller reads the uncut text in one message, raw and through the SDK."""
    gw = gws[kind]
    reset(sims)
    whole = stream(gw)
    uncut = text(whole)
    assert len(uncut.split()) == TOKENS
    reset(sims)
    was = continuations(gw, "continued")
    cut = stream(gw, **cut_once(fault))
    # Raw bytes: one message, its text the uncut one's in one block, one end.
    assert [e.event for e in cut if e.data is not None and e.event is None] == []  # no garbled
    assert text(cut) == uncut
    kinds = [e.event for e in cut if e.event]
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    assert kinds[-1] == "message_stop" and "error" not in kinds
    assert [d["index"] for d in named(cut, "content_block_start")] == [0]
    assert [d["index"] for d in named(cut, "content_block_stop")] == [0]
    assert {d["index"] for d in named(cut, "content_block_delta")} == {0}
    (delta,) = named(cut, "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn"
    # The usage is the two calls': each one's prompt (the continuation's has the 4 words so
    # far in it), every output token once.
    assert delta["usage"]["output_tokens"] == TOKENS
    assert delta["usage"]["input_tokens"] == 1 + (1 + 4)
    notes = [e for e in cut if e.is_comment and e.comments != ("ping",)]
    assert len(notes) == 1 and notes[0].comments[0].startswith(
        "llmgate: continued; upstream=second"
    )
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    so_far = continued_turn(sims, kind)
    assert uncut.startswith(so_far) and len(so_far.split()) == 4
    assert continuations(gw, "continued") == was + 1
    # The log line names the try: the upstream that broke, where, and which took over.
    assert wait_for(lambda: [r for r in gw.log_records() if r.get("continuations")], 10)
    fact = [r for r in gw.log_records() if r.get("continuations")][-1]["continuations"]
    assert [(f["upstream"], f["after_chars"], f["outcome"], f["to"]) for f in fact] == [
        ("first", len(so_far), "continued", "second")
    ]
    # The SDK, as users stream: the same text, one message, its stop reason and usage.
    reset(sims)
    joined, final = sdk_stream(gw, "uncut", **cut_once(fault))
    assert joined == uncut and [b.text for b in final.content if b.type == "text"] == [uncut]
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (1 + (1 + 4), TOKENS)
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}


@pytest.mark.parametrize("kind", KINDS)
def test_both_calls_are_billed_to_the_key(gws, sims, kind) -> None:
    """The cut call's usage is never whole on this door (Anthropic's counts come at the
    finish): the key keeps each call's reservation, as for any answer whose usage the
    upstream did not report. Two calls the simulators answered, two reservations (one
    measured: a call whose upstream reports no usage, an OpenAI-kind one's, keeps it)."""
    gw = gws[kind]
    reset(sims)
    before = charged(gws["openai"], "meter")
    stream(gws["openai"], prompt="bill me", usage="none")
    one = charged(gws["openai"], "meter") - before  # one call's reservation, standing
    assert one > MAX_TOKENS
    reset(sims)
    before = charged(gw, "meter")
    stream(gw, prompt="bill me", **cut_once("reset"))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    assert charged(gw, "meter") - before == 2 * one


@pytest.mark.parametrize("kind", KINDS)
def test_no_continuation_when_the_key_has_no_room_for_another_call(gws, sims, kind) -> None:
    reset(sims)
    gw = gws[kind]
    was = continuations(gw, "no_reservation")
    cut = stream(gw, key="tight", **cut_once("reset"))
    assert [e.event for e in cut if e.event][-1] == "error"
    assert asked(sims) == {"first": 1, "second": 0, "plain": 0}
    assert continuations(gw, "no_reservation") == was + 1


def test_no_continuation_without_room_in_the_retry_budget(make_stack, tmp_path_factory, sims):
    """The retry budget (no retry at all, here) counts a continuation as a retry."""
    no_room = keyed_stack(
        make_stack,
        tmp_path_factory,
        "messages-no-budget",
        upstreams(sims, "anthropic"),
        LLMGATE_RETRY_BUDGET_PERCENT="0",
        LLMGATE_RETRY_BUDGET_MIN="0",
    )
    reset(sims)
    cut = stream(no_room, **cut_once("error-after"))
    kinds = [e.event for e in cut if e.event]
    assert kinds[-1] == "error" and "message_stop" not in kinds
    assert asked(sims) == {"first": 1, "second": 0, "plain": 0}
    assert continuations(no_room, "no_budget") == 1
    assert continuations(no_room, "continued") == 0


TOOLS = [
    {"name": "get_weather", "input_schema": {"type": "object"}},
    {"name": "get_time", "input_schema": {"type": "object"}},
]
IN_TEXT, IN_WEATHER = 2, 10  # the tools script's slots: 4 text pieces, then the calls' fragments


@pytest.mark.parametrize("kind", KINDS)
def test_the_blocks_after_the_cut_text_follow_it(gws, sims, kind) -> None:
    """The tools script (text, then two tool calls) cut inside its text: the continuation's
    text goes on in block 0, its tool_use blocks are 1 and 2, whole, and the message stops
    for its tool use."""
    gw = gws[kind]
    reset(sims)
    cut = stream(
        gw, "weather and time?", more={"tools": TOOLS}, script="tools", **cut_once("reset", IN_TEXT)
    )
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    assert text(cut) == "Let me check."
    starts = [(d["index"], d["content_block"]["type"]) for d in named(cut, "content_block_start")]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "tool_use")]
    assert sorted(d["index"] for d in named(cut, "content_block_stop")) == [0, 1, 2]
    args = {i: "" for i in (1, 2)}
    for d in named(cut, "content_block_delta"):
        if d["delta"]["type"] == "input_json_delta":
            args[d["index"]] += d["delta"]["partial_json"]
    assert [json.loads(args[i]) for i in (1, 2)] == [WEATHER_ARGS, TIME_ARGS]
    (delta,) = named(cut, "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert [e.event for e in cut if e.event].count("message_stop") == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("script", "slot", "why"), [("tools", IN_WEATHER, "tool_call"), ("thinking", 2, "thinking")]
)
def test_a_cut_inside_a_tool_call_or_thinking_ends_with_its_error(
    gws, sims, kind, script, slot, why
) -> None:
    """What cannot be continued is said: the stream ends with its error event, no other
    upstream is asked, and the outcome names why."""
    gw = gws[kind]
    reset(sims)
    was = continuations(gw, why)
    cut = stream(
        gw, "weather and time?", more={"tools": TOOLS}, script=script, **cut_once("reset", slot)
    )
    kinds = [e.event for e in cut if e.event]
    assert kinds[-1] == "error" and "message_stop" not in kinds
    assert asked(sims) == {"first": 1, "second": 0, "plain": 0}
    assert continuations(gw, why) == was + 1


@pytest.fixture(scope="module")
def still_gws(make_stack, tmp_path_factory, sims) -> dict:
    """No upstream continues: ``plain`` alone, of each kind, its ``continuation`` off (an
    Anthropic kind's default continues)."""
    plan = """
[[upstreams]]
name = "plain"
kind = "{kind}"
base_url = "{url}/v1"
models = ["m"]
continuation = "off"
"""
    return {
        kind: file_stack(
            make_stack,
            tmp_path_factory.mktemp(f"messages-still-{kind}"),
            plan.format(kind=kind, url=sims["plain"]),
            env=ENV,
            workers=1,
            upstream_url=NOWHERE,
        )
        for kind in KINDS
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["reset", "stall-after", "end-after"])
def test_without_continuation_a_cut_never_ends_as_a_clean_message(
    still_gws, sims, kind, fault
) -> None:
    """The field's shape, a cut stream ending as a clean 200 without its end event, is not
    this door's: with nothing to continue it, the caller's stream ends with an ``error``
    event after the part it had, never with a ``message_stop`` it did not earn."""
    reset(sims)
    cut = stream(still_gws[kind], **{**cut_once(fault), "fail-times": "1"})
    kinds = [e.event for e in cut if e.event]
    assert kinds[0] == "message_start" and kinds[-1] == "error", kinds
    assert "message_stop" not in kinds and "message_delta" not in kinds
    assert len(text(cut).split()) == 4
    assert asked(sims) == {"first": 0, "second": 0, "plain": 1}


@pytest.fixture(scope="module")
def cached(make_stack, tmp_path_factory, sims):
    """The Anthropic-kind plan with the cache on (which coalesces identical calls too)."""
    return keyed_stack(
        make_stack,
        tmp_path_factory,
        "messages-cached",
        upstreams(sims, "anthropic"),
        LLMGATE_CACHE_MODE="all",
    )


def test_a_continued_message_is_cached_and_replayed_as_one(cached, sims) -> None:
    """With the cache on, the continued message is stored whole: the same call again is
    answered from it (no upstream asked), one message with the same text and usage."""
    reset(sims)
    first = stream(cached, prompt="cache me", **cut_once("error-after"))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    again = stream(cached, prompt="cache me", **cut_once("error-after"))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}  # nobody asked again
    assert text(again) == text(first) and len(text(first).split()) == TOKENS
    kinds = [e.event for e in again if e.event]
    assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop"
    assert named(again, "message_delta") == named(first, "message_delta")


@pytest.fixture(scope="module")
def held_gws(make_stack, tmp_path_factory, sims) -> dict:
    """The plan with ``hold_tool_calls`` on the upstreams that continue, of each kind."""
    out = {}
    for kind in KINDS:
        mode = f'continuation = "{MODES[kind]}"\n'
        plan = upstreams(sims, kind).replace(mode, mode + "hold_tool_calls = true\n")
        folder = tmp_path_factory.mktemp(f"messages-held-{kind}")
        out[kind] = file_stack(make_stack, folder, plan, env=ENV, workers=1, upstream_url=NOWHERE)
    return out


def calls(events: list[sse.Event]) -> dict[int, str]:
    """Each tool_use block's arguments as the caller received them, by block index."""
    args = {
        d["index"]: ""
        for d in named(events, "content_block_start")
        if d["content_block"]["type"] == "tool_use"
    }
    for d in named(events, "content_block_delta"):
        if d["delta"]["type"] == "input_json_delta":
            args[d["index"]] += d["delta"]["partial_json"]
    return args


@pytest.mark.parametrize("kind", KINDS)
def test_a_cut_inside_a_held_tool_call_is_continued_whole(held_gws, sims, kind) -> None:
    """With ``hold_tool_calls``, the tools script cut inside its first call's arguments: the
    caller never saw part of it; the continuation, handed the text, writes both calls again,
    whole, as blocks 1 and 2 after the text's block 0."""
    reset(sims)
    cut = stream(
        held_gws[kind],
        "weather and time?",
        more={"tools": TOOLS},
        script="tools",
        **cut_once("reset", IN_WEATHER),
    )
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    assert continued_turn(sims, kind) == "Let me check."
    assert text(cut) == "Let me check."
    starts = [(d["index"], d["content_block"]["type"]) for d in named(cut, "content_block_start")]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "tool_use")]
    assert {i: json.loads(a) for i, a in calls(cut).items()} == {1: WEATHER_ARGS, 2: TIME_ARGS}
    kinds = [e.event for e in cut if e.event]
    assert kinds.count("message_start") == kinds.count("message_stop") == 1
    (delta,) = named(cut, "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_coalesced_callers_read_the_continued_message(cached, sims) -> None:
    """Two identical calls at once share one upstream call: both read the continued
    message, the simulator's own words for the prompt, and each upstream was asked once."""
    reset(sims)
    cut = {**cut_once("reset"), "ttft-ms": "300"}  # the same headers for both: one call
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: stream(cached, prompt="share me", **cut), range(2)))
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    uncut = "".join(words("share me", TOKENS))
    assert [text(events) for events in both] == [uncut, uncut]
    for events in both:
        kinds = [e.event for e in events if e.event]
        assert kinds.count("message_start") == kinds.count("message_stop") == 1


def test_a_resumed_caller_reads_the_continued_message(make_stack, tmp_path_factory, sims):
    """A resumable message stream whose caller left is read to its end for a resume: the
    cut and the continuation happen meanwhile, and the caller who comes back gets the
    continued rest, one message_stop."""
    resumable = keyed_stack(
        make_stack,
        tmp_path_factory,
        "messages-resumable",
        upstreams(sims, "anthropic"),
        LLMGATE_RESUME_WINDOW_S="30",
    )
    reset(sims)
    uncut = text(stream(resumable, prompt="resume me"))
    reset(sims)
    lines = len(resumable.log_records())
    sent = {**headers(**cut_once("reset"), tps="50"), "X-LLMGate-Resumable": "true"}
    resp = http.request(
        "POST",
        resumable.url + "/v1/messages",
        body=json.dumps(body("resume me")),
        headers=sent,
        preload_content=False,
    )
    sid = resp.headers["X-LLMGate-Stream-ID"]
    seen = read_data(resp, 4, cut=True)
    drop(resp)
    assert wait_for(lambda: len(resumable.log_records()) > lines, 10)
    back = http.request(
        "GET",
        resumable.url + f"/v1/streams/{sid}",
        headers={"Last-Event-ID": f"{sid}:4", "x-api-key": secret("meter")},
        preload_content=False,
    )
    assert back.status == 200, back.data
    rest = read_data(back, None)
    assert text(seen) + text(rest) == uncut and len(uncut.split()) == TOKENS
    assert [e.event for e in seen + rest].count("message_stop") == 1
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}


# The other modes on this door: Gemini's own way, and the instruction (its repeat trimmed).
PLANS = [("gemini", "model_turn"), ("openai", "instruction"), ("anthropic", "instruction")]


@pytest.fixture(scope="module")
def mode_gws(make_stack, tmp_path_factory, sims) -> dict:
    return {
        (kind, mode): keyed_stack(
            make_stack, tmp_path_factory, f"messages-{kind}-{mode}", upstreams(sims, kind, mode)
        )
        for kind, mode in PLANS
    }


@pytest.mark.parametrize(("kind", "mode"), PLANS)
@pytest.mark.parametrize("fault", FAULTS)
def test_the_other_modes_continue_a_message_as_one(mode_gws, sims, kind, mode, fault) -> None:
    """A Gemini-kind upstream continues from a model turn; any kind from an instruction,
    after which the simulator repeats the answer's last words: not relayed twice."""
    gw = mode_gws[kind, mode]
    reset(sims)
    uncut = text(stream(gw))
    assert len(uncut.split()) == TOKENS
    reset(sims)
    cut = stream(gw, **cut_once(fault))
    assert text(cut) == uncut
    kinds = [e.event for e in cut if e.event]
    assert kinds.count("message_start") == kinds.count("message_stop") == 1
    assert kinds[-1] == "message_stop" and "error" not in kinds
    assert {d["index"] for d in named(cut, "content_block_delta")} == {0}
    (delta,) = named(cut, "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert asked(sims) == {"first": 1, "second": 1, "plain": 0}
    turns = sim_requests(sims["second"])[0]["body"]
    if mode == "instruction":
        assert turns["messages"][-1]["role"] == "user"
    else:
        usage = delta["usage"]
        assert (usage["input_tokens"], usage["output_tokens"]) == (1 + (1 + 4), TOKENS)
