"""The simulator's Gemini dialect over real TCP, as raw HTTP and through the Gemini SDK
(google-genai, pointed at the simulator): generateContent and streamGenerateContent?alt=sse,
its key, its errors and its controls.

Gemini writes its SSE with CRLF line ends and no [DONE]; each chunk is a whole
GenerateContentResponse; controls come from ``x-sim-*`` headers or a ``sim/...`` model in
the URL path, percent-encoded or not. Streams are read back with llmgate_wire's decoder.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from google.genai import errors, types

from llmgate_wire import sse
from simulator import scripts, text
from tests.support.sdks import gemini_sdk
from tests.support.sim import SimProcess

PROMPT = "hello there simulator"
BODY: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
pytestmark = pytest.mark.usefixtures("fresh_sim")  # each test starts from /sim/reset


def call(
    sim: SimProcess, target: str, body: Any = BODY, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    return sim.send("POST", target, body, headers)


def generate(model: str = "gemini-sim") -> str:
    return f"/v1beta/models/{model}:generateContent"


def stream(model: str = "gemini-sim") -> str:
    return f"/v1beta/models/{model}:streamGenerateContent?alt=sse"


def chunks(data: bytes) -> list[Any]:
    decoder = sse.Decoder()
    events = decoder.feed(data)
    assert decoder.close() == b""
    assert all(e.raw.endswith(b"\r\n\r\n") for e in events)
    return [e.json() for e in events]


def parts(body: Any) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = body["candidates"][0]["content"]["parts"]
    return result


def test_generated_answer_non_stream_and_stream(sim: SimProcess) -> None:
    status, headers, data = call(sim, generate())
    body = json.loads(data)
    assert status == 200 and headers["content-type"] == "application/json"
    assert parts(body) == [{"text": "".join(text.words(PROMPT, 16))}]
    assert body["candidates"][0]["finishReason"] == "STOP"
    assert body["usageMetadata"] == {
        "promptTokenCount": 3,
        "candidatesTokenCount": 16,
        "totalTokenCount": 19,
    }
    assert body["modelVersion"] == "gemini-sim" and body["responseId"]
    capped = {**BODY, "generationConfig": {"maxOutputTokens": 4}}
    status, headers, data = call(sim, stream(), capped)
    got = chunks(data)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert [p for c in got for p in parts(c)] == [{"text": w} for w in text.words(PROMPT, 4)]
    assert [c["candidates"][0].get("finishReason") for c in got] == [None] * 3 + ["MAX_TOKENS"]
    assert b"[DONE]" not in data and len({c["responseId"] for c in got}) == 1


def test_tools_script_from_an_encoded_model_name(sim: SimProcess) -> None:
    status, _, data = call(sim, stream("sim%2Fscript%3Dtools"))
    got = chunks(data)
    calls = [p["functionCall"] for c in got for p in parts(c) if "functionCall" in p]
    assert status == 200 and calls == [
        {"id": "call_sim_weather", "name": "get_weather", "args": scripts.WEATHER_ARGS},
        {"id": "call_sim_time", "name": "get_time", "args": scripts.TIME_ARGS},
    ]
    assert got[-1]["candidates"][0]["finishReason"] == "STOP"
    assert got[-1]["usageMetadata"]["totalTokenCount"] == 92
    _, _, whole = call(sim, generate("sim/script=tools"))
    assert [p for p in parts(json.loads(whole)) if "functionCall" in p] == [
        {"functionCall": c} for c in calls
    ]


def test_thinking_script_parts_and_usage(sim: SimProcess) -> None:
    status, _, data = call(sim, generate(), **{"x-sim-script": "thinking"})
    body = json.loads(data)
    assert status == 200 and parts(body) == [
        {"text": "Let me think it through.", "thought": True},
        {"text": "", "thoughtSignature": "c2ltLXNpZ25hdHVyZS0x"},
        {"text": "The answer is 42."},
    ]
    assert body["usageMetadata"] == {
        "promptTokenCount": 23,
        "candidatesTokenCount": 12,
        "totalTokenCount": 53,
        "thoughtsTokenCount": 18,
    }


@pytest.mark.parametrize(("script", "reason"), [("length", "MAX_TOKENS"), ("filter", "SAFETY")])
def test_finish_reasons(sim: SimProcess, script: str, reason: str) -> None:
    _, _, data = call(sim, generate(), **{"x-sim-script": script})
    assert json.loads(data)["candidates"][0]["finishReason"] == reason
    _, _, data = call(sim, stream(), **{"x-sim-script": script})
    assert chunks(data)[-1]["candidates"][0]["finishReason"] == reason


def test_overload_and_error_after_end_the_stream_with_an_error_chunk(sim: SimProcess) -> None:
    overloaded = {"error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}}
    _, _, data = call(sim, stream(), **{"x-sim-script": "overload"})
    got = chunks(data)
    assert [p["text"] for c in got[:-1] for p in parts(c)] == ["Working", " on", " it"]
    assert got[-1] == overloaded
    assert all("finishReason" not in c["candidates"][0] for c in got[:-1])
    _, _, data = call(sim, stream(), **{"x-sim-fault": "error-after", "x-sim-error-after": "3"})
    got = chunks(data)
    assert len(got) == 4 and got[-1] == overloaded
    status, _, data = call(sim, generate(), **{"x-sim-script": "overload"})
    assert (status, json.loads(data)) == (503, overloaded)


@pytest.mark.parametrize(
    ("fault", "status", "name"),
    [
        ("429", 429, "RESOURCE_EXHAUSTED"),
        ("500", 500, "INTERNAL"),
        ("503", 503, "UNAVAILABLE"),
        ("529", 503, "UNAVAILABLE"),
    ],
)
def test_error_faults(sim: SimProcess, fault: str, status: int, name: str) -> None:
    got, _, data = call(sim, stream(), **{"x-sim-fault": fault})
    error = json.loads(data)["error"]
    assert got == status and (error["code"], error["status"]) == (status, name)
    assert set(error) == {"code", "message", "status"}


def test_bad_requests(sim: SimProcess) -> None:
    no_sse = "/v1beta/models/m:streamGenerateContent"
    for target, body, status in [
        (no_sse, BODY, 400),
        (generate(), {"contents": []}, 400),
        (generate(), {**BODY, "generationConfig": {"maxOutputTokens": 0}}, 400),
        ("/v1beta/models/m:countTokens", BODY, 404),
    ]:
        got, _, data = call(sim, target, body)
        error = json.loads(data)["error"]
        assert (got, error["code"]) == (status, status), target
    got, _, data = call(sim, generate(), **{"x-sim-script": "nope"})
    assert got == 400 and json.loads(data)["error"]["status"] == "INVALID_ARGUMENT"


def test_key_by_header_or_query() -> None:
    with SimProcess(require_key="secret") as keyed:
        status, _, data = call(keyed, generate())
        assert (status, json.loads(data)["error"]["status"]) == (403, "PERMISSION_DENIED")
        status, _, data = call(keyed, generate(), **{"x-goog-api-key": "wrong"})
        assert (status, json.loads(data)["error"]["status"]) == (400, "INVALID_ARGUMENT")
        assert call(keyed, generate(), **{"x-goog-api-key": "secret"})[0] == 200
        assert call(keyed, stream() + "&key=secret")[0] == 200


def test_ttft_and_tps_apply(sim: SimProcess) -> None:
    start = time.monotonic()
    status, _, data = call(
        sim, stream(), **{"x-sim-ttft-ms": "300", "x-sim-tps": "20", "x-sim-tokens": "3"}
    )
    assert status == 200 and len(chunks(data)) == 3
    assert time.monotonic() - start >= 0.3 + 2 / 20


def test_requests_are_counted_by_route(sim: SimProcess) -> None:
    call(sim, generate())
    call(sim, stream())
    call(sim, stream("sim%2Fscript%3Dtext"))
    stats = sim.stats()
    assert stats["requests_by_dialect"] == {"gemini": 3}
    assert stats["requests_by_route"] == {
        "gemini /v1beta/models/{model}:generateContent": 1,
        "gemini /v1beta/models/{model}:streamGenerateContent": 2,
    }


def test_the_gemini_sdk_reads_every_script(sim: SimProcess) -> None:
    with gemini_sdk(sim.url) as client:
        tools = client.models.generate_content(model="sim/script=tools", contents="hi")
        assert [(c.id, c.name, c.args) for c in tools.function_calls or []] == [
            ("call_sim_weather", "get_weather", scripts.WEATHER_ARGS),
            ("call_sim_time", "get_time", scripts.TIME_ARGS),
        ]
        assert tools.usage_metadata is not None
        assert tools.usage_metadata.total_token_count == 92
        thoughts, answer, signatures, finish = "", "", [], None
        for chunk in client.models.generate_content_stream(
            model="sim/script=thinking", contents="hi"
        ):
            (candidate,) = chunk.candidates or []
            finish = candidate.finish_reason or finish
            for part in (candidate.content.parts if candidate.content else None) or []:
                if part.thought:
                    thoughts += part.text or ""
                else:
                    answer += part.text or ""
                if part.thought_signature:
                    signatures.append(part.thought_signature)
        assert (thoughts, answer) == ("Let me think it through.", "The answer is 42.")
        assert signatures == [b"sim-signature-1"]  # the API's signatures are base64 bytes
        assert finish == types.FinishReason.STOP
        with pytest.raises(errors.ServerError, match="Overloaded"):
            list(client.models.generate_content_stream(model="sim/script=overload", contents="hi"))
        with pytest.raises(errors.ClientError) as limited:
            client.models.generate_content(model="sim/fault=429", contents="hi")
        assert (limited.value.code, limited.value.status) == (429, "RESOURCE_EXHAUSTED")
