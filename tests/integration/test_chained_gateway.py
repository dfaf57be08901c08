"""An upstream that is itself a gateway of this kind (one region's in front of another's)
answers in our own header namespace: ``X-LLMGate-Cache: HIT`` and a stream id for an answer
it made for this gateway's call. Ours is a miss (the cache is off here: a bypass), and is
billed and logged as one; the caller hears only this gateway's own headers.

The upstream is a scripted server (tests/support/scripted_server.py) that answers every chat
call with 100 tokens of usage and those headers; the key's spend is read from /admin/usage,
the log line from the worker's log, the headers from the raw answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from tests.support.keys_file import keys_toml
from tests.support.scripted_server import Exchange, LoopbackServer, Request
from tests.support.sse_reader import data_events, read_events

USAGE = {"prompt_tokens": 60, "completion_tokens": 40, "total_tokens": 100}
THEIRS = {
    "X-LLMGate-Cache": "HIT; level=l1",
    "X-LLMGate-Stream-ID": "Zk3q9RsT4uVw5xYz6AbCdEf7",
    "X-LLMGate-Request-ID": "theirs",
    "x-request-id": "req-inner",
}
http = urllib3.PoolManager(maxsize=8, retries=False, timeout=urllib3.Timeout(connect=5, read=30))


def secret(name: str) -> str:
    return f"llmg-{name}-chained-secret"


def _answer(request: Request, ex: Exchange) -> None:
    body = request.json()
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    if not body.get("stream"):
        message = {"role": "assistant", "content": "From the inner gateway."}
        whole = {
            **chunk,
            "object": "chat.completion",
            "usage": USAGE,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
        ex.respond(200, whole, headers=THEIRS)
        return
    ex.start_stream(headers=THEIRS)
    delta = {"index": 0, "delta": {"role": "assistant", "content": "Inner."}, "finish_reason": None}
    done = {"index": 0, "delta": {}, "finish_reason": "stop"}
    for data in (
        {**chunk, "choices": [delta]},
        {**chunk, "choices": [done]},
        {**chunk, "choices": [], "usage": USAGE},
    ):
        ex.send(b"data: " + json.dumps(data).encode() + b"\n\n")
    ex.send(b"data: [DONE]\n\n")
    ex.finish()


@pytest.fixture(scope="module")
def inner() -> Iterator[LoopbackServer]:
    with LoopbackServer(_answer) as server:
        yield server


@pytest.fixture(scope="module")
def outer(make_stack, tmp_path_factory, inner: LoopbackServer):
    folder: Path = tmp_path_factory.mktemp("chained")
    (folder / "keys.toml").write_text(keys_toml([("team", "tokens_per_day = 100000")], secret))
    env = {"LLMGATE_KEYS_FILE": str(folder / "keys.toml"), "LLMGATE_CACHE_MODE": "off"}
    return make_stack(env=env, upstream_url=f"{inner.url}/v1")


def _call(gw, stream: bool) -> urllib3.BaseHTTPResponse:
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return http.request(
        "POST",
        gw.url + "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {secret('team')}"},
        preload_content=not stream,
    )


def _spent(gw) -> int:
    rows = json.loads(http.request("GET", gw.url + "/admin/usage").data)["keys"]
    return {row["name"]: row for row in rows}["team"]["tokens_today"] or 0


@pytest.mark.parametrize("stream", [False, True])
def test_an_inner_gateways_hit_is_billed_and_logged_as_our_own_miss(outer, stream) -> None:
    before = _spent(outer)
    resp = _call(outer, stream)
    assert resp.status == 200
    if stream:
        events = data_events(read_events(resp))
        assert events[-1].event.data == "[DONE]"
        assert all(e.event.id is None for e in events)  # not made resumable by their header
    ours = [(k.lower(), v) for k, v in resp.headers.items() if k.lower().startswith("x-llmgate-")]
    cache = [v for k, v in ours if k == "x-llmgate-cache"]
    assert cache == ["BYPASS"], ours
    assert "x-llmgate-stream-id" not in dict(ours)
    request_id = dict(ours)["x-llmgate-request-id"]
    assert request_id != "theirs" and resp.headers["x-request-id"] == "req-inner"
    line = outer.logged(request_id)
    assert line["cache"] == "bypass" and line["usage"] == USAGE
    assert _spent(outer) - before == 100
