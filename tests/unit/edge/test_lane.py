"""The hot routes' lane (app/edge/lane.py): an API call skips Flask's per-request machinery
and is answered exactly as Flask's own view answers it; anything else still goes through
Flask. Each answer is compared with the one ``Flask.wsgi_app`` gives the same request."""

from __future__ import annotations

import itertools
import json

import pytest
from flask import Flask
from werkzeug.test import EnvironBuilder, run_wsgi_app

from app.core.config import Settings
from app.factory import create_app
from app.request.call import Reply
from tests.support.server_timing import relay_of

# Headers that differ between two answers to the same call by design (and a stream's last
# comment, its relay time: Server-Timing's too).
PER_CALL = {"x-request-id", "x-llmgate-request-id", "server-timing"}


@pytest.fixture
def app(monkeypatch) -> Flask:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    return create_app(Settings(upstream_url="http://127.0.0.1:9/v1", max_body_bytes=1000))


def _both(app: Flask, **request) -> list[tuple[str, list[tuple[str, str]], bytes]]:
    """(status, headers but the per-call ones, body) from the lane, then from Flask."""
    answers = []
    for wsgi in (app.wsgi_app, lambda env, start: Flask.wsgi_app(app, env, start)):
        env = EnvironBuilder(**request).get_environ()
        body, status, headers = run_wsgi_app(wsgi, env, buffered=True)
        kept = [(k, v) for k, v in headers.items() if k.lower() not in PER_CALL]
        answers.append((status, sorted(kept), relay_of(b"".join(body))[0]))
    return answers


def _chat(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


REPLIES = {
    "answer": lambda: Reply(200, [("Content-Type", "application/json")], b'{"id":"x"}'),
    "stream": lambda: Reply(
        200,
        [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")],
        iter([[b"data: 1\n\n", b"data: 2\n\n"], [b"data: [DONE]\n\n"]]),
    ),
    "created elsewhere": lambda: Reply(201, [("Location", "/v1/x/\u00e9")], b"{}"),
    "no content": lambda: Reply(204, [("Content-Length", "0")], b""),
    "a length of its own": lambda: Reply(200, [("Content-Length", "99")], b"{}"),
    "upstream error": lambda: Reply(503, [("Content-Type", "application/json")], b'{"e":1}'),
    "a status with no name": lambda: Reply(299, [("Content-Type", "application/json")], b"{}"),
}


@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_the_lane_answers_as_flasks_view_does(app, monkeypatch, kind) -> None:
    monkeypatch.setattr(app.extensions["llmgate"], "handle", lambda call, caller: REPLIES[kind]())
    lane, flask = _both(app, method="POST", path="/v1/chat/completions", json=_chat())
    assert lane == flask
    assert lane[0].split()[0] == str(REPLIES[kind]().status)


@pytest.mark.parametrize(
    ("what", "asked"),
    [
        ("not JSON", {"data": b"{", "content_type": "application/json"}),
        ("too large", {"json": _chat(pad="x" * 2000)}),
        ("no model", {"json": {"messages": []}}),
        ("unreachable upstream", {"json": _chat()}),
        ("a long query", {"json": _chat(), "query_string": "q=" + "x" * 5000}),
    ],
)
def test_the_lanes_errors_are_flasks(app, what, asked) -> None:
    lane, flask = _both(app, method="POST", path="/v1/chat/completions", **asked)
    assert lane == flask
    assert int(lane[0].split()[0]) >= 400 and json.loads(lane[2])["error"]["message"]


def test_only_a_post_to_an_api_endpoint_skips_flask(app, monkeypatch) -> None:
    seen: list[str] = []

    @app.before_request
    def through_flask() -> None:
        seen.append("flask")

    reply = REPLIES["answer"]
    monkeypatch.setattr(app.extensions["llmgate"], "handle", lambda call, caller: reply())
    client = app.test_client()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"):
        assert client.post(path, json=_chat()).status_code == 200
    assert seen == []  # none of them went through Flask's request machinery
    assert client.get("/healthz").status_code == 200
    assert client.post("/v1/chat/completions/", json=_chat()).status_code  # not an exact path
    assert client.delete("/v1/embeddings").status_code == 405
    assert seen == ["flask"] * 3


def test_the_lane_gives_the_admission_slots_back_when_the_body_is_closed(app, monkeypatch) -> None:
    gate = app.extensions["llmgate.admission"]
    events = iter([[b"data: 1\n\n"], [b"data: [DONE]\n\n"]])

    def handle(call, caller):
        call.admission.admit(stream=True)
        return Reply(200, [("Content-Type", "text/event-stream")], events)

    monkeypatch.setattr(app.extensions["llmgate"], "handle", handle)
    env = EnvironBuilder(method="POST", path="/v1/chat/completions", json=_chat()).get_environ()
    body, status, _ = run_wsgi_app(app.wsgi_app, env)
    assert status.startswith("200") and gate.load.streams == 1
    first = next(iter(body))
    assert first == b"data: 1\n\n" and gate.load.streams == 1  # held while it is sent
    body.close()  # type: ignore[attr-defined]  # what the server does when the caller leaves mid-stream
    assert gate.load.streams == gate.load.requests == 0
    assert list(itertools.islice(events, 1)) == [[b"data: [DONE]\n\n"]]  # not read after
