"""Stream ↔ non-stream conversions of cached answers, checked against the openai SDK's own types,
its SSE parsing and its chunk accumulator, on stored raw streams and on random texts."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.cache import chunks as streaming
from app.cache import shapes
from app.cache.shapes import ShapeError
from llmgate_wire import sse
from tests.conftest import ROOT

STREAMS = ROOT / "tests" / "data" / "shapes"
CASES = sorted(p.stem for p in STREAMS.glob("*.sse"))


# --- helpers --------------------------------------------------------------------------------


def _split_events(raw: bytes) -> list[bytes]:
    """A raw stream as the cache stores it: one element per event."""
    return [event.raw for event in sse.Decoder().feed(raw)]


def _chunks(events: list[bytes]) -> list[dict[str, Any]]:
    decoded = sse.Decoder().feed(b"".join(events))
    assert decoded[-1].is_done
    return [event.json() for event in decoded[:-1]]


def _sdk_stream(events: list[bytes], *, legacy: bool = False) -> list[Any]:
    """The events served to the real openai client (its HTTP, SSE and chunk parsing)."""
    body = b"".join(events)

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    client = openai.OpenAI(
        api_key="sk-test", base_url="http://upstream.test/v1", max_retries=0, http_client=http
    )
    with client:
        if legacy:
            return list(client.completions.create(model="m", prompt="p", stream=True))
        messages: Any = [{"role": "user", "content": "hi"}]
        return list(client.chat.completions.create(model="m", messages=messages, stream=True))


def _sdk_accumulated(events: list[bytes]) -> list[dict[str, Any]]:
    """What the SDK's own accumulator makes of a chat stream, per choice."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in _sdk_stream(events):
        state.handle_chunk(chunk)
    final = state.current_completion_snapshot  # get_final_completion() refuses "length"
    return [
        {
            "content": choice.message.content,
            "refusal": choice.message.refusal,
            "tool_calls": [
                (call.id, call.function.name, call.function.arguments)
                for call in choice.message.tool_calls or []
            ],
            "finish_reason": choice.finish_reason,
        }
        for choice in final.choices
    ]


def _summary(completion: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "content": choice["message"]["content"],
            "refusal": choice["message"]["refusal"],
            "tool_calls": [
                (call["id"], call["function"]["name"], call["function"]["arguments"])
                for call in choice["message"].get("tool_calls", [])
            ],
            "finish_reason": choice["finish_reason"],
        }
        for choice in completion["choices"]
    ]


def _normalised_chat(completion: dict[str, Any]) -> dict[str, Any]:
    """The documented normalisation of a round trip (see the shapes module docstring)."""
    out = copy.deepcopy(completion)
    out.setdefault("usage", None)
    for choice in out["choices"]:
        message = choice["message"]
        message["refusal"] = message.get("refusal") or None
        message.setdefault("content", None)
        if message["content"] == "" and (
            message.get("tool_calls") or message.get("function_call") or message["refusal"]
        ):
            message["content"] = None
        for key in ("annotations", "tool_calls", "function_call", "audio"):
            if not message.get(key):
                message.pop(key, None)
    return out


def _check_chat_events(events: list[bytes]) -> list[dict[str, Any]]:
    assert events[-1] == sse.DONE_EVENT
    chunks = _chunks(events)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    return chunks


def _chat(*choices: dict[str, Any], usage: dict[str, int] | None = None) -> dict[str, Any]:
    completion = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1743670000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": i, "logprobs": None, **c} for i, c in enumerate(choices)],
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": "fp_test",
    }
    ChatCompletion.model_validate(completion)
    return completion


def _message(content: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "refusal": None, **fields}


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _legacy(*choices: dict[str, Any], usage: dict[str, int] | None = None) -> dict[str, Any]:
    completion = {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": 1743670000,
        "model": "gpt-3.5-turbo-instruct",
        "choices": [{"index": i, "logprobs": None, **c} for i, c in enumerate(choices)],
        "usage": usage,
    }
    Completion.model_validate(completion)
    return completion


USAGE = {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46}
ARGS_PARIS = '{"location": "Paris, France", "unit": "celsius", "days": [1, 2, 3]}'
TOKENS = [" Hello", ",", " wor", "ld", "!"]
LOGPROBS = {
    "content": [
        {"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": []} for t in TOKENS
    ],
    "refusal": None,
}

CHAT_CASES = {
    "text": _chat(
        {
            "message": _message("The quick brown fox jumps over the lazy dog.\n\nTwice!"),
            "finish_reason": "stop",
        }
    ),
    "text_usage": _chat({"message": _message("Short."), "finish_reason": "stop"}, usage=USAGE),
    "empty": _chat({"message": _message(""), "finish_reason": "length"}, usage=USAGE),
    "two_choices": _chat(
        {
            "message": _message("First answer, a bit longer than the other."),
            "finish_reason": "stop",
        },
        {"message": _message("Second."), "finish_reason": "length"},
        usage=USAGE,
    ),
    "parallel_tools": _chat(
        {
            "message": _message(
                None,
                tool_calls=[
                    _tool_call("call_a1", "get_weather", ARGS_PARIS),
                    _tool_call("call_b2", "get_time", '{"tz":"Europe/Paris"}'),
                ],
            ),
            "finish_reason": "tool_calls",
        },
        usage=USAGE,
    ),
    "text_and_tool": _chat(
        {
            "message": _message("Let me check.", tool_calls=[_tool_call("c", "f", "{}")]),
            "finish_reason": "tool_calls",
        }
    ),
    "function_call": _chat(
        {
            "message": _message(None, function_call={"name": "f", "arguments": ARGS_PARIS}),
            "finish_reason": "function_call",
        }
    ),
    "refusal": _chat(
        {
            "message": {"role": "assistant", "content": None, "refusal": "I can't help with that."},
            "finish_reason": "stop",
        }
    ),
    "logprobs": _chat(
        {"message": _message("".join(TOKENS)), "logprobs": LOGPROBS, "finish_reason": "stop"}
    ),
    "logprobs_unspelled": _chat(
        {"message": _message("Other text"), "logprobs": LOGPROBS, "finish_reason": "stop"}
    ),
    "annotations_and_reasoning": _chat(
        {
            "message": _message(
                "See the docs.",
                reasoning_content="First, think it through.",
                annotations=[
                    {
                        "type": "url_citation",
                        "url_citation": {
                            "start_index": 8,
                            "end_index": 12,
                            "title": "Docs",
                            "url": "https://example.com/docs",
                        },
                    }
                ],
            ),
            "finish_reason": "stop",
        }
    ),
}

LEGACY_CASES = {
    "text": _legacy(
        {"text": "\n\nOnce upon a time, in a land far away", "finish_reason": "length"}
    ),
    "two_choices_usage": _legacy(
        {"text": " red", "finish_reason": "stop"},
        {"text": " blue and green", "finish_reason": "stop"},
        usage=USAGE,
    ),
    "empty": _legacy({"text": "", "finish_reason": "stop"}),
    "logprobs": _legacy(
        {
            "text": "".join(TOKENS),
            "logprobs": {
                "tokens": TOKENS,
                "token_logprobs": [-0.1] * len(TOKENS),
                "top_logprobs": [{t: -0.1} for t in TOKENS],
                "text_offset": [0, 6, 7, 11, 13],
            },
            "finish_reason": "stop",
        }
    ),
    "logprobs_unspelled": _legacy(
        {
            "text": "something else",
            "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": None},
            "finish_reason": "stop",
        }
    ),
}


# --- stored raw streams ---------------------------------------------------------------------


def _assembler(case: str) -> Callable[[list[bytes]], dict[str, Any]]:
    return shapes.assemble_completion if case.startswith("completion") else shapes.assemble_chat


@pytest.mark.parametrize("case", CASES)
def test_stored_stream_assembles_to_expected_completion(case: str) -> None:
    raw = (STREAMS / f"{case}.sse").read_bytes()
    expected = json.loads((STREAMS / f"{case}.json").read_text())
    assemble = _assembler(case)
    assembled = assemble(_split_events(raw))
    assert assembled == expected
    # Stored event boundaries do not matter: whole, or one byte at a time.
    assert assemble([raw]) == expected
    assert assemble([raw[i : i + 1] for i in range(len(raw))]) == expected
    if case.startswith("completion"):
        Completion.model_validate(assembled)
    else:
        ChatCompletion.model_validate(assembled)
        assert _sdk_accumulated([raw]) == _summary(assembled)


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_stored_stream_reencodes_stably(case: str, include_usage: bool) -> None:
    legacy = case.startswith("completion")
    to_events = streaming.completion_to_events if legacy else streaming.chat_to_events
    assemble = _assembler(case)
    first = assemble(_split_events((STREAMS / f"{case}.sse").read_bytes()))
    events = to_events(first, include_usage=include_usage)
    again = assemble(events)
    expected = copy.deepcopy(first)
    if not include_usage:
        expected["usage"] = None
    assert again == expected
    assert to_events(again, include_usage=include_usage) == events  # deterministic
    if not legacy:
        _check_chat_events(events)
        assert _sdk_accumulated(events) == _summary(first)


# --- object → stream → object ---------------------------------------------------------------


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_round_trip(case: str, include_usage: bool) -> None:
    completion = CHAT_CASES[case]
    events = streaming.chat_to_events(completion, include_usage=include_usage)
    _check_chat_events(events)
    assembled = shapes.assemble_chat(events)
    ChatCompletion.model_validate(assembled)
    expected = _normalised_chat(completion)
    if not include_usage:
        expected["usage"] = None
    assert assembled == expected
    assert (
        shapes.assemble_chat(streaming.chat_to_events(assembled, include_usage=True)) == assembled
    )
    assert _sdk_accumulated(events) == _summary(expected)


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("case", sorted(LEGACY_CASES))
def test_legacy_round_trip(case: str, include_usage: bool) -> None:
    completion = LEGACY_CASES[case]
    events = streaming.completion_to_events(completion, include_usage=include_usage)
    assembled = shapes.assemble_completion(events)
    Completion.model_validate(assembled)
    expected = copy.deepcopy(completion)
    if not include_usage:
        expected["usage"] = None
    assert assembled == expected
    sdk = _sdk_stream(events, legacy=True)
    texts = {c["index"]: "" for c in completion["choices"]}
    for chunk in sdk:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[i] for i in sorted(texts)] == [c["text"] for c in completion["choices"]]


def test_chat_stream_looks_like_openai() -> None:
    completion = CHAT_CASES["parallel_tools"]
    chunks = _check_chat_events(streaming.chat_to_events(completion, include_usage=True))
    head = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    for chunk in chunks:
        assert {k: chunk[k] for k in head} == head
        assert chunk["object"] == "chat.completion.chunk"
        assert "usage" in chunk
    first, *body, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None, "refusal": None}
    assert finish["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    ]
    assert usage["choices"] == [] and usage["usage"] == USAGE
    assert all(chunk["usage"] is None for chunk in [first, *body, finish])
    calls = [chunk["choices"][0]["delta"]["tool_calls"][0] for chunk in body]
    openings = [call for call in calls if "id" in call]
    assert openings == [
        {"index": k, "id": i, "type": "function", "function": {"name": name, "arguments": ""}}
        for k, (i, name) in enumerate([("call_a1", "get_weather"), ("call_b2", "get_time")])
    ]
    fragments = [call["function"]["arguments"] for call in calls if call["index"] == 0][1:]
    assert len(fragments) > 1 and "".join(fragments) == ARGS_PARIS


def test_text_is_streamed_in_several_chunks_and_starts_with_an_empty_content() -> None:
    chunks = _check_chat_events(streaming.chat_to_events(CHAT_CASES["text"], include_usage=False))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert pieces == ["The quick brown ", "fox jumps over ", "the lazy dog.\n\n", "Twice!"]
    assert all("usage" not in chunk for chunk in chunks)


def test_choices_take_turns_and_open_in_index_order() -> None:
    chunks = _check_chat_events(
        streaming.chat_to_events(CHAT_CASES["two_choices"], include_usage=True)
    )
    order = [chunk["choices"][0]["index"] for chunk in chunks if chunk["choices"]]
    assert order[:4] == [0, 1, 0, 1]
    assert [c["choices"][0]["delta"].get("role") for c in chunks[:2]] == ["assistant"] * 2


def test_logprobs_spelling_the_text_give_one_chunk_per_token() -> None:
    chunks = _check_chat_events(
        streaming.chat_to_events(CHAT_CASES["logprobs"], include_usage=False)
    )
    body = [c["choices"][0] for c in chunks[1:-1]]
    assert [choice["delta"]["content"] for choice in body] == TOKENS
    assert [choice["logprobs"]["content"][0]["token"] for choice in body] == TOKENS


def test_usage_unknown_is_not_invented() -> None:
    events = streaming.chat_to_events(CHAT_CASES["text"], include_usage=True)
    chunks = _check_chat_events(events)
    assert all(chunk["choices"] and chunk["usage"] is None for chunk in chunks)
    assert shapes.assemble_chat(events)["usage"] is None


@pytest.mark.parametrize(
    "text",
    ["", "a", "  lead", "trail  ", "one two three four", "x" * 70, "中文没有空格" * 10, "\n\n"],
)
def test_split_text_rule(text: str) -> None:
    pieces = streaming.split_text(text)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= streaming.MAX_CHUNK_CHARS for p in pieces)
    assert all(len(p.split()) <= streaming.WORDS_PER_CHUNK for p in pieces)


# --- random texts both ways -----------------------------------------------------------------

ALPHABET = [
    *"abcdefXYZ019.,!?'", " ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", "é", "ß", "中文", "😀",
    "👩\u200d👩\u200d👧", "e\u0301", "\u2028", "\u0085", "\u00a0", "\u200b", '"', "\\", "\x00",
    "\x1f", "data: ", "[DONE]", ": ping", "{}", "</s>",
]  # fmt: skip


def _random_text(rng: random.Random) -> str:
    body = "".join(rng.choice(ALPHABET) for _ in range(rng.choice([0, 1, 3, 10, 40, 150])))
    return rng.choice(["", " ", "\n", "  \t"]) + body + rng.choice(["", " ", "\n", "\r\n  "])


def _random_cuts(rng: random.Random, text: str) -> list[str]:
    positions = range(1, len(text))
    cuts = sorted(rng.sample(positions, min(len(positions), rng.randint(0, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _hand_stream(pieces: list[str], *, ascii_json: bool, legacy: bool) -> list[bytes]:
    """A stream as another encoder would write it (escaped or raw UTF-8, spaces after ':')."""
    head = {"id": "x", "created": 1, "model": "m"}

    def event(choice: dict[str, Any]) -> bytes:
        obj = "text_completion" if legacy else "chat.completion.chunk"
        data = json.dumps({**head, "object": obj, "choices": [choice]}, ensure_ascii=ascii_json)
        return f"data: {data}\n\n".encode()

    body: list[dict[str, Any]]
    if legacy:
        body = [{"index": 0, "text": p, "finish_reason": None} for p in pieces]
        return [*map(event, body), event({"index": 0, "text": "", "finish_reason": "stop"})]
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
    body = [{"index": 0, "delta": {"content": p}} for p in pieces]
    finish = {"index": 0, "delta": {}, "finish_reason": "stop"}
    return [event(role), *map(event, body), event(finish), b"data: [DONE]\n\n"]


def test_random_texts_survive_both_ways() -> None:
    rng = random.Random(1234)
    for n in range(300):
        text = _random_text(rng)
        # object → stream → object, content and tool arguments alike
        tool = _tool_call("call_1", "f", text)
        completion = _chat(
            {"message": _message(text), "finish_reason": "stop"},
            {"message": _message(None, tool_calls=[tool]), "finish_reason": "tool_calls"},
        )
        events = streaming.chat_to_events(completion, include_usage=bool(n % 2))
        assembled = shapes.assemble_chat(events)
        assert assembled["choices"][0]["message"]["content"] == text
        assert assembled["choices"][1]["message"]["tool_calls"][0]["function"]["arguments"] == text
        legacy = _legacy({"text": text, "finish_reason": "stop"})
        events_legacy = streaming.completion_to_events(legacy, include_usage=False)
        assert shapes.assemble_completion(events_legacy)["choices"][0]["text"] == text
        # stream (cut anywhere, encoded by someone else) → object → stream → object
        pieces = _random_cuts(rng, text)
        hand = _hand_stream(pieces, ascii_json=bool(n % 3), legacy=False)
        once = shapes.assemble_chat(hand)
        assert once["choices"][0]["message"]["content"] == text
        assert shapes.assemble_chat(streaming.chat_to_events(once, include_usage=False)) == once
        hand_legacy = _hand_stream(pieces, ascii_json=bool(n % 3), legacy=True)
        hand_legacy.append(b"data: [DONE]\n\n")
        assert shapes.assemble_completion(hand_legacy)["choices"][0]["text"] == text
        if n % 25 == 0:  # the real client reads our events to the same text
            _check_chat_events(events)
            assert _sdk_accumulated(events)[0]["content"] == text


# --- stream → stream (include_usage) --------------------------------------------------------


def test_replay_drops_the_usage_chunk_and_keeps_every_other_byte() -> None:
    stored = _split_events((STREAMS / "chat_parallel_tool_calls.sse").read_bytes())
    replayed = shapes.replay_events(stored, include_usage=False)
    assert replayed == stored[:-2] + stored[-1:]
    assert all(chunk.choices for chunk in _sdk_stream(replayed))
    assert shapes.replay_events(stored, include_usage=True) == stored


def test_replay_without_stored_usage_stays_as_stored() -> None:
    stored = _split_events((STREAMS / "chat_two_choices.sse").read_bytes())
    assert shapes.replay_events(stored, include_usage=True) == stored
    assert shapes.replay_events(stored, include_usage=False) == stored
    legacy = _split_events((STREAMS / "completion_logprobs.sse").read_bytes())
    assert shapes.replay_events(legacy, include_usage=True) == legacy


def test_replay_synthesizes_usage_a_server_put_on_the_last_choice_chunk() -> None:
    head = '"id":"x","object":"chat.completion.chunk","created":1,"model":"m"'
    stored = [
        f'data: {{{head},"choices":[{{"index":0,"delta":{{"content":"hi"}}}}]}}\n\n'.encode(),
        b": keep-alive\n\n",
        (
            f'data: {{{head},"choices":[{{"index":0,"delta":{{}},"finish_reason":"stop"}}],'
            '"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n\n'
        ).encode(),
        b"data: [DONE]\n\n",
    ]
    replayed = shapes.replay_events(stored, include_usage=True)
    assert replayed[:3] == stored[:3] and replayed[-1] == stored[-1]
    usage_chunk = ChatCompletionChunk.model_validate(json.loads(replayed[3][6:]))
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.total_tokens == 2
    assert shapes.replay_events(stored, include_usage=False) == stored


def test_replay_of_our_own_events_matches_a_fresh_encoding() -> None:
    completion = CHAT_CASES["two_choices"]
    with_usage = streaming.chat_to_events(completion, include_usage=True)
    without = shapes.replay_events(with_usage, include_usage=False)
    assert len(without) == len(with_usage) - 1
    assert shapes.assemble_chat(without) == {**shapes.assemble_chat(with_usage), "usage": None}


@pytest.mark.parametrize("case", CASES)
def test_replay_is_the_same_however_the_stored_bytes_are_cut(case: str) -> None:
    """One whole event per item (what the cache stores) is replayed from its tail alone;
    any other cut is decoded whole. Both give the same bytes, or the same miss."""
    stored = _split_events((STREAMS / f"{case}.sse").read_bytes())
    ragged = [half for e in stored for half in (e[: len(e) // 2], e[len(e) // 2 :]) if half]

    def replayed(items: list[bytes], include_usage: bool) -> bytes | str:
        try:
            return b"".join(shapes.replay_events(items, include_usage=include_usage))
        except shapes.ShapeError as exc:
            return str(exc)

    for usage in (True, False):
        expected = replayed([b"".join(stored)], usage)
        assert replayed(stored, usage) == replayed(ragged, usage) == expected


# --- not a stream of the expected kind: a cache miss ----------------------------------------

GOOD = _split_events((STREAMS / "chat_two_choices.sse").read_bytes())
ERROR = b'data: {"error":{"message":"The server had an error","type":"server_error"}}\n\n'


@pytest.mark.parametrize(
    ("events", "why"),
    [
        ([], "empty"),
        ([b"data: [DONE]\n\n"], "no chunks"),
        (GOOD[:-1], "no [DONE]: truncated"),
        (GOOD[:3] + GOOD[-1:], "choices never finished"),
        ([b"data: {not json\n\n", *GOOD], "invalid JSON"),
        ([*GOOD[:2], ERROR, *GOOD[2:]], "error chunk"),
        ([b'event: error\ndata: {"message":"x"}\n\n', *GOOD], "error event"),
        ([b"data: [1, 2]\n\n", *GOOD], "not an object"),
        (_split_events((STREAMS / "completion_logprobs.sse").read_bytes()), "legacy stream"),
        ([b'data: {"id":"x","object":"chat.completion.chunk","choices":[]}\n\n', GOOD[-1]],
         "no created/model, no choices"),
    ],
)  # fmt: skip
def test_assemble_chat_rejects(events: list[bytes], why: str) -> None:
    with pytest.raises(ShapeError):
        shapes.assemble_chat(events)


def test_assemble_rejects_tool_calls_without_id_and_audio() -> None:
    chunk = json.loads(GOOD[0][6:])
    chunk["choices"][0]["delta"] = {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    with pytest.raises(ShapeError):
        shapes.assemble_chat([sse.encode_json(chunk), *GOOD[1:]])
    chunk["choices"][0]["delta"] = {"audio": {"id": "a", "data": "AAAA"}}
    with pytest.raises(ShapeError):
        shapes.assemble_chat([sse.encode_json(chunk), *GOOD[1:]])
    with pytest.raises(ShapeError):
        shapes.assemble_completion(GOOD)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c.update(object="text_completion"),
        lambda c: c.update(choices=[]),
        lambda c: c.pop("model"),
        lambda c: c["choices"][0].update(finish_reason=None),
        lambda c: c["choices"][0]["message"].update(content="lone \ud800 surrogate"),
        lambda c: c["choices"][0]["message"].update(audio={"id": "a", "data": "AAAA"}),
        lambda c: c["choices"][0]["message"].update(
            tool_calls=[{"id": "c", "type": "custom", "custom": {"name": "x", "input": "y"}}]
        ),
    ],
)
def test_chat_to_events_rejects(mutate: Callable[[dict[str, Any]], Any]) -> None:
    completion = copy.deepcopy(CHAT_CASES["text"])
    mutate(completion)
    with pytest.raises(ShapeError):
        streaming.chat_to_events(completion, include_usage=True)


def test_completion_to_events_rejects_a_chat_completion_and_replay_needs_done() -> None:
    with pytest.raises(ShapeError):
        streaming.completion_to_events(CHAT_CASES["text"], include_usage=False)
    with pytest.raises(ShapeError):
        shapes.replay_events(GOOD[:-1], include_usage=False)
    with pytest.raises(ShapeError):
        shapes.replay_events([b"data: {oops\n\n", b"data: [DONE]\n\n"], include_usage=True)
