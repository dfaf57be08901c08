"""Gemini's ``alt=sse`` stream as Chat Completions chunks (app/dialects/answer_from_gemini.py).

Raw streams written from Gemini's documented format (each ``data:`` a whole
GenerateContentResponse, CRLF line ends as Google sends them), each event with the chunks it
must turn into: the expected output of a stream is checked event by event, so a translation
held back for a later event fails here as surely as a wrong one. Every stream is also fed
whole, one byte at a time and in random pieces (hypothesis), and must give the same bytes.
Each chunk is validated with the OpenAI SDK's own types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from app.dialects.gemini import StreamToChat
from llmgate_wire import sse
from tests.support.sse_feed import cut_at, decode, steps
from tests.support.strategies import cut_places

CREATED = 1_760_000_000
FALLBACK = "fb7"
ID, MODEL = "resp-Ab12", "gemini-2.5-flash"


def ev(data: str) -> bytes:
    """One event of Gemini's stream, as its server writes it."""
    return b"data: " + data.encode() + b"\r\n\r\n"


def text_chunk(text: str, finish: str | None = None, usage: str = "") -> bytes:
    """A chunk of one text part; with ``finish``, the last one; ``usage``: its usageMetadata."""
    reason = f',"finishReason": "{finish}"' if finish else ""
    meta = usage + "," if usage else ""
    return ev(
        '{"candidates": [{"content": {"parts": [{"text": "' + text + '"}],"role": "model"},'
        '"index": 0' + reason + "}]," + meta + '"modelVersion": "gemini-2.5-flash",'
        '"responseId": "resp-Ab12"}'
    )


USAGE_META = (
    '"usageMetadata": {"promptTokenCount": 11,"candidatesTokenCount": 7,"totalTokenCount": 18}'
)
EARLY_USAGE_META = (
    '"usageMetadata": {"promptTokenCount": 11,"candidatesTokenCount": 2,"totalTokenCount": 13}'
)
USAGE = {
    "prompt_tokens": 11,
    "completion_tokens": 7,
    "total_tokens": 18,
    "prompt_tokens_details": {"cached_tokens": 0},
}
ROLE: tuple[Any, ...] = ("delta", {"role": "assistant", "content": ""})
DONE: tuple[Any, ...] = ("done",)


def content(text: str) -> tuple[Any, ...]:
    return ("delta", {"content": text})


def finish(reason: str) -> tuple[Any, ...]:
    return ("finish", reason)


def usage(value: dict[str, Any] = USAGE) -> tuple[Any, ...]:
    return ("usage", value)


@dataclass
class Case:
    """A raw stream: its events, each with the items it must translate to, and close()'s."""

    steps: list[tuple[bytes, list[tuple[Any, ...]]]]
    close: list[tuple[Any, ...]] = field(default_factory=list)
    include_usage: bool = True
    id: str = ID
    model: str = MODEL

    @property
    def raw(self) -> bytes:
        return b"".join(raw for raw, _ in self.steps)

    @property
    def expected(self) -> list[tuple[Any, ...]]:
        return [item for _, items in self.steps for item in items] + self.close


CASES: dict[str, Case] = {
    "text_in_three_chunks": Case(
        [
            (text_chunk("Hel"), [ROLE, content("Hel")]),
            (text_chunk("lo, "), [content("lo, ")]),
            (
                text_chunk("world", "STOP", usage=USAGE_META),
                [content("world"), finish("stop"), usage(), DONE],
            ),
        ]
    ),
    "thinking_with_signatures": Case(
        [
            (
                ev(
                    '{"candidates": [{"content": {"parts": [{"text": "Weigh the **options**",'
                    '"thought": true}],"role": "model"},"index": 0}],'
                    '"modelVersion": "gemini-2.5-pro","responseId": "r-think"}'
                ),
                [ROLE, ("reasoning", 0, "Weigh the **options**")],
            ),
            (
                ev(
                    '{"candidates": [{"content": {"parts": [{"text": " then pick one.",'
                    '"thought": true,"thoughtSignature": "CiQB0e2Kb1=="}],"role": "model"},'
                    '"index": 0}],"modelVersion": "gemini-2.5-pro","responseId": "r-think"}'
                ),
                [
                    ("reasoning", 0, " then pick one."),
                    ("signature", "CiQB0e2Kb1=="),
                ],
            ),
            (
                ev(
                    '{"candidates": [{"content": {"parts": [{"text": "Pick B."},'
                    '{"text": "","thoughtSignature": "EjQK9x=="}],"role": "model"},'
                    '"finishReason": "STOP","index": 0}],"usageMetadata": {'
                    '"promptTokenCount": 1200,"candidatesTokenCount": 40,'
                    '"totalTokenCount": 1540,"cachedContentTokenCount": 1024,'
                    '"promptTokensDetails": [{"modality": "TEXT","tokenCount": 1200}],'
                    '"thoughtsTokenCount": 300},'
                    '"modelVersion": "gemini-2.5-pro","responseId": "r-think"}'
                ),
                [
                    content("Pick B."),
                    ("signature", "EjQK9x=="),
                    finish("stop"),
                    usage(
                        {
                            "prompt_tokens": 1200,
                            "completion_tokens": 340,
                            "total_tokens": 1540,
                            "prompt_tokens_details": {"cached_tokens": 1024},
                            "completion_tokens_details": {"reasoning_tokens": 300},
                        }
                    ),
                    DONE,
                ],
            ),
        ],
        id="r-think",
        model="gemini-2.5-pro",
    ),
    "two_parallel_calls_one_with_id": Case(
        [
            (text_chunk("Checking both."), [ROLE, content("Checking both.")]),
            (
                ev(
                    '{"candidates": [{"content": {"parts": [{"functionCall": {"id": "fc-9",'
                    '"name": "get_weather","args": {"city": "Zürich","days": [1, 2]}},'
                    '"thoughtSignature": "Sig1"},{"functionCall": {"name": "get_time",'
                    '"args": {"tz": "Europe/Zurich"}}}],"role": "model"},'
                    '"finishReason": "STOP","index": 0}],' + USAGE_META + ","
                    '"modelVersion": "gemini-2.5-flash","responseId": "resp-Ab12"}'
                ),
                [
                    ("signature", "Sig1"),  # the thinking before the call signed: first
                    ("tool", 0, "fc-9", "get_weather"),
                    ("args", 0, '{"city":"Zürich","days":[1,2]}'),
                    ("tool", 1, f"call_{FALLBACK}_1", "get_time"),
                    ("args", 1, '{"tz":"Europe/Zurich"}'),
                    finish("tool_calls"),
                    usage(),
                    DONE,
                ],
            ),
        ]
    ),
    "call_without_id_or_args": Case(
        [
            (
                ev(
                    '{"candidates": [{"content": {"parts": [{"functionCall": {"name": "now"}}],'
                    '"role": "model"},"finishReason": "STOP","index": 0}],' + USAGE_META + "}"
                ),
                [
                    ROLE,
                    ("tool", 0, f"call_{FALLBACK}_0", "now"),
                    ("args", 0, "{}"),
                    finish("tool_calls"),
                    usage(),
                    DONE,
                ],
            ),
        ],
        id=FALLBACK,  # no responseId, no modelVersion
        model="",
    ),
    "max_tokens": Case(
        [
            (text_chunk("A long"), [ROLE, content("A long")]),
            (
                text_chunk(" sto", "MAX_TOKENS", usage=USAGE_META),
                [content(" sto"), finish("length"), usage(), DONE],
            ),
        ]
    ),
    "safety_stop": Case(
        [
            (text_chunk("Part of it"), [ROLE, content("Part of it")]),
            (
                ev(
                    '{"candidates": [{"content": {"role": "model"},"finishReason": "SAFETY",'
                    '"index": 0,"safetyRatings": [{"category": "HARM_CATEGORY_HARASSMENT",'
                    '"probability": "HIGH","blocked": true}]}],' + USAGE_META + ","
                    '"modelVersion": "gemini-2.5-flash","responseId": "resp-Ab12"}'
                ),
                [finish("content_filter"), usage(), DONE],
            ),
        ]
    ),
    "finish_without_usage_ends_at_close": Case(
        [
            (text_chunk("Hi"), [ROLE, content("Hi")]),
            (
                ev(
                    '{"candidates": [{"content": {"parts": [{"text": "!"}],"role": "model"},'
                    '"finishReason": "STOP","index": 0}],"responseId": "resp-Ab12",'
                    '"modelVersion": "gemini-2.5-flash"}'
                ),
                [content("!"), finish("stop")],
            ),
        ],
        close=[DONE],  # no usage was ever sent: none is made up
    ),
    "finish_without_usage_ends_with_the_latest_usage": Case(
        [
            (text_chunk("A", usage=EARLY_USAGE_META), [ROLE, content("A")]),
            (text_chunk("B", usage=USAGE_META), [content("B")]),
            (text_chunk("C", "STOP"), [content("C"), finish("stop")]),
            (text_chunk("late"), []),  # after the finish, without usage: nothing to say
        ],
        close=[usage(), DONE],
    ),
    "usage_after_the_finish": Case(
        [
            (text_chunk("Hi", "STOP"), [ROLE, content("Hi"), finish("stop")]),
            (ev("{" + USAGE_META + ',"responseId": "resp-Ab12"}'), [usage(), DONE]),
        ]
    ),
    "no_usage_asked": Case(
        [
            (text_chunk("Hi", "STOP"), [ROLE, content("Hi"), finish("stop"), DONE]),
            (ev("{" + USAGE_META + "}"), []),
        ],
        include_usage=False,
    ),
    "mid_stream_error": Case(
        [
            (text_chunk("Start"), [ROLE, content("Start")]),
            (
                ev('{"error": {"code": 503,"message": "Overloaded","status": "UNAVAILABLE"}}'),
                [("error", "Overloaded", "unavailable")],
            ),
            (text_chunk("after", "STOP"), []),
        ]
    ),
    "error_before_anything": Case(
        [
            (
                ev(
                    '{"error": {"code": 429,"message": "Quota exceeded for metric",'
                    '"status": "RESOURCE_EXHAUSTED"}}'
                ),
                [("error", "Quota exceeded for metric", "resource_exhausted")],
            ),
        ]
    ),
    "cut_short": Case(
        [(text_chunk("Once"), [ROLE, content("Once")]), (text_chunk(" upon"), [content(" upon")])]
    ),
    "prompt_blocked": Case(
        [
            (
                ev(
                    '{"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},'
                    '"usageMetadata": {"promptTokenCount": 11,"totalTokenCount": 11},'
                    '"modelVersion": "gemini-2.5-flash","responseId": "resp-Ab12"}'
                ),
                [
                    ROLE,
                    finish("content_filter"),
                    usage({**USAGE, "completion_tokens": 0, "total_tokens": 11}),
                    DONE,
                ],
            ),
        ]
    ),
    "comments_and_other_data_are_ignored": Case(
        [
            (b": keep-alive\r\n\r\n", []),
            (ev("[1, 2]") + ev("not json"), []),
            (
                ev(
                    '{"candidates": [{"content": {"parts": [{"executableCode": {"code": "1"}},'
                    '{"text": "ok"}],"role": "model"},"index": 0}],"responseId": "resp-Ab12",'
                    '"modelVersion": "gemini-2.5-flash"}'
                ),
                [ROLE, content("ok")],
            ),
            (text_chunk("", "OTHER", usage=USAGE_META), [finish("stop"), usage(), DONE]),
        ]
    ),
}


def items(out: bytes, case: Case) -> list[tuple[Any, ...]]:
    """The chat stream ``out`` in the cases' notation; every chunk checked for its shape."""
    events, rest = decode([out])
    assert rest == b""
    found: list[tuple[Any, ...]] = []
    for event in events:
        assert event.raw.startswith(b"data: ") and event.raw.endswith(b"\n\n")
        if event.is_done:
            found.append(DONE)
            continue
        value = event.json()
        if "error" in value:
            error = value["error"]
            assert error["param"] is None and error["code"] is None
            found.append(("error", error["message"], error["type"]))
            continue
        ChatCompletionChunk.model_validate(value)
        assert (value["id"], value["model"], value["created"]) == (case.id, case.model, CREATED)
        assert value["object"] == "chat.completion.chunk"
        found.append(_item(value))
    return found


def _item(value: dict[str, Any]) -> tuple[Any, ...]:
    if value["choices"] == []:
        return ("usage", value["usage"])
    (choice,) = value["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    delta = choice["delta"]
    if choice["finish_reason"] is not None:
        assert delta == {}
        return ("finish", choice["finish_reason"])
    if "reasoning_content" in delta:  # a thought, also in the block it belongs to
        ((block,),) = [delta.pop("thinking_blocks")]
        assert block == {"index": block["index"], "type": "thinking", "thinking": delta[
            "reasoning_content"
        ]}  # fmt: skip
        return ("reasoning", block["index"], delta["reasoning_content"])
    if "thinking_blocks" in delta:
        ((block,),) = [delta["thinking_blocks"]]
        assert (block["type"], block["thinking"]) == ("thinking", "")
        return ("signature", block["signature"])
    if "tool_calls" in delta:
        ((call,),) = [delta["tool_calls"]]
        if "id" in call:
            assert call["type"] == "function" and call["function"]["arguments"] == ""
            return ("tool", call["index"], call["id"], call["function"]["name"])
        return ("args", call["index"], call["function"]["arguments"])
    return ("delta", delta)


def translate(case: Case, pieces: list[bytes]) -> tuple[bytes, bytes]:
    """(what the feeds returned, what close() returned)."""
    translator = StreamToChat(case.include_usage, CREATED, FALLBACK)
    return b"".join(translator.feed(p) for p in pieces), translator.close()


@pytest.mark.parametrize("name", CASES)
def test_each_event_turns_into_its_chunks_in_the_feed_that_brings_it(name: str) -> None:
    case = CASES[name]
    translator = StreamToChat(case.include_usage, CREATED, FALLBACK)
    for raw, expected in case.steps:
        assert items(translator.feed(raw), case) == expected
    assert items(translator.close(), case) == case.close


@pytest.mark.parametrize("name", CASES)
def test_fed_one_byte_at_a_time_nothing_leaves_before_or_after_its_event(name: str) -> None:
    case = CASES[name]
    translator = StreamToChat(case.include_usage, CREATED, FALLBACK)
    for raw, expected in case.steps:
        out = b"".join(translator.feed(byte) for byte in steps(raw, 1))
        assert items(out, case) == expected
    assert items(translator.close(), case) == case.close


@pytest.mark.parametrize("name", CASES)
def test_fed_whole_the_stream_is_the_same(name: str) -> None:
    case = CASES[name]
    out, end = translate(case, [case.raw])
    assert items(out + end, case) == case.expected
    assert out + end == b"".join(translate(case, steps(case.raw, 1)))


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(CASES)),
    cuts=cut_places(3000, 25),
)
def test_any_split_gives_the_same_bytes(name: str, cuts: list[int]) -> None:
    case = CASES[name]
    assert translate(case, cut_at(case.raw, cuts)) == translate(case, [case.raw])


@pytest.mark.parametrize("name", CASES)
def test_lf_line_ends_translate_as_crlf_ones(name: str) -> None:
    case = CASES[name]
    lf = case.raw.replace(b"\r\n", b"\n")
    assert translate(case, [lf]) == translate(case, [case.raw])
    assert b"\r" in case.raw


def test_a_crlf_cut_between_its_cr_and_lf_loses_nothing() -> None:
    case = CASES["text_in_three_chunks"]
    raw = case.raw
    cuts = [i + 1 for i in range(len(raw)) if raw[i : i + 1] == b"\r"]
    out, end = translate(case, cut_at(raw, cuts))
    assert items(out + end, case) == case.expected


def test_an_ended_stream_ignores_what_follows_and_close_adds_nothing() -> None:
    case = CASES["text_in_three_chunks"]
    translator = StreamToChat(True, CREATED, FALLBACK)
    translator.feed(case.raw)
    assert translator.feed(text_chunk("more", "STOP", usage=USAGE_META)) == b""
    assert translator.close() == b""


def test_a_cut_stream_has_no_done_and_a_half_event_is_dropped() -> None:
    case = CASES["cut_short"]
    translator = StreamToChat(True, CREATED, FALLBACK)
    out = translator.feed(case.raw + text_chunk(" a", "STOP")[:-3])
    assert items(out, case) == case.expected
    assert translator.close() == b""


# -- the bugs users report most in peers' translators ---------------------------------------


def _snapshot(out: bytes) -> Any:
    """The stream accumulated by the OpenAI SDK's own stream state."""
    state = ChatCompletionStreamState()
    for event in sse.Decoder().feed(out):
        if not event.is_done:
            state.handle_chunk(ChatCompletionChunk.model_validate(event.json()))
    return state.current_completion_snapshot


def test_tool_call_arguments_are_never_dropped() -> None:
    args = {"query": 'naïve ✓ "quoted"', "filters": {"n": list(range(40)), "deep": {"x": None}}}
    call = {"name": "search", "args": args}
    raw = ev(
        json.dumps(
            {
                "candidates": [
                    {
                        "content": {
                            "parts": [
                                {"functionCall": call},
                                {"functionCall": {**call, "id": "b"}},
                            ],
                            "role": "model",
                        },
                        "finishReason": "STOP",
                    }
                ],
                "responseId": "r1",
            }
        )
    )
    for pieces in ([raw], steps(raw, 1), steps(raw, 7)):
        translator = StreamToChat(False, CREATED, FALLBACK)
        snapshot = _snapshot(b"".join(translator.feed(p) for p in pieces) + translator.close())
        calls = snapshot.choices[0].message.tool_calls
        assert [(c.id, c.function.name) for c in calls] == [
            (f"call_{FALLBACK}_0", "search"),
            ("b", "search"),
        ]
        assert [json.loads(c.function.arguments) for c in calls] == [args, args]
        assert snapshot.choices[0].finish_reason == "tool_calls"


def test_thinking_is_kept() -> None:
    case = CASES["thinking_with_signatures"]
    out, end = translate(case, steps(case.raw, 5))
    found = items(out + end, case)
    deltas = [i[1] for i in found if i[0] == "delta"]
    reasoning = "".join(i[2] for i in found if i[0] == "reasoning")
    assert reasoning == "Weigh the **options** then pick one."
    assert [i[1] for i in found if i[0] == "signature"] == ["CiQB0e2Kb1==", "EjQK9x=="]
    assert [d["content"] for d in deltas if "content" in d] == ["", "Pick B."]


@pytest.mark.parametrize(
    "name", [n for n, c in CASES.items() if c.include_usage and DONE in c.expected]
)
def test_usage_is_present_when_include_usage(name: str) -> None:
    case = CASES[name]
    out, end = translate(case, [case.raw])
    found = items(out + end, case)
    if name == "finish_without_usage_ends_at_close":  # Gemini sent no usage: none made up
        assert "usage" not in [i[0] for i in found]
    else:
        assert found[-2][0] == "usage" and found[-1] == DONE
    without = StreamToChat(False, CREATED, FALLBACK)
    assert "usage" not in [i[0] for i in items(without.feed(case.raw) + without.close(), case)]


def test_the_first_delta_is_not_held() -> None:
    translator = StreamToChat(True, CREATED, FALLBACK)
    first = text_chunk("Hel")
    # Up to its data line's end: no blank line yet, the event is not whole.
    assert translator.feed(first[:-3]) == b""
    assert items(translator.feed(first[-3:-1]), CASES["text_in_three_chunks"]) == [
        ROLE,
        content("Hel"),
    ]


def test_usage_reported_once_gemini_counted() -> None:
    translator = StreamToChat(True, CREATED, FALLBACK)
    translator.feed(text_chunk("Hi"))
    assert translator.usage_reported is False
    translator.feed(text_chunk("!", "STOP", usage=USAGE_META))
    assert translator.usage_reported is True
