"""The response cache through the whole stack: what is stored, what is replayed, for whom."""

from __future__ import annotations

import json
import os
import time
import uuid

import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.support.raw_http import assert_json_error, request_head, send_raw
from tests.support.server_timing import relay_of
from tests.support.sse_reader import content_of, data_events, read_events

STATUS = "X-LLMGate-Cache"


def body(stream: bool = False, **fields) -> dict:
    """A deterministic (cacheable) chat request with a prompt no other test uses."""
    prompt = fields.pop("prompt", None) or f"cache test {uuid.uuid4().hex}"
    return {
        "model": "sim-model",
        "temperature": 0,
        "max_tokens": 6,
        "stream": stream,
        "messages": [{"role": "user", "content": prompt}],
        **fields,
    }


def ask(gw, payload: dict, headers: dict | None = None, key: str = "sk-alice"):
    return gw.post(
        "/v1/chat/completions",
        payload,
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
    )


def test_miss_then_hit_replays_the_same_events_in_order(gw) -> None:
    payload = body(True, stream_options={"include_usage": True})
    first = ask(gw, payload)
    second = ask(gw, payload)
    assert first.headers[STATUS] == "MISS"
    assert second.headers[STATUS].startswith("HIT; level=")
    assert int(second.headers["Age"]) >= 0
    # The same events, each answer with its own relay time (Server-Timing's line) taken off.
    (replayed, relay), (streamed, _) = relay_of(second.data), relay_of(first.data)
    events = [e.event.raw for e in read_events_bytes(replayed)]
    assert events == [e.event.raw for e in read_events_bytes(streamed)] and relay is not None
    assert events[-1] == b"data: [DONE]\n\n" and len(events) > 3
    assert gw.sim_stats()["requests"] == 1


def read_events_bytes(raw: bytes):
    class _Resp:
        def __init__(self) -> None:
            self.sent = False

        def read1(self, n: int) -> bytes:
            if self.sent:
                return b""
            self.sent = True
            return raw

    return data_events(read_events(_Resp()))  # type: ignore[arg-type]


def test_one_stored_answer_serves_both_shapes_to_the_sdk(gw) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-alice", max_retries=0)
    for first_stream in (True, False):
        payload = body()
        payload.pop("stream")
        create = client.chat.completions.with_raw_response.create
        texts: list[str] = []
        statuses: list[str] = []
        for streamed in (first_stream, not first_stream):
            raw = create(**payload, stream=streamed)
            statuses.append(raw.headers[STATUS])
            item = raw.parse()  # a stream is read to its end before the next call
            if streamed:
                assert isinstance(item, openai.Stream)
                texts.append("".join(c.choices[0].delta.content or "" for c in item if c.choices))
            else:
                assert isinstance(item, ChatCompletion)
                content = item.choices[0].message.content
                assert content is not None
                texts.append(content)
        assert statuses[0] == "MISS" and statuses[1].startswith("HIT")
        assert texts[0] == texts[1] and len(texts[0].split()) == 6
    assert gw.sim_stats()["requests"] == 2


@pytest.mark.parametrize("line", [b"X-Custom: a\rb", b"X-Custom: a\x00b", b"X-Custom: a\r\n b"])
def test_a_header_no_request_could_carry_is_refused_even_when_the_answer_is_stored(
    gw, line: bytes
) -> None:
    """A hit builds no upstream request (app/upstream/call_request.py), yet a header value
    with a CR, NUL or a folded line is a JSON 400 before any answer, a stored one too,
    through nginx and straight to gunicorn; the upstream is called once, for the first call.
    On this stack nginx and gunicorn refuse it before the app sees it; the app's own refusal
    of it on a hit is tests/unit/gateway/test_gateway_store.py's."""
    payload = body()
    raw = json.dumps(payload).encode()
    assert ask(gw, payload).headers[STATUS] == "MISS"
    sent = [("Authorization", "Bearer sk-alice"), ("Content-Type", "application/json")]
    for name, url in (("nginx", gw.url), ("gunicorn", gw.app_url)):
        fine = request_head("POST", "/v1/chat/completions", [*sent, ("X-Custom", "a b")], body=raw)
        status, headers, _ = send_raw(url, fine, raw)
        assert status == 200 and headers[STATUS.lower()].startswith("HIT"), name
        head = request_head("POST", "/v1/chat/completions", sent, body=raw)
        answer = send_raw(url, head.replace(b"\r\n\r\n", b"\r\n" + line + b"\r\n\r\n"), raw)
        assert_json_error(answer, 400, "bad_request")
        assert STATUS.lower() not in answer[1], name
    assert gw.sim_stats()["requests"] == 1


def test_two_api_keys_never_share_an_entry(gw) -> None:
    payload = body()
    assert ask(gw, payload, key="sk-alice").headers[STATUS] == "MISS"
    assert ask(gw, payload, key="sk-bob").headers[STATUS] == "MISS"
    assert ask(gw, payload, key="sk-alice").headers[STATUS].startswith("HIT")
    assert gw.sim_stats()["requests"] == 2


@pytest.mark.parametrize("name", ["api-key", "x-api-key", "query"])
def test_callers_differing_only_in_another_credential_never_share_an_entry(gw, name) -> None:
    """Azure-style `api-key`, `x-api-key`, or a key in the query string, with no Authorization:
    the second caller's request must reach the upstream with its own credential."""
    payload = body()
    seen = []
    for secret in ("key-one", "key-two"):
        path = "/v1/chat/completions" + (f"?api-key={secret}" if name == "query" else "")
        headers = {} if name == "query" else {name: secret}
        resp = gw.post(path, payload, headers=headers)
        assert resp.status == 200 and resp.headers[STATUS] == "MISS"
        last = gw.sim_requests()[-1]
        seen.append(last["query"] if name == "query" else last["headers"][name])
    assert gw.sim_stats()["requests"] == 2
    assert seen == (["api-key=key-one", "api-key=key-two"] if name == "query"
                    else ["key-one", "key-two"])  # fmt: skip


@pytest.mark.parametrize(
    "fault",
    [
        {"x-sim-fault": "429", "x-sim-retry-after": "60"},
        {"x-sim-fault": "500"},
        {"x-sim-fault": "503", "x-sim-retry-after": "60"},
        {"x-sim-fault": "reset"},
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_errors_and_partial_streams_are_never_cached(gw, fault: dict, stream: bool) -> None:
    payload = body(stream)
    failed = ask(gw, payload, fault)
    assert failed.status != 200 or b"[DONE]" not in failed.data
    healthy = ask(gw, payload)
    assert healthy.status == 200
    assert healthy.headers[STATUS] == "MISS", "a failed answer was stored"


def test_aborted_stream_is_not_cached(make_stack) -> None:
    gw = make_stack(env={"LLMGATE_IDLE_TIMEOUT_S": "1"})
    payload = body(True)
    ask(gw, payload, {"x-sim-fault": "stall-after"})  # idle timeout mid-stream
    assert ask(gw, payload).headers[STATUS] == "MISS"


def test_non_deterministic_requests_bypass(gw) -> None:
    payload = body(temperature=0.8)
    assert ask(gw, payload).headers[STATUS] == "BYPASS"
    assert ask(gw, payload).headers[STATUS] == "BYPASS"
    assert gw.sim_stats()["requests"] == 2


def test_no_cache_refreshes_and_no_store_does_not_write(gw) -> None:
    payload = body()
    assert ask(gw, payload, {"Cache-Control": "no-store"}).headers[STATUS] == "MISS"
    assert ask(gw, payload).headers[STATUS] == "MISS"  # nothing was stored
    assert ask(gw, payload, {"Cache-Control": "no-cache"}).headers[STATUS] == "REFRESH"
    assert ask(gw, payload).headers[STATUS].startswith("HIT")
    assert gw.sim_stats()["requests"] == 3


def test_ttl_and_s_maxage_controls_and_the_body_object_is_stripped(gw) -> None:
    payload = body(cache={"ttl": 1})
    assert ask(gw, payload).headers[STATUS] == "MISS"
    assert "cache" not in gw.sim_requests()[-1]["body"]
    assert ask(gw, payload).headers[STATUS].startswith("HIT")
    time.sleep(2.1)
    assert ask(gw, payload).headers[STATUS] == "MISS"  # expired after its own ttl

    other = body()
    ask(gw, other)
    time.sleep(1.1)
    old_ok = ask(gw, other, {"Cache-Control": "s-maxage=60"})
    assert old_ok.headers[STATUS].startswith("HIT")
    assert int(old_ok.headers["Age"]) >= 1
    fresh_only = ask(gw, other, {"Cache-Control": "s-maxage=0"})
    assert fresh_only.headers[STATUS] == "MISS"  # too old for this caller: recomputed


def test_namespace_must_be_allowed(gw) -> None:
    refused = ask(gw, body(cache={"namespace": "team"}))
    assert refused.status == 400
    assert json.loads(refused.data)["error"]["code"] == "cache_namespace_not_allowed"


def test_allowed_namespace_is_shared_across_keys(make_stack) -> None:
    gw = make_stack(env={"LLMGATE_CACHE_NAMESPACES": "team"})
    gw.sim_reset()
    payload = body(cache={"namespace": "team"})
    assert ask(gw, payload, key="sk-alice").headers[STATUS] == "MISS"
    assert ask(gw, payload, key="sk-bob").headers[STATUS].startswith("HIT")


def test_stream_hit_adapts_usage_to_the_caller(gw) -> None:
    prompt = f"usage {uuid.uuid4().hex}"
    ask(gw, body(True, prompt=prompt, stream_options={"include_usage": True}))
    plain = ask(gw, body(True, prompt=prompt))
    assert plain.headers[STATUS].startswith("HIT")
    events = [e.event for e in read_events_bytes(plain.data)]
    assert not any('"choices":[]' in (e.data or "") for e in events)
    assert content_of(read_events_bytes(plain.data))


def _memcached(runs_dir, name: str):
    from runner.procs import Proc, free_port
    from tests.conftest import require_binary

    binary = require_binary("memcached")
    port = free_port()
    argv = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "16"]
    if os.geteuid() == 0:
        argv += ["-u", "nobody"]
    proc = Proc(name, argv, log_path=runs_dir / f"{name}.log")
    proc.wait_port(port)
    return proc, f"127.0.0.1:{port}"


def test_one_of_two_memcached_nodes_stopping_fails_no_request(make_stack, runs_dir) -> None:
    node_a, addr_a = _memcached(runs_dir, "memcached-a")
    node_b, addr_b = _memcached(runs_dir, "memcached-b")
    try:
        gw = make_stack(env={"LLMGATE_MEMCACHED": f"{addr_a},{addr_b}"}, memcached=False)
        prompts = [f"node {i} {uuid.uuid4().hex}" for i in range(20)]
        for prompt in prompts:  # spread entries over both nodes
            assert ask(gw, body(prompt=prompt)).status == 200
        node_b.stop()
        statuses = []
        for prompt in prompts * 2:
            resp = ask(gw, body(prompt=prompt))
            assert resp.status == 200, resp.data
            statuses.append(resp.headers[STATUS])
        assert any(s.startswith("HIT") for s in statuses)  # node a still serves its share
        ready = gw.http.request("GET", gw.url + "/readyz")
        assert ready.status == 200  # a cache node down degrades, it does not unready
        assert ready.json()["checks"]["memcached"]["ok"] is False
    finally:
        node_a.kill()
        node_b.kill()


def test_early_refresh_renews_a_hot_entry_in_the_background(make_stack) -> None:
    # XFetch is random: with a 20 s TTL and beta 1e9 a hit is due unless rand() > 0.999998
    # (for a 5 ms computation), so the test does not depend on luck. The hit is served at
    # once and the entry renewed behind it.
    gw = make_stack(
        env={
            "LLMGATE_CACHE_EARLY_REFRESH_BETA": "1000000000",
            "LLMGATE_CACHE_TTL_S": "20",
            "LLMGATE_CACHE_TTL_JITTER_S": "0",
        }
    )
    gw.sim_reset()
    payload = body()
    assert ask(gw, payload).headers[STATUS] == "MISS"
    # Read your own write: the entry is stored before the first answer completes.
    hit = ask(gw, payload)
    assert hit.headers[STATUS].startswith("HIT")
    deadline = time.monotonic() + 5
    while gw.sim_stats()["requests"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gw.sim_stats()["requests"] == 2
    time.sleep(0.3)
    assert gw.sim_stats()["requests"] == 2  # one refresh, not one per poll


def test_answers_above_the_ceiling_are_served_not_stored(make_stack) -> None:
    gw = make_stack(env={"LLMGATE_CACHE_MAX_ENTRY_BYTES": "600"})
    payload = body(max_tokens=300)
    first = ask(gw, payload)
    assert first.status == 200 and first.headers[STATUS] == "MISS"
    assert ask(gw, payload).headers[STATUS] == "MISS"


def test_prewarm_from_jsonl_with_the_batch_cli(gw, tmp_path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    requests = [body(prompt=f"warm {i} {uuid.uuid4().hex}") for i in range(8)]
    src = tmp_path / "warm.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in requests))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGATE_", "OPENAI_"))}
    env.update(PYTHONPATH=str(ROOT), LLMGATE_BASE_URL=gw.url, LLMGATE_API_KEY="sk-alice")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmgate_client",
            "batch",
            str(src),
            str(tmp_path / "out.jsonl"),
            "--workers",
            "4",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "ok=8" in done.stderr  # progress and summary go to stderr
    for request in requests:
        assert ask(gw, request).headers[STATUS].startswith("HIT")
    assert gw.sim_stats()["requests"] == 8
