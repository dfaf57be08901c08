"""OpenTelemetry traces (LLMGATE_OTEL_ENDPOINT): the spans a real stack exports over OTLP/HTTP
to a receiver on loopback, parsed with opentelemetry-proto, for a streamed miss, a hit and a
coalesced follower; and the traceparent the simulator received.

One gunicorn worker, so the follower joins the leader's flight in the same process (across
workers it would wait on the Memcached lease instead, and have no leader span to link to).
OTEL_BSP_SCHEDULE_DELAY=100 makes each worker export within ~0.1 s of a span's end, from its
export thread (a real OS thread, off the gevent loop: app/observe/outbox.py), whose patched sockets
wait on a gevent hub of that thread's own: spans arriving at all is the check that it works.
test_trace_export.py has the collectors that never answer.
"""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import urllib3

from tests.support.otlp import OtlpReceiver, Span
from tests.support.sse_reader import data_events, read_events

CACHE = "X-LLMGate-Cache"
AUTH = {"Authorization": "Bearer sk-SECRET-trace-0123456789"}


@pytest.fixture(scope="session")
def receiver() -> Iterator[OtlpReceiver]:
    # Session-wide: the stack (session-scoped) exports into it until it stops.
    with OtlpReceiver() as r:
        yield r


@pytest.fixture
def traced(make_stack, receiver: OtlpReceiver):
    gw = make_stack(
        workers=1,
        env={"LLMGATE_OTEL_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    gw.sim_reset()
    return gw


def _traceparent() -> tuple[str, str, str]:
    """A caller's trace id, its span id, and the traceparent header carrying them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _body(prompt: str) -> bytes:
    return json.dumps(
        {
            "model": "sim-model",
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 12,
            "messages": [{"role": "user", "content": prompt}],
        }
    ).encode()


def _stream(gw, body: bytes, traceparent: str, http: urllib3.PoolManager | None = None):
    resp = (http or gw.http).request(
        "POST",
        gw.url + "/v1/chat/completions",
        body=body,
        headers={
            "Content-Type": "application/json",
            "traceparent": traceparent,
            "tracestate": "caller=1",
            "x-sim-ttft-ms": "300",
            "x-sim-tps": "40",
            **AUTH,
        },
        preload_content=False,
    )
    events = data_events(read_events(resp))
    assert resp.status == 200 and events[-1].event.is_done
    return resp.headers[CACHE]


def _one(spans: list[Span], **match) -> Span:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.name, s.kind) for s in spans])
    return found[0]


def _request_span(spans: list[Span], caller_span: str) -> Span:
    span = _one(spans, kind="server")
    assert span.name == "chat sim-model"
    assert span.parent_span_id == caller_span  # a child of the caller's span
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "sim-model"
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.request.max_tokens"] == 12
    assert a["gen_ai.response.model"] == "sim-model"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] == 12
    assert a["http.response.status_code"] == 200
    assert 0 < a["gen_ai.response.time_to_first_chunk"] < 10
    assert span.resource["service.name"] == "llmgate"
    return span


def _stream_span(spans: list[Span], parent: Span) -> Span:
    stream = _one(spans, name="stream")
    assert stream.parent_span_id == parent.span_id and stream.kind == "internal"
    (event,) = [e for e in stream.events if e[0] == "first_token"]
    assert stream.start_ns <= event[1] <= stream.end_ns <= parent.end_ns
    assert event[2]["gen_ai.response.time_to_first_chunk"] > 0
    return stream


def _no_content(spans: list[Span], prompt: str) -> None:
    """Nothing a caller wrote or an upstream generated is in a span: no prompt, no
    completion text, no credential."""
    text = repr([(s.name, s.attributes, s.events, s.links) for s in spans])
    assert prompt not in text and "SECRET" not in text and "content" not in text


def test_a_streamed_miss_a_hit_and_a_coalesced_follower(traced, receiver) -> None:
    gw = traced
    sim_port = int(gw.sim_url.rsplit(":", 1)[1])

    # -- a streamed miss: request, cache lookup, one upstream attempt, the stream --------
    prompt = f"trace me {uuid.uuid4().hex}"
    trace_id, caller_span, traceparent = _traceparent()
    assert _stream(gw, _body(prompt), traceparent) == "MISS"
    spans = receiver.wait_for(trace_id, 4)
    assert sorted(s.name for s in spans) == ["cache lookup", "chat sim-model", "chat sim-model",
                                             "stream"]  # fmt: skip
    request = _request_span(spans, caller_span)
    assert request.attributes["llmgate.cache"] == "miss"
    assert request.attributes["llmgate.coalesced"] is False
    assert request.status != 2 and "error.type" not in request.attributes  # a whole stream
    assert request.attributes["server.address"] == "127.0.0.1"
    assert request.attributes["server.port"] == sim_port
    lookup = _one(spans, name="cache lookup")
    assert lookup.parent_span_id == request.span_id
    assert lookup.attributes["llmgate.cache.lookup"] == "miss"
    attempt = _one(spans, kind="client")
    assert attempt.name == "chat sim-model" and attempt.parent_span_id == request.span_id
    assert attempt.attributes["server.address"] == "127.0.0.1"
    assert attempt.attributes["server.port"] == sim_port
    assert attempt.attributes["gen_ai.provider.name"] == "openai"
    assert attempt.attributes["gen_ai.request.model"] == "sim-model"
    assert attempt.attributes["http.response.status_code"] == 200
    assert attempt.attributes["llmgate.attempt"] == 1
    assert [e[0] for e in attempt.events] == ["first_event"]
    _stream_span(spans, request)
    _no_content(spans, prompt)
    # The upstream saw the caller's trace, with the attempt's span as the parent.
    (sent,) = gw.sim_requests()
    assert sent["headers"]["traceparent"] == f"00-{trace_id}-{attempt.span_id}-01"
    assert sent["headers"]["tracestate"] == "caller=1"

    # -- a hit: request, cache lookup (hit), the stream; no attempt, no upstream call ----
    hit_trace, hit_caller, hit_parent = _traceparent()
    assert _stream(gw, _body(prompt), hit_parent).startswith("HIT")
    spans = receiver.wait_for(hit_trace, 3)
    assert sorted(s.name for s in spans) == ["cache lookup", "chat sim-model", "stream"]
    request = _request_span(spans, hit_caller)
    assert request.attributes["llmgate.cache"] in ("hit_l1", "hit_l2")
    assert _one(spans, name="cache lookup").attributes["llmgate.cache.lookup"] in (
        "hit_l1",
        "hit_l2",
    )
    _stream_span(spans, request)
    assert len(gw.sim_requests()) == 1

    # -- a coalesced follower: its own request and stream spans, linked to the leader ----
    prompt = f"trace coalesced {uuid.uuid4().hex}"
    callers = [_traceparent() for _ in range(2)]
    http = urllib3.PoolManager(maxsize=2, retries=False)
    leader_in = threading.Event()

    def call(index: int) -> str:
        if index == 1:
            leader_in.wait(5)  # the follower comes while the leader waits for its first token
        else:
            threading.Timer(0.1, leader_in.set).start()
        return _stream(gw, _body(prompt), callers[index][2], http)

    with ThreadPoolExecutor(2) as pool:
        statuses = list(pool.map(call, range(2)))
    assert statuses == ["MISS", "COALESCED"]
    leader_spans = receiver.wait_for(callers[0][0], 4)
    follower_spans = receiver.wait_for(callers[1][0], 3)
    leader = _request_span(leader_spans, callers[0][1])
    follower = _request_span(follower_spans, callers[1][1])
    assert sorted(s.name for s in follower_spans) == ["cache lookup", "chat sim-model", "stream"]
    assert follower.attributes["llmgate.cache"] == "coalesced"
    assert follower.attributes["llmgate.coalesced"] is True
    assert follower.attributes["llmgate.leader.trace_id"] == callers[0][0]
    assert follower.links == [(callers[0][0], leader.span_id, {"llmgate.link": "coalesced_leader"})]
    # The follower's answer came from the leader's upstream call: the upstream's address.
    assert follower.attributes["server.port"] == sim_port
    _stream_span(follower_spans, follower)
    _no_content(leader_spans + follower_spans, prompt)
    # One upstream call, carrying the leader's trace.
    (_, second) = gw.sim_requests()
    leader_attempt = _one(leader_spans, kind="client")
    assert second["headers"]["traceparent"] == f"00-{callers[0][0]}-{leader_attempt.span_id}-01"


def test_a_call_without_traceparent_starts_a_trace_the_upstream_continues(traced, receiver) -> None:
    resp = traced.post(
        "/v1/embeddings", {"model": "sim-model", "input": f"x {uuid.uuid4().hex}"}, headers={**AUTH}
    )
    assert resp.status == 200
    (sent,) = traced.sim_requests()
    version, trace_id, parent, flags = sent["headers"]["traceparent"].split("-")
    # Sampled (bit 0); the SDK also sets Trace Context level 2's random-trace-id bit (0x02).
    assert version == "00" and int(flags, 16) & 1 and len(trace_id) == 32
    spans = receiver.wait_for(trace_id, 3)
    request = _one(spans, kind="server")
    assert request.name == "embeddings sim-model" and request.parent_span_id == ""
    assert request.attributes["gen_ai.operation.name"] == "embeddings"
    assert request.attributes["gen_ai.usage.input_tokens"] > 0
    assert _one(spans, kind="client").span_id == parent


@pytest.mark.parametrize(
    ("fault", "error_type"),
    [("error-after", "upstream_error"), ("reset", "upstream_reset")],
)
def test_a_stream_that_breaks_after_its_first_token_is_an_error_span(
    traced, receiver, fault: str, error_type: str
) -> None:
    """The answer's status is 200 by then; the error event that ends the stream (the
    upstream's own, relayed, or ours for a cut connection) sets error.type on the request's
    span and the stream's."""
    gw = traced
    trace_id, caller_span, traceparent = _traceparent()
    headers = {"Content-Type": "application/json", "traceparent": traceparent, **AUTH}
    headers |= {"x-sim-fault": fault, "x-sim-ttft-ms": "0"}
    resp = gw.http.request(
        "POST",
        gw.url + "/v1/chat/completions",
        body=_body(f"break me {uuid.uuid4().hex}"),
        headers=headers,
        preload_content=False,
    )
    events = data_events(read_events(resp))
    last = events[-1].event.data or ""
    assert resp.status == 200 and '"error"' in last  # the caller saw the stream end broken
    spans = receiver.wait_for(trace_id, 4)
    request = _one(spans, kind="server")
    assert request.parent_span_id == caller_span
    assert request.attributes["http.response.status_code"] == 200
    assert (request.status, request.attributes["error.type"]) == (2, error_type)
    stream = _one(spans, name="stream")
    assert (stream.status, stream.attributes["error.type"]) == (2, error_type)
    # The upstream attempt's span: a cut connection broke the attempt, and so did the
    # upstream's own error event after its 200 (app/upstream/reading.py); its span says which.
    attempt = _one(spans, kind="client")
    want = "upstream_reset" if fault == "reset" else "upstream_error"
    assert (attempt.status, attempt.attributes["error.type"]) == (2, want)
    # The call's log line says so too (its status is the 200 the caller got).
    request_id = resp.headers["X-LLMGate-Request-ID"]
    logged = [ln for ln in gw.log("gunicorn").splitlines() if ln.startswith("{")]
    lines = [json.loads(ln) for ln in logged if request_id in ln]
    assert [(ln["status"], ln["stream_error"]) for ln in lines] == [(200, error_type)]


def test_a_resumed_stream_links_to_the_stream_it_resumes(make_stack, receiver) -> None:
    env = {"LLMGATE_OTEL_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    gw = make_stack(workers=2, env={**env, "LLMGATE_RESUME_WINDOW_S": "10"})
    original, resumer = _traceparent(), _traceparent()
    resp = gw.http.request(
        "POST", gw.url + "/v1/chat/completions", body=_body(f"resumed {uuid.uuid4().hex}"),
        headers={"Content-Type": "application/json", "traceparent": original[2],
                 "X-LLMGate-Resumable": "true", **AUTH},
    )  # fmt: skip
    sid = resp.headers["X-LLMGate-Stream-ID"]
    again = gw.http.request("GET", f"{gw.url}/v1/streams/{sid}",
                            headers={"traceparent": resumer[2], **AUTH})  # fmt: skip
    assert again.status == 200 and again.data.endswith(b"data: [DONE]\n\n")
    first = _request_span(receiver.wait_for(original[0], 4), original[1])
    (span,) = [s for s in receiver.wait_for(resumer[0], 1) if s.kind == "server"]
    assert span.attributes["llmgate.resumed"] is True
    assert span.links == [(original[0], first.span_id, {"llmgate.link": "resumed_stream"})]
