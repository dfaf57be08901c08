"""The OpenAI door over every kind of upstream: the OpenAI SDK, as users run it, against the
gateway (nginx, a gevent worker) whose upstreams are one simulator speaking Chat Completions,
Anthropic Messages and Gemini. The same scripted answer (simulator/scripts.py) asked through
each kind must come back as the same Python objects the OpenAI-kind upstream gives, streamed
and whole; the simulator's own counts say which dialect was asked, and how often.

What a translation cannot carry differs by kind and is named where it is compared
(``_comparable``): Gemini sends a tool call whole (one argument fragment), and neither
provider reports every usage detail the Chat Completions rendering has.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai
import pytest
import urllib3
from openai.lib.streaming.chat import ChatCompletionStreamState

from simulator import scripts
from tests.support.kinds import KINDS, NAMES
from tests.support.sim import sim_stats
from tests.support.stack import UPSTREAM

FINISHED = ("text", "tools", "thinking", "length", "filter")
MESSAGES: Any = [{"role": "user", "content": "hi"}]
http = urllib3.PoolManager(retries=False)


def _ask(client: openai.OpenAI, kind: str, script: str, stream: bool) -> Any:
    return client.chat.completions.create(
        model=f"m-{kind}",
        messages=MESSAGES,
        stream=stream,
        stream_options={"include_usage": True} if stream else None,
        extra_headers={"x-sim-script": script},
    )


def _comparable(dump: dict[str, Any], kind: str) -> dict[str, Any]:
    """A chunk's or completion's dump without what names the answer rather than says it
    (its id, time and model), and without the usage details a kind does not report."""
    dump = {k: v for k, v in dump.items() if k not in ("id", "created", "model")}
    usage = dump.get("usage")
    if isinstance(usage, dict):
        usage = dict(usage)
        if kind == "anthropic":  # no count of thinking tokens apart
            usage.pop("completion_tokens_details", None)
        if kind == "gemini":  # no count of tokens written to the prompt cache
            details = dict(usage.get("prompt_tokens_details") or {})
            details.pop("cache_write_tokens", None)
            usage["prompt_tokens_details"] = details
        dump["usage"] = usage
    for choice in dump.get("choices") or []:
        message = choice.get("message")
        if isinstance(message, dict) and "refusal" in message:
            message.pop("refusal")  # OpenAI's null refusal field: a translation writes none
    return dump


def _chunks(stream: Any, kind: str) -> list[dict[str, Any]]:
    return [_comparable(chunk.model_dump(exclude_unset=True), kind) for chunk in stream]


def _accumulated(stream: Any) -> tuple[Any, list[str]]:
    """The SDK's own accumulation of a stream (the snapshot ``client.chat.completions.stream``
    keeps; its final completion refuses a ``length`` or ``content_filter`` finish), and the
    text deltas in their order."""
    state = ChatCompletionStreamState()
    texts: list[str] = []
    for chunk in stream:
        state.handle_chunk(chunk)
        texts += [c.delta.content for c in chunk.choices if c.delta.content]
    return state.current_completion_snapshot, texts


@pytest.mark.parametrize("script", FINISHED)
@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_a_whole_answer_is_the_same_object_from_every_kind(openai_client, kind, script) -> None:
    want = _ask(openai_client, "openai", script, stream=False)
    got = _ask(openai_client, kind, script, stream=False)
    assert _comparable(got.model_dump(exclude_unset=True), kind) == _comparable(
        want.model_dump(exclude_unset=True), kind
    )
    assert got.id != want.id  # the provider's own answer, not a copy


@pytest.mark.parametrize("script", FINISHED)
def test_an_anthropic_stream_is_the_same_chunks_as_an_openai_one(openai_client, script) -> None:
    want = _chunks(_ask(openai_client, "openai", script, stream=True), "anthropic")
    got = _chunks(_ask(openai_client, "anthropic", script, stream=True), "anthropic")
    assert got == want


@pytest.mark.parametrize("script", FINISHED)
def test_a_gemini_stream_accumulates_to_the_same_completion(openai_client, script) -> None:
    want, want_texts = _accumulated(_ask(openai_client, "openai", script, stream=True))
    got, got_texts = _accumulated(_ask(openai_client, "gemini", script, stream=True))
    assert got_texts == want_texts  # text deltas one for one, in order
    assert _comparable(got.model_dump(exclude_unset=True), "gemini") == _comparable(
        want.model_dump(exclude_unset=True), "gemini"
    )


def test_parallel_tool_calls_with_long_arguments_async(kinds_gw) -> None:
    """AsyncOpenAI, stream and not: both calls, their ids, names and every fragment."""

    async def run(kind: str) -> tuple[list[Any], Any]:
        async with openai.AsyncOpenAI(
            base_url=kinds_gw.url + "/v1", api_key="k", max_retries=0
        ) as sdk:
            stream = await sdk.chat.completions.create(
                model=f"m-{kind}", messages=MESSAGES, stream=True,
                extra_headers={"x-sim-script": "tools"},
            )  # fmt: skip
            chunks = [chunk async for chunk in stream]
            whole = await sdk.chat.completions.create(
                model=f"m-{kind}", messages=MESSAGES, extra_headers={"x-sim-script": "tools"}
            )
            return chunks, whole

    expected = [
        ("call_sim_weather", "get_weather", scripts.WEATHER_ARGS),
        ("call_sim_time", "get_time", scripts.TIME_ARGS),
    ]
    for kind in KINDS:
        chunks, whole = asyncio.run(run(kind))
        calls: dict[int, list[str]] = {}
        fragments = 0
        for chunk in chunks:
            for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                slot = calls.setdefault(call.index, ["", "", ""])
                slot[0] += call.id or ""
                slot[1] += call.function.name or ""
                slot[2] += call.function.arguments or ""
                fragments += 1
        assert [(i, n, json.loads(a)) for i, n, a in calls.values()] == expected, kind
        # Anthropic streams the arguments as the model wrote them, in many fragments.
        assert fragments >= (4 if kind == "gemini" else 30), (kind, fragments)
        message = whole.choices[0].message
        assert [
            (c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls
        ] == expected, kind
        assert whole.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("kind", KINDS)
def test_a_mid_stream_overload_is_the_sdks_api_error_after_the_same_text(
    openai_client, kind
) -> None:
    # Anthropic and Gemini upstreams continue a broken stream by default; this script breaks
    # at the same place each time, so their continuations break too and the error comes
    # after the same text, none of it repeated.
    texts: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in _ask(openai_client, kind, "overload", stream=True):
            texts += [c.delta.content for c in chunk.choices if c.delta.content]
    assert "".join(texts) == "Working on it"
    assert caught.value.message == "Overloaded"


def test_errors_before_the_stream_are_openai_json_with_the_right_retry_word(kinds_gw) -> None:
    for kind, fault, status, retry in [
        ("anthropic", "529", 503, "true"),
        ("anthropic", "429", 429, "true"),
        ("anthropic", "401", 401, "false"),
        ("gemini", "503", 503, "true"),
        ("gemini", "401", 401, "false"),
    ]:
        resp = kinds_gw.post(
            "/v1/chat/completions",
            {"model": f"m-{kind}", "messages": MESSAGES},
            headers={"Content-Type": "application/json", "x-sim-fault": fault,
                     "x-stainless-retry-count": "9"},
        )  # fmt: skip
        error = json.loads(resp.data)["error"]
        assert (resp.status, resp.headers["x-should-retry"]) == (status, retry), (kind, fault)
        assert resp.headers["Content-Type"] == "application/json"
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


def test_a_request_a_kind_cannot_carry_is_a_400_naming_the_field(openai_client) -> None:
    for kind in ("anthropic", "gemini"):
        with pytest.raises(openai.BadRequestError) as caught:
            openai_client.chat.completions.create(model=f"m-{kind}", messages=MESSAGES, n=2)
        assert caught.value.code == "unsupported_by_upstream"
        assert caught.value.param == "n"


def test_other_routes_do_not_reach_the_other_kinds(kinds_gw, upstream_sim) -> None:
    before = sim_stats(upstream_sim)["requests_by_dialect"]
    resp = kinds_gw.post(
        "/v1/embeddings", {"model": "m-anthropic", "input": "x"},
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert resp.status == 404
    assert "do not serve /v1/embeddings" in json.loads(resp.data)["error"]["message"]
    assert sim_stats(upstream_sim)["requests_by_dialect"] == before


@pytest.mark.parametrize("kind", KINDS)
def test_translation_is_live_each_delta_leaves_as_it_arrives(kinds_gw, kind) -> None:
    """Through nginx, pieces a fifth of a second apart: the caller reads them spread out as
    the provider sent them, not all at once at the end (a buffering translator would give
    every delta within a few milliseconds of the last)."""
    resp = http.request(
        "POST",
        kinds_gw.url + "/v1/chat/completions",
        body=json.dumps({"model": f"m-{kind}", "messages": MESSAGES, "stream": True}),
        headers={"Content-Type": "application/json", "x-sim-script": "text", "x-sim-tps": "5"},
        preload_content=False,
    )
    assert resp.status == 200
    arrivals: list[float] = []
    buffer = b""
    for piece in resp.stream(1024):
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if b'"content":"' in event and b'"content":""' not in event:
                arrivals.append(time.monotonic())
    resp.release_conn()
    assert len(arrivals) == 6  # Hello, from, the, scripted, simulator, .
    # Five gaps of 0.2 s: the first delta came at least 0.5 s before the last.
    assert arrivals[-1] - arrivals[0] > 0.5, [round(t - arrivals[0], 3) for t in arrivals]
    assert sum(1 for t in arrivals if t < arrivals[0] + 0.3) <= 3


def test_the_answering_upstream_and_its_dialect_are_counted_once(kinds_gw, upstream_sim) -> None:
    before = sim_stats(upstream_sim)["requests_by_dialect"]
    for kind in KINDS:
        resp = kinds_gw.post(
            "/v1/chat/completions", {"model": f"m-{kind}", "messages": MESSAGES},
            headers={"Content-Type": "application/json", "x-sim-script": "text"},
        )  # fmt: skip
        assert resp.status == 200
        assert resp.headers[UPSTREAM] == NAMES[kind]
    after = sim_stats(upstream_sim)["requests_by_dialect"]
    assert {k: after.get(k, 0) - before.get(k, 0) for k in KINDS} == dict.fromkeys(KINDS, 1)


def test_a_malformed_message_is_the_callers_400_and_no_failure_of_the_upstream(kinds_gw) -> None:
    """A message that is not an object is refused by the translation before anything is
    sent: a 400 naming it, and the upstream's attempts count nothing failed."""
    for kind, name in [("anthropic", "claude"), ("gemini", "gem")]:
        failed = kinds_gw.metric(
            "llmgate_upstream_attempts_total", default=0.0, upstream=name, result="failed"
        )
        resp = kinds_gw.post(
            "/v1/chat/completions", {"model": f"m-{kind}", "messages": ["hi"]},
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        error = json.loads(resp.data)["error"]
        assert resp.status == 400 and error["param"] == "messages[0]", (kind, error)
        assert (
            kinds_gw.metric(
                "llmgate_upstream_attempts_total", default=0.0, upstream=name, result="failed"
            )
            == failed
        )
