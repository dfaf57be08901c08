"""The simulator's whole answers and errors in each dialect, and how a request finds its
dialect (simulator/chat_scripts.py, anthropic.py, gemini.py, dialects.py, behaviour.py).

Every dialect must say the same answer: the text, the thinking and its signature, the tool
calls with their ids and parsed arguments, the finish mapped by each dialect's own names and
the usage (Anthropic's ``input_tokens`` uncached; Gemini's and OpenAI's prompt counts whole).
"""

from __future__ import annotations

import json

import pytest

from simulator import anthropic, behaviour, chat_scripts, dialects, gemini, scripts
from simulator.responses import ApiError
from simulator.scripts import SCRIPTS

FINISHED = [n for n in scripts.NAMES if SCRIPTS[n].finish != scripts.ERROR]


@pytest.mark.parametrize("name", FINISHED)
def test_chat_completion(name: str) -> None:
    script = SCRIPTS[name]
    body = chat_scripts.completion(script, "chatcmpl-1", 5, "m")
    (choice,) = body["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == script.finish
    assert message["content"] == script.text
    calls = message.get("tool_calls", [])
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        (b.id, b.name) for b in script.of_kind("tool")
    ]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        b.arguments() for b in script.of_kind("tool")
    ]
    thinking = script.of_kind("thinking")
    assert message.get("reasoning_content") == (script.thinking if thinking else None)
    assert message.get("thinking_blocks", []) == [
        {"type": "thinking", "thinking": b.text, "signature": b.signature} for b in thinking
    ]
    u = script.usage
    assert body["usage"]["prompt_tokens"] == u.input + u.cache_read + u.cache_creation
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == u.cache_read
    assert body["usage"]["total_tokens"] == u.prompt + u.output


def test_chat_usage_names_cache_writes_and_reasoning_only_when_there_are_some() -> None:
    assert chat_scripts.usage(SCRIPTS["text"]) == {
        "prompt_tokens": 16,
        "completion_tokens": 6,
        "total_tokens": 22,
        "prompt_tokens_details": {"cached_tokens": 6},
    }
    thinking = chat_scripts.usage(SCRIPTS["thinking"])
    assert thinking["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 3}
    assert thinking["completion_tokens_details"] == {"reasoning_tokens": 18}


@pytest.mark.parametrize("name", FINISHED)
def test_anthropic_message(name: str) -> None:
    script = SCRIPTS[name]
    body = anthropic.message(script, "msg_1", "m")
    assert {k: body[k] for k in ("id", "type", "role", "model", "stop_sequence")} == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "stop_sequence": None,
    }
    assert body["stop_reason"] == anthropic.STOP_REASONS[script.finish]
    text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
    assert text == script.text
    assert [
        (b["id"], b["name"], b["input"]) for b in body["content"] if b["type"] == "tool_use"
    ] == [(b.id, b.name, b.arguments()) for b in script.of_kind("tool")]
    assert [
        (b["thinking"], b["signature"]) for b in body["content"] if b["type"] == "thinking"
    ] == [(b.text, b.signature) for b in script.of_kind("thinking")]
    u = script.usage
    assert body["usage"] == {
        "input_tokens": u.input,
        "cache_creation_input_tokens": u.cache_creation,
        "cache_read_input_tokens": u.cache_read,
        "output_tokens": u.output,
    }


@pytest.mark.parametrize("name", FINISHED)
def test_gemini_response(name: str) -> None:
    script = SCRIPTS[name]
    body = gemini.response(script, "r1", "gemini-x")
    assert (body["responseId"], body["modelVersion"]) == ("r1", "gemini-x")
    (candidate,) = body["candidates"]
    assert candidate["finishReason"] == gemini.FINISH_REASONS[script.finish]
    parts = candidate["content"]["parts"]
    assert "".join(p["text"] for p in parts if "text" in p and not p.get("thought")) == script.text
    assert "".join(p["text"] for p in parts if p.get("thought")) == script.thinking
    assert [p["functionCall"] for p in parts if "functionCall" in p] == [
        {"id": b.id, "name": b.name, "args": b.arguments()} for b in script.of_kind("tool")
    ]
    meta = body["usageMetadata"]
    u = script.usage
    assert meta["promptTokenCount"] == u.prompt
    assert meta.get("cachedContentTokenCount", 0) == u.cache_read
    assert meta.get("thoughtsTokenCount", 0) == u.thinking
    assert meta["candidatesTokenCount"] + u.thinking == u.output


def test_tool_arguments_come_in_many_fragments_that_join_to_compact_json() -> None:
    for block in SCRIPTS["tools"].of_kind("tool"):
        assert len(block.pieces) >= 10
        assert block.text == json.dumps(block.arguments(), separators=(",", ":"))


@pytest.mark.parametrize(
    ("status", "anthropic_type", "gemini_status", "gemini_code"),
    [
        (400, "invalid_request_error", "INVALID_ARGUMENT", 400),
        (401, "authentication_error", "UNAUTHENTICATED", 401),
        (403, "permission_error", "PERMISSION_DENIED", 403),
        (429, "rate_limit_error", "RESOURCE_EXHAUSTED", 429),
        (500, "api_error", "INTERNAL", 500),
        (503, "overloaded_error", "UNAVAILABLE", 503),
        (529, "overloaded_error", "UNAVAILABLE", 503),
    ],
)
def test_errors_in_each_dialect(
    status: int, anthropic_type: str, gemini_status: str, gemini_code: int
) -> None:
    err = ApiError(status, "boom", "some_type")
    assert dialects.render_error(dialects.ANTHROPIC, err, "req_1") == (
        status,
        {
            "type": "error",
            "error": {"type": anthropic_type, "message": "boom"},
            "request_id": "req_1",
        },
    )
    assert dialects.render_error(dialects.GEMINI, err, "req_1") == (
        gemini_code,
        {"error": {"code": gemini_code, "message": "boom", "status": gemini_status}},
    )
    openai_status, body = dialects.render_error(dialects.OPENAI, err, "req_1")
    assert openai_status == (503 if status == 529 else status)
    assert body == {"error": {"message": "boom", "type": "some_type", "param": None, "code": None}}


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v1/messages", dialects.Route("anthropic", "/v1/messages")),
        ("/v1/messages/count_tokens", dialects.Route("anthropic", "/v1/messages/count_tokens")),
        ("/v1/messages/batches", dialects.Route("anthropic", "other")),
        (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            dialects.Route(
                "gemini",
                "/v1beta/models/{model}:generateContent",
                "gemini-2.5-flash",
                "generateContent",
            ),
        ),
        (
            "/v1beta/models/sim%2Fscript%3Dtools,ttft_ms%3D5:streamGenerateContent",
            dialects.Route(
                "gemini",
                "/v1beta/models/{model}:streamGenerateContent",
                "sim/script=tools,ttft_ms=5",
                "streamGenerateContent",
            ),
        ),
        (
            "/v1beta/models/sim/script=text:generateContent",
            dialects.Route(
                "gemini",
                "/v1beta/models/{model}:generateContent",
                "sim/script=text",
                "generateContent",
            ),
        ),
        ("/v1beta/models/m:countTokens", dialects.Route("gemini", "other")),
        ("/v1/chat/completions", dialects.Route("openai", "/v1/chat/completions")),
        ("/v1/models/gpt-4o", dialects.Route("openai", "/v1/models/{model}")),
        ("/nope", dialects.Route("openai", "other")),
    ],
)
def test_a_request_finds_its_dialect_by_its_path(path: str, route: dialects.Route) -> None:
    assert dialects.classify(path) == route


def test_script_and_fault_controls() -> None:
    defaults = behaviour.Behaviour()
    b = behaviour.resolve([("x-sim-script", "Tools"), ("x-sim-fault", "529")], None, defaults)
    assert (b.script, b.fault) == ("tools", "529")
    assert behaviour.resolve([], "sim/script=thinking,ping_ms=50", defaults).ping_ms == 50
    with pytest.raises(behaviour.BehaviourError, match="unknown simulator script 'nope'"):
        behaviour.resolve([("x-sim-script", "nope")], None, defaults)
    off = behaviour.resolve([("x-sim-script", "none")], "sim/script=text", defaults)
    assert off.script is None
