"""The simulator over real TCP on loopback: shapes, determinism, faults, and its counters.

One simulator process serves the module (fast defaults: no TTFT, 2000 tokens/s); every test
starts from ``POST /sim/reset``. Timing assertions check lower bounds the simulator
guarantees (a stall lasts at least as long as asked); the few upper bounds ("headers come
before the stall") leave a margin of 100 ms or more and never measure speed.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import socket
import struct
import time
import zlib
from typing import Any

import openai
import pytest
import urllib3
from openai.types.chat import ChatCompletionMessageParam

from simulator import behaviour, http11, text
from tests.support.sim import SimProcess
from tests.support.waiting import wait_for

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello there simulator"}]
pytestmark = pytest.mark.usefixtures("fresh_sim")  # each test starts from /sim/reset


# --- helpers -------------------------------------------------------------------------------


def post_json(sim: SimProcess, path: str, body: Any, **headers: str) -> Any:
    status, _, data = sim.send("POST", path, body, _sim_headers(headers))
    assert status == 200, data
    return json.loads(data)


def _sim_headers(controls: dict[str, str]) -> dict[str, str]:
    return {f"x-sim-{name}": value for name, value in controls.items()}


def open_stream(
    sim: SimProcess, body: dict[str, Any], **controls: str
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=10)
    conn.request(
        "POST", CHAT, body=json.dumps({**body, "stream": True}), headers=_sim_headers(controls)
    )
    return conn, conn.getresponse()


def read_event(response: http.client.HTTPResponse) -> Any:
    """The next SSE event's data (parsed JSON, or the string "[DONE]"); None at EOF."""
    data: list[bytes] = []
    while True:
        line = response.readline()
        if not line:
            return None
        if line.strip() == b"":
            if data:
                payload = b"\n".join(data).decode()
                return payload if payload == "[DONE]" else json.loads(payload)
            continue
        assert line.startswith(b"data: "), line
        data.append(line[len(b"data: ") :].rstrip(b"\r\n"))


def stream_events(sim: SimProcess, body: dict[str, Any], **controls: str) -> list[Any]:
    conn, response = open_stream(sim, body, **controls)
    try:
        assert response.status == 200
        events = []
        while (event := read_event(response)) is not None:
            events.append(event)
        return events
    finally:
        conn.close()


# --- pure layers ---------------------------------------------------------------------------


def test_http_parser_whole_bytewise_and_pipelined() -> None:
    raw = b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}"
    trailing = b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"
    whole = http11.RequestParser()
    whole.feed(raw + trailing)
    first, second = whole.next_request(), whole.next_request()
    assert first is not None and second is not None and whole.next_request() is None
    assert (first.method, first.path, first.query, first.body) == ("POST", "/v1/x", "a=1", b"{}")
    assert first.header("host") == "h" and first.keep_alive
    assert second.path == "/healthz" and not second.keep_alive
    bytewise = http11.RequestParser()
    got = []
    for i in range(len(raw)):
        bytewise.feed(raw[i : i + 1])
        if (req := bytewise.next_request()) is not None:
            got.append(req)
    assert got == [first]


def test_http_parser_chunked_body_and_errors() -> None:
    parser = http11.RequestParser()
    parser.feed(
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    )
    req = parser.next_request()
    assert req is not None and req.body == b"abcde"
    for bad in (b"NOPE\r\n\r\n", b"GET / HTTP/2\r\n\r\n", b"GET / HTTP/1.1\r\nBad : x\r\n\r\n"):
        parser = http11.RequestParser()
        parser.feed(bad)
        with pytest.raises(http11.ProtocolError):
            parser.next_request()


def test_behaviour_sources_and_precedence() -> None:
    defaults = behaviour.Behaviour()
    b = behaviour.resolve(
        [("x-sim-ttft-ms", "5"), ("x-sim-fault", "none")],
        "sim/ttft_ms=500,fault=429,tokens=3",
        defaults,
    )
    assert (b.ttft_ms, b.fault, b.tokens, b.tps) == (5.0, None, 3, 100.0)
    with pytest.raises(behaviour.BehaviourError):
        behaviour.resolve([("x-sim-nope", "1")], None, defaults)
    with pytest.raises(behaviour.BehaviourError):
        behaviour.resolve([], "sim/fault=teapot", defaults)
    with pytest.raises(behaviour.BehaviourError):
        behaviour.resolve([("x-sim-tps", "0")], None, defaults)


def test_words_are_deterministic_with_leading_spaces() -> None:
    words = text.words("a prompt", 5)
    assert words == text.words("a prompt", 5) != text.words("another prompt", 5)
    assert not words[0].startswith(" ") and all(w.startswith(" ") for w in words[1:])
    assert text.words("a prompt", 3) == words[:3] and text.words("x", 0) == []


# --- chat completions ----------------------------------------------------------------------


def test_chat_non_stream_shape(sim: SimProcess) -> None:
    reply = post_json(sim, CHAT, {"model": "gpt-4o-mini", "messages": HELLO})
    assert reply["id"].startswith("chatcmpl-")
    assert isinstance(reply["created"], int)
    content = reply["choices"][0]["message"]["content"]
    assert reply == {
        "id": reply["id"],
        "object": "chat.completion",
        "created": reply["created"],
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19},
    }
    assert content == "".join(text.words("hello there simulator", 16))


def test_chat_is_deterministic_and_counts_tokens(sim: SimProcess) -> None:
    def content(messages: list[dict[str, Any]], **extra: Any) -> tuple[str, str, int]:
        reply = post_json(sim, CHAT, {"model": "m", "messages": messages, **extra})
        choice = reply["choices"][0]
        return (
            choice["message"]["content"],
            choice["finish_reason"],
            reply["usage"]["completion_tokens"],
        )

    assert content(HELLO) == content(HELLO)
    assert content(HELLO)[0] != content([{"role": "user", "content": "something else"}])[0]
    assert content(HELLO, max_tokens=4)[1:] == ("length", 4)
    assert content(HELLO, max_tokens=4, max_completion_tokens=2)[1:] == ("length", 2)
    reply = post_json(sim, CHAT, {"model": "m", "messages": HELLO, "max_tokens": 9}, tokens="3")
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] == 3


def test_chat_stream_chunk_shapes(sim: SimProcess) -> None:
    body = {"model": "sim-model", "messages": HELLO, "max_tokens": 3}
    events = stream_events(sim, body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    first = chunks[0]
    assert first["id"].startswith("chatcmpl-")
    words = text.words("hello there simulator", 3)

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "id": first["id"],
            "object": "chat.completion.chunk",
            "created": first["created"],
            "model": "sim-model",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    assert chunks == [
        chunk({"role": "assistant", "content": ""}, None),
        *(chunk({"content": w}, None) for w in words),
        chunk({}, "length"),
    ]
    non_stream = post_json(sim, CHAT, body)["choices"][0]["message"]["content"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == non_stream


def test_chat_stream_usage_chunk(sim: SimProcess) -> None:
    body = {"model": "m", "messages": HELLO, "stream_options": {"include_usage": True}}
    events = stream_events(sim, body, tokens="2")
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk = events[:-1]
    assert all(c["usage"] is None for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert {c["id"] for c in events[:-1]} == {chunks[0]["id"]}
    stats = sim.stats()
    assert (stats["streams_started"], stats["streams_completed"]) == (1, 1)


def test_legacy_completions(sim: SimProcess) -> None:
    body = {"model": "m", "prompt": "once upon a time", "max_tokens": 3}
    reply = post_json(sim, "/v1/completions", body)
    assert reply["object"] == "text_completion" and reply["id"].startswith("cmpl-")
    assert reply["choices"] == [
        {
            "text": "".join(text.words("once upon a time", 3)),
            "index": 0,
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=10)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}))
        response = conn.getresponse()
        events = []
        while (event := read_event(response)) is not None:
            events.append(event)
    finally:
        conn.close()
    assert events[-1] == "[DONE]"
    assert [e["object"] for e in events[:-1]] == ["text_completion"] * 4
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == reply["choices"][0]["text"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"


# --- other endpoints -----------------------------------------------------------------------


def test_embeddings_float_and_base64(sim: SimProcess) -> None:
    body = {"model": "text-embedding-3-small", "input": ["alpha beta", "gamma"], "dimensions": 8}
    floats = post_json(sim, "/v1/embeddings", body)
    assert floats["object"] == "list" and floats["model"] == "text-embedding-3-small"
    assert floats["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    vectors = [d["embedding"] for d in floats["data"]]
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert all(
        len(v) == 8 and math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5) for v in vectors
    )
    assert vectors[0] != vectors[1]
    packed = post_json(sim, "/v1/embeddings", {**body, "encoding_format": "base64"})
    decoded = [list(struct.unpack("<8f", base64.b64decode(d["embedding"]))) for d in packed["data"]]
    assert decoded == vectors
    single = post_json(sim, "/v1/embeddings", {"model": "e", "input": "gamma", "dimensions": 8})
    assert single["data"][0]["embedding"] == vectors[1]
    assert (
        len(post_json(sim, "/v1/embeddings", {"model": "e", "input": "x"})["data"][0]["embedding"])
        == 16
    )


def test_models_and_unknown_urls(sim: SimProcess) -> None:
    status, _, data = sim.send("GET", "/v1/models")
    ids = [m["id"] for m in json.loads(data)["data"]]
    assert status == 200 and {"sim-model", "gpt-4o-mini", "text-embedding-3-small"} <= set(ids)
    status, _, data = sim.send("GET", "/v1/models/gpt-4o-mini")
    assert status == 200 and json.loads(data)["id"] == "gpt-4o-mini"
    status, _, data = sim.send("GET", "/v1/models/no-such-model")
    assert status == 404 and json.loads(data)["error"]["code"] == "model_not_found"
    for method, path in (("GET", "/v1/nothing"), ("GET", CHAT), ("POST", "/v1/models")):
        status, headers, data = sim.send(method, path)
        assert status == 404 and headers["content-type"] == "application/json"
        assert json.loads(data) == {
            "error": {
                "message": f"Invalid URL ({method} {path})",
                "type": "invalid_request_error",
                "param": None,
                "code": "unknown_url",
            }
        }


def test_invalid_requests_get_openai_errors(sim: SimProcess) -> None:
    status, _, data = sim.send("POST", CHAT, b"{not json")
    assert status == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"
    status, _, data = sim.send("POST", CHAT, {"model": "m"})
    assert status == 400 and json.loads(data)["error"]["param"] == "messages"
    status, _, data = sim.send(
        "POST", "/v1/responses", {"model": "m", "input": "x", "service_tier": "gold"}
    )
    assert status == 400 and json.loads(data)["error"]["param"] == "service_tier"
    status, _, data = sim.send(
        "POST", CHAT, {"model": "m", "messages": HELLO}, {"x-sim-fault": "teapot"}
    )
    assert status == 400 and json.loads(data)["error"]["param"] == "fault"


def test_openai_sdk(sim: SimProcess) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "hello there simulator"}
    ]
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0) as client:
        completion = client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=4
        )
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None and completion.usage.completion_tokens == 4
        stream = client.chat.completions.create(
            model="sim-model",
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            completion.choices[0].message.content
        )
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 7
        embedded = client.embeddings.create(
            model="text-embedding-3-small", input=["a b"], dimensions=8
        )
        raw = post_json(sim, "/v1/embeddings", {"model": "e", "input": ["a b"], "dimensions": 8})
        assert embedded.data[0].embedding == raw["data"][0]["embedding"]
        assert "gpt-4o-mini" in [m.id for m in client.models.list()]
        response = client.responses.create(
            model="sim-model", input="hello there simulator", max_output_tokens=3
        )
        assert response.status == "completed"
        assert response.output_text == "".join(text.words("hello there simulator", 3))
        assert response.usage is not None and response.usage.output_tokens == 3


# --- timing --------------------------------------------------------------------------------


def test_ttft_and_tokens_per_second_are_lower_bounds(sim: SimProcess) -> None:
    body = {"model": "m", "messages": HELLO}
    start = time.monotonic()
    post_json(sim, CHAT, body, ttft_ms="200")
    assert time.monotonic() - start >= 0.2
    start = time.monotonic()
    conn, response = open_stream(sim, body, ttft_ms="250", tps="20", tokens="5")
    try:
        assert response.status == 200 and time.monotonic() - start < 0.15  # headers at once
        read_event(response)  # role chunk, sent with the first token
        assert time.monotonic() - start >= 0.25
        events = list(iter(lambda: read_event(response), None))
        assert events[-1] == "[DONE]"
        assert time.monotonic() - start >= 0.25 + 4 / 20  # five tokens, four gaps
    finally:
        conn.close()
    # The underscore spelling of a header works too (behind nginx only the dash one does).
    start = time.monotonic()
    status, _, _ = sim.send("POST", CHAT, body, {"x-sim-ttft_ms": "150"})
    assert status == 200 and time.monotonic() - start >= 0.15


# --- error faults and fail_times -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "error_type", "code", "retry"),
    [
        ("429", 429, "requests", "rate_limit_exceeded", True),
        ("500", 500, "server_error", None, False),
        ("503", 503, "server_error", None, True),
        ("401", 401, "invalid_request_error", "invalid_api_key", False),
    ],
)
def test_error_faults(
    sim: SimProcess, fault: str, status: int, error_type: str, code: str | None, retry: bool
) -> None:
    got, headers, data = sim.send(
        "POST",
        CHAT,
        {"model": "m", "messages": HELLO},
        {"x-sim-fault": fault, "x-sim-retry-after": "2"},
    )
    error = json.loads(data)["error"]
    assert got == status and (error["type"], error["code"]) == (error_type, code)
    if retry:
        assert (headers["retry-after"], headers["retry-after-ms"]) == ("2", "2000")
    else:
        assert "retry-after" not in headers
    assert sim.stats()["faults_injected"] == 1


def test_fault_from_model_name_with_fail_times(sim: SimProcess) -> None:
    body = {"model": "sim/fault=429,fail_times=2,fail_key=k1", "messages": HELLO}
    statuses = [sim.send("POST", CHAT, body)[0] for _ in range(3)]
    assert statuses == [429, 429, 200]
    other = {**body, "model": "sim/fault=500,fail_times=1,fail_key=k2"}
    assert [sim.send("POST", CHAT, other)[0] for _ in range(2)] == [500, 200]
    sim.reset()
    assert sim.send("POST", CHAT, body)[0] == 429
    # A header overrides the model name.
    assert sim.send("POST", CHAT, body, {"x-sim-fault": "none"})[0] == 200


def test_faults_apply_to_model_routes_via_headers(sim: SimProcess) -> None:
    status, headers, _ = sim.send("GET", "/v1/models", headers={"x-sim-fault": "503"})
    assert status == 503 and headers["retry-after"] == "1"
    status, headers, data = sim.send("GET", "/v1/models", headers={"x-sim-fault": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert json.loads(zlib.decompress(data, wbits=31))["object"] == "list"


# --- stream faults -------------------------------------------------------------------------


def test_reset_mid_stream(sim: SimProcess) -> None:
    conn, response = open_stream(sim, {"model": "m", "messages": HELLO}, fault="reset", tps="20")
    try:
        events = [read_event(response) for _ in range(3)]
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all("content" in e["choices"][0]["delta"] for e in events[1:])
        with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
            read_event(response)
    finally:
        conn.close()


def test_reset_instead_of_non_stream_reply(sim: SimProcess) -> None:
    with pytest.raises(ConnectionResetError):  # http.client.RemoteDisconnected is one too
        sim.send("POST", CHAT, {"model": "m", "messages": HELLO}, {"x-sim-fault": "reset"})


def test_stall_before_and_after(sim: SimProcess) -> None:
    start = time.monotonic()
    conn, response = open_stream(
        sim, {"model": "m", "messages": HELLO}, fault="stall-before", stall_ms="400"
    )
    try:
        assert response.status == 200
        assert time.monotonic() - start < 0.3  # headers come at once, the body stalls
        assert read_event(response) is not None
        assert time.monotonic() - start >= 0.4
    finally:
        conn.close()
    conn, response = open_stream(
        sim, {"model": "m", "messages": HELLO}, fault="stall-after", stall_ms="400", stall_after="2"
    )
    try:
        start = time.monotonic()
        for _ in range(3):  # role chunk and two content events
            read_event(response)
        assert time.monotonic() - start < 0.3
        assert "content" in read_event(response)["choices"][0]["delta"]
        assert time.monotonic() - start >= 0.4
        assert [e for e in iter(lambda: read_event(response), None)][-1] == "[DONE]"
    finally:
        conn.close()


def test_slow_headers(sim: SimProcess) -> None:
    start = time.monotonic()
    conn, response = open_stream(
        sim, {"model": "m", "messages": HELLO}, fault="slow-headers", header_delay_ms="300"
    )
    try:
        assert response.status == 200 and time.monotonic() - start >= 0.3
        assert list(iter(lambda: read_event(response), None))[-1] == "[DONE]"
    finally:
        conn.close()


def test_gzip_stream_decodes_event_by_event(sim: SimProcess) -> None:
    with urllib3.HTTPConnectionPool(sim.host, sim.port, maxsize=1) as pool:
        response = pool.request(
            "POST",
            CHAT,
            body=json.dumps({"model": "m", "messages": HELLO, "stream": True}),
            headers={"x-sim-fault": "gzip", "x-sim-tokens": "3"},
            preload_content=False,
        )
        assert response.headers["content-encoding"] == "gzip"
        decoder = zlib.decompressobj(wbits=31)
        events = []
        for piece in response.read_chunked(decode_content=False):
            plain = decoder.decompress(piece)
            if plain:  # every chunk carrying an event decodes to exactly that whole event
                assert plain.startswith(b"data: ") and plain.endswith(b"\n\n")
                events.append(plain)
        assert decoder.eof and len(events) == 1 + 3 + 1 + 1
        response.release_conn()
        reply = pool.request(
            "POST",
            CHAT,
            body=json.dumps({"model": "m", "messages": HELLO}),
            headers={"x-sim-fault": "gzip"},
        )
        assert (
            reply.headers["content-encoding"] == "gzip"
            and reply.json()["object"] == "chat.completion"
        )


def test_close_delimited_stream(sim: SimProcess) -> None:
    conn, response = open_stream(sim, {"model": "m", "messages": HELLO}, fault="close-delimited")
    try:
        headers = {k.lower(): v for k, v in response.getheaders()}
        assert "content-length" not in headers and "transfer-encoding" not in headers
        assert headers["connection"] == "close"
        assert response.read().endswith(b"data: [DONE]\n\n")
    finally:
        conn.close()
    assert sim.stats()["streams_completed"] == 1


def test_abandoned_stream_is_detected(sim: SimProcess) -> None:
    conn, response = open_stream(sim, {"model": "m", "messages": HELLO}, tps="5")
    read_event(response)
    read_event(response)
    conn.close()
    response.close()
    assert wait_for(lambda: sim.stats()["streams_abandoned"] == 1)
    stats = sim.stats()
    assert (stats["streams_started"], stats["streams_completed"]) == (1, 0)
    assert wait_for(lambda: sim.stats()["connections_open"] == 0)  # control calls are not counted


def test_stall_ends_when_client_leaves(sim: SimProcess) -> None:
    # The default stall is an hour: only hang-up detection can end it within the test.
    conn, response = open_stream(sim, {"model": "m", "messages": HELLO}, fault="stall-before")
    assert response.status == 200
    conn.close()
    response.close()
    assert wait_for(lambda: sim.stats()["streams_abandoned"] == 1)


# --- connections ---------------------------------------------------------------------------


def test_keep_alive_reuses_one_connection(sim: SimProcess) -> None:
    with urllib3.HTTPConnectionPool(sim.host, sim.port, maxsize=1, block=True) as pool:
        for i in range(10):
            body = json.dumps({"model": "m", "messages": HELLO, "stream": i % 2 == 0})
            assert pool.request("POST", CHAT, body=body).status == 200
        info = pool.request("GET", "/sim/connection").json()
    assert info == {"tcp_nodelay": True, "requests_on_connection": 11}
    assert sim.stats()["connections_accepted"] == 1


def test_a_connection_counts_when_accepted_unless_it_begins_with_a_control_request(
    sim: SimProcess,
) -> None:
    sim.reset()
    before = sim.stats()  # other tests' kept connections are open
    # A connection opened ahead of need (a pool's spare): counted before its first request.
    idle = socket.create_connection((sim.host, sim.port), timeout=5)
    early_control = socket.create_connection((sim.host, sim.port), timeout=5)
    try:
        assert wait_for(lambda: sim.stats()["connections_accepted"] == 2)
        assert sim.stats()["connections_unused"] == before["connections_unused"] + 2
        # One opened before a reset whose first request, a control one, comes after it:
        # uncounted once, in its own epoch, never below zero in the new one.
        sim.reset()
        early_control.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert early_control.recv(4096).startswith(b"HTTP/1.1 200")
        stats = sim.stats()
        assert stats["connections_accepted"] == 0
        # The idle one; a connection that begins with a control request is not an open one.
        assert stats["connections_open"] == before["connections_open"] + 1
        assert stats["connections_unused"] == before["connections_unused"] + 1
    finally:
        idle.close()
        early_control.close()
    assert wait_for(lambda: sim.stats()["connections_open"] == before["connections_open"])
    assert sim.stats()["connections_unused"] == before["connections_unused"]


def test_connection_close_is_honoured(sim: SimProcess) -> None:
    with socket.create_connection((sim.host, sim.port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close\r\n" in data
    assert data.endswith(b'{"ok":true}')


def test_http10_stream_is_close_delimited_and_chunked_requests_work(sim: SimProcess) -> None:
    body = json.dumps({"model": "m", "messages": HELLO, "stream": True}).encode()
    with socket.create_connection((sim.host, sim.port), timeout=5) as sock:
        sock.sendall(
            b"POST %s HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (CHAT.encode(), len(body), body)
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head and payload.endswith(b"data: [DONE]\n\n")
    with socket.create_connection((sim.host, sim.port), timeout=5) as sock:
        half = len(body) // 2
        sock.sendall(
            b"POST %s HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            % CHAT.encode()
            + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (half, body[:half], len(body) - half, body[half:])
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK") and b"data: [DONE]" in data


def test_expect_100_continue(sim: SimProcess) -> None:
    body = json.dumps({"model": "m", "messages": HELLO}).encode()
    with socket.create_connection((sim.host, sim.port), timeout=5) as sock:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nContent-Length: %d\r\nExpect: 100-continue\r\n"
            b"Connection: close\r\n\r\n" % (CHAT.encode(), len(body))
        )
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK") and b'"chat.completion"' in data


def test_non_stream_stall_ends_when_client_leaves(sim: SimProcess) -> None:
    body = json.dumps({"model": "m", "messages": HELLO}).encode()
    with socket.create_connection((sim.host, sim.port), timeout=5) as sock:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nContent-Length: %d\r\nx-sim-fault: stall-before\r\n\r\n%s"
            % (CHAT.encode(), len(body), body)
        )
        assert wait_for(lambda: sim.stats()["requests"] == 1)
    assert wait_for(lambda: sim.stats()["requests_abandoned"] == 1)


def test_request_log_and_counters(sim: SimProcess) -> None:
    sim.send(
        "POST",
        CHAT + "?trace=1",
        {"model": "m", "messages": HELLO},
        {"X-Tenant": "acme", "Authorization": "Bearer t"},
    )
    sim.send("GET", "/v1/models")
    sim.send("GET", "/healthz")
    log = sim.requests()
    assert [(e["method"], e["path"]) for e in log] == [("POST", CHAT), ("GET", "/v1/models")]
    first = log[0]
    assert first["query"] == "trace=1" and first["body"] == {"model": "m", "messages": HELLO}
    assert (
        first["headers"]["x-tenant"] == "acme" and first["headers"]["authorization"] == "Bearer t"
    )
    assert log[1]["body"] is None
    stats = sim.stats()
    assert stats["requests"] == 2 and stats["requests_by_path"] == {CHAT: 1, "/v1/models": 1}
    with urllib3.HTTPConnectionPool(sim.host, sim.port, maxsize=1) as pool:
        for _ in range(105):
            pool.request("GET", "/v1/models")
    assert len(sim.requests()) == 100


# --- the process ---------------------------------------------------------------------------


def test_require_key_and_clean_stop() -> None:
    with SimProcess(require_key="secret") as keyed:
        status, _, data = keyed.send("GET", "/v1/models")
        assert status == 401
        assert json.loads(data)["error"] == {
            "message": "Incorrect API key provided (simulator --require-key).",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
        assert keyed.send("GET", "/v1/models", headers={"Authorization": "Bearer secret"})[0] == 200
        assert keyed.send("GET", "/healthz")[0] == 200 and keyed.stats()["requests"] == 2
        assert keyed.stop() == 0


def test_start_failure_reports_stderr() -> None:
    with pytest.raises(RuntimeError, match="unrecognized arguments"):
        SimProcess("--no-such-flag").start()
