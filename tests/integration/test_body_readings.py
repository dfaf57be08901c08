"""A body's reading is shared by every call the cache may serve that sends the same bytes
(app/request/body_readings.py), so no stage may edit it. Calls of every route, streamed and
whole, to each kind of upstream (OpenAI, Anthropic, Gemini: their translations), through
the Messages door both ways, each sent twice (the second from the reading, and a cache
hit), without gateway keys and with one whose limits read the body: every reading kept is
still the document its bytes parse to. The calls the cache does not serve (count_tokens, a
sampled answer) keep no reading.

In this process: the app (its gateway's readings read directly), the simulator as its
upstream over loopback."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask

from app.factory import create_app
from tests.support.keys_file import keys_toml
from tests.support.kinds import kinds_toml

USER: Any = [{"role": "user", "content": "hi"}]
SECRET = "sk-gateway-team"
# The Messages door's callers send Anthropic's version header; the OpenAI door's ignore it.
HEADERS = {"Content-Type": "application/json", "anthropic-version": "2023-06-01",
           "Authorization": f"Bearer {SECRET}"}  # fmt: skip


@pytest.fixture(params=["keys off", "a gateway key"])
def app(request, upstream_sim, tmp_path, monkeypatch) -> Flask:
    """The gateway on the three kinds; with a gateway key whose limits and caps read the
    body (its tokens estimated, a max_tokens sent where the call names none), or without."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    config = tmp_path / "llmgate.toml"
    config.write_text(kinds_toml(upstream_sim))
    env = {"LLMGATE_CONFIG": str(config), "LLMGATE_UPSTREAM_URL": "http://127.0.0.1:9/v1",
           "LLMGATE_CACHE_MODE": "deterministic", "LLMGATE_STATUS_SAMPLE_S": "0"}  # fmt: skip
    if request.param == "a gateway key":
        keys = tmp_path / "keys.toml"
        limits = "tokens_per_minute = 100000\nrequests_per_minute = 1000\nmax_tokens = 50"
        keys.write_text(keys_toml([("team", limits)], lambda name: SECRET))
        env["LLMGATE_KEYS_FILE"] = str(keys)
    return create_app(environ=env)


def _calls() -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for kind in ("openai", "anthropic", "gemini"):
        chat = {"model": f"m-{kind}", "messages": USER, "temperature": 0, "tools": [tool],
                "cache": {"ttl": 60}}  # fmt: skip
        calls.append(("/v1/chat/completions", chat))
        calls.append(
            (
                "/v1/chat/completions",
                {**chat, "stream": True, "stream_options": {"include_usage": True}},
            )
        )
    for kind in ("openai", "anthropic"):
        messages = {"model": f"m-{kind}", "max_tokens": 20, "messages": USER, "temperature": 0,
                    "system": [{"type": "text", "text": "be brief"}],
                    "metadata": {"user_id": "u"}}  # fmt: skip
        calls.append(("/v1/messages", messages))
        calls.append(("/v1/messages", {**messages, "stream": True}))
    responses = {"model": "m-openai", "input": "hi", "temperature": 0, "store": False}
    calls.append(("/v1/responses", responses))
    calls.append(("/v1/responses", {**responses, "stream": True}))
    calls.append(("/v1/completions", {"model": "m-openai", "prompt": "hi", "temperature": 0}))
    calls.append(("/v1/embeddings", {"model": "m-openai", "input": ["a", "b"]}))
    return calls


# Calls the cache does not serve (a sampled answer; a route it never keeps): read each time.
UNCACHED = [
    ("/v1/chat/completions", {"model": "m-openai", "messages": USER, "temperature": 0.7}),
    ("/v1/messages/count_tokens", {"model": "m-anthropic", "messages": USER}),
]


def test_no_call_edits_the_reading_it_shares(app) -> None:
    client = app.test_client()
    sent = set()
    for path, body in _calls() + UNCACHED:
        raw = json.dumps(body).encode()
        sent.add(raw)
        for n in range(2):
            answer = client.post(path, data=raw, headers=HEADERS)
            assert answer.status_code == 200, (path, body["model"], answer.data[:300])
            assert answer.data  # the whole answer read, a stream to its end
            if n and (path, body) not in UNCACHED:  # the second from the reading, a hit
                assert answer.headers["X-LLMGate-Cache"].startswith("HIT"), (path, body)
    readings = app.extensions["llmgate"].readings
    kept = readings._kept
    # Every cached call's reading is here, and no other.
    assert {raw for _, _, raw in kept} == sent - {json.dumps(body).encode() for _, body in UNCACHED}
    for (route, path, raw), reading in kept.items():
        assert reading.body == json.loads(raw), (route, path)
