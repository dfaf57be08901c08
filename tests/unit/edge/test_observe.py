"""The bounded labels, the answer's usage and tier, and the stream observation behind the
metrics and the log line."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.core.config import Settings
from app.edge.finish import _response_model, cache_outcome, finish
from app.edge.stream_facts import StreamFacts
from app.observe.metrics import Metrics
from app.observe.unobserved import UNOBSERVED
from app.request import jsonedit, routes
from app.request.call import SSE_HEADERS, Call, Reply, Trace
from app.request.stages import Stages
from app.request.usage import Usage, answer_facts
from llmgate_wire import sse
from tests.support.clock import Clock
from tests.support.server_timing import relay_of


def test_cache_outcome_labels_are_bounded() -> None:
    def outcome(value: str | None) -> str:
        return cache_outcome(Reply(200, [], b"", cache=value))

    assert outcome("HIT; level=l1") == "hit_l1"
    assert outcome("HIT; level=l2") == "hit_l2"
    assert [outcome(v) for v in ("MISS", "BYPASS", "REFRESH", "COALESCED")] == [
        "miss",
        "bypass",
        "refresh",
        "coalesced",
    ]
    assert outcome(None) == "bypass"


def test_a_whole_answers_model_for_its_span_is_the_last_top_level_model_of_utf8_json() -> None:
    """The span's response model of a whole answer, read in one parse, against the member
    scan it replaced (jsonedit.find_member, the JSON the caller was sent): the last
    top-level ``model`` of a UTF-8 JSON object (a BOM allowed), else nothing."""

    def scanned(body: bytes) -> str | None:
        try:
            raw = jsonedit.find_member(body, "model")
        except ValueError:
            return None
        model = json.loads(raw) if raw is not None else None
        return model if isinstance(model, str) else None

    bodies = {
        b'{"id": "a", "model": "m-1", "choices": [{"model": "inner"}]}': "m-1",
        b'\xef\xbb\xbf{"model": "bom"}': "bom",
        b'\xef\xbb\xbf\xef\xbb\xbf{"model": "two boms"}': None,
        b'{"model": "first", "x": 1, "model": "last"}': "last",
        b'{"model": "m", "model": 7}': None,
        '{"model": "wide"}'.encode("utf-16"): None,  # JSON, but not UTF-8
        b'{"model": "\xed\xa0\x80"}': None,  # a lone surrogate: not UTF-8
        b'{"model": "m"} {"model": "n"}': None,
        b'{"model": "m",}': None,
        b'["model", "m"]': None,
        b"": None,
        b' \r\n{"model": "\\u00e9t\xc3\xa9"} \t': "\u00e9t\u00e9",
    }
    for body, model in bodies.items():
        assert scanned(body) == model, body
        assert _response_model(Reply(200, [], body), StreamFacts()) == model, body
    assert _response_model(Reply(500, [], b'{"model": "m"}'), StreamFacts()) is None


def test_a_generated_answers_usage_and_tier_are_its_top_level_members_only() -> None:
    nested = {"service_tier": "flex", "usage": {"total_tokens": 99}}
    answer: dict[str, Any] = {
        "choices": [{"message": {"content": '"service_tier": "priority"', "tool": nested}}],
        "usage": {"total_tokens": 5},
        "service_tier": "default",
    }
    usage, tier = answer_facts(json.dumps(answer).encode(), routes.CHAT)
    assert (usage, tier) == (Usage({"total_tokens": 5}), "default")
    answer.pop("service_tier")
    answer["usage"] = None
    assert answer_facts(json.dumps(answer).encode(), routes.RESPONSES) == (None, None)
    assert answer_facts(b'{"service_tier": "' + b"x" * 100 + b'"}', routes.CHAT)[1] == "x" * 32
    for body in (b"[1]", b"{broken", b'"\xff"', b"\xff"):
        assert answer_facts(body, routes.COMPLETIONS) == (None, None)
    # An embeddings answer is searched for its usage, never parsed whole, and has no tier.
    embedding = b'{"data":[{"embedding":[0.5]}],"service_tier":"flex","usage":{"total_tokens":2}}'
    assert answer_facts(embedding, routes.EMBEDDINGS) == (Usage({"total_tokens": 2}), None)


def test_server_timing_names_its_parts(monkeypatch) -> None:
    monkeypatch.setattr(time, "monotonic", Clock(0.3))
    trace = Trace(started=0.0, stages=Stages(cache_s=0.002, upstream_s=0.25))
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}", trace=trace)
    reply, _ = finish(call, Reply(200, [], b"{}"), Settings(), UNOBSERVED)
    value = dict(reply.headers)["Server-Timing"]
    assert value == "cache;dur=2.0, upstream;dur=250.0, work;dur=48.0, gateway;dur=50.0"
    bare = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    reply, _ = finish(bare, Reply(200, [], b"{}"), Settings(), UNOBSERVED)
    assert "upstream" not in dict(reply.headers)["Server-Timing"]


def test_a_streams_batches_go_out_joined_and_every_event_is_observed(caplog) -> None:
    usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    first = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    second = b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
    last = b"data: " + json.dumps({"choices": [], "usage": usage}, separators=(",", ":")).encode()
    last += b"\n\n"
    batches = [[sse.comment()], [first, second, last, b"data: [DONE]\n\n"], []]
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    reply, body = finish(call, Reply(200, list(SSE_HEADERS), iter(batches)), Settings(), UNOBSERVED)
    assert reply.status == 200 and not isinstance(body, bytes)
    with caplog.at_level(logging.INFO, logger="llmgate.access"):
        writes = list(body)
    # One write per batch that has bytes (an empty one would end the chunked response); the
    # relay's time (a comment: Server-Timing is on by default) just before the [DONE].
    assert [writes[0], relay_of(writes[1])[0]] == [
        sse.comment(),
        first + second + last + b"data: [DONE]\n\n",
    ]
    assert len(writes) == 2 and writes[1].startswith(first + second + last + b": server-timing:")
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "llmgate.access"]
    assert line["bytes_out"] == sum(map(len, writes))
    assert line["tokens_out"] == 3  # the usage event was found inside its batch
    assert line["ttft_ms"] is not None


@pytest.mark.parametrize(
    ("end", "ends"),
    [
        (b"data: [DONE]\n\n", True),
        (b"id: 9\ndata: [DONE]\n\n", True),  # the upstream's own id line: still its end
        (b'data: {"choices":[]}\n\n', False),  # cut before its end: the comment after it
    ],
    ids=["done", "done-with-the-upstreams-id", "no-end"],
)
def test_a_chat_streams_relay_time_heads_its_end_events_block(end: bytes, ends: bool) -> None:
    """The relay's time (a comment) goes at the head of the block of a chat stream's
    [DONE], also when the upstream numbered its events with id lines of its own; a stream
    that never reached its end gets it after its last bytes, in a block of its own."""
    token = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    reply = Reply(200, list(SSE_HEADERS), iter([[token], [end]]))
    _, body = finish(call, reply, Settings(), UNOBSERVED)
    assert not isinstance(body, bytes)
    writes = list(body)
    assert writes[0] == token
    if ends:
        assert len(writes) == 2 and writes[1].startswith(b": server-timing: relay;dur=")
        assert writes[1].endswith(b"\n" + end) and writes[1].count(b"\n\n") == 1
    else:
        assert writes[1] == end and writes[2].startswith(b": server-timing: relay;dur=")
        assert len(writes) == 3 and writes[2].endswith(b"\n\n")


@pytest.mark.parametrize("resumable", [False, True])
def test_a_streams_figures_come_from_its_batches_as_they_leave(
    monkeypatch, caplog, resumable: bool
) -> None:
    """Time to first token, tokens a second and heartbeats, by the clock each batch left at:
    the usual path (one call a batch) and the general one (a resumable stream's id lines)."""
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)

    def data(content: str) -> bytes:
        return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % content.encode()

    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":4}}\n\n'
    timed = [  # (when it leaves, the batch): five output events in all, the last two at 4.0
        (0.7, [sse.comment()]),
        (1.0, [data("a")]),
        (1.5, [sse.comment()]),
        (2.0, [data("b"), data("c")]),
        (4.0, [data("d"), usage, b"data: [DONE]\n\n"]),
    ]
    if resumable:
        timed = [(t, [sse.with_id(e, f"s:{t}") if e.startswith(b"data") else e for e in b])
                 for t, b in timed]  # fmt: skip

    def batches() -> Iterator[list[bytes]]:
        for when, batch in timed:
            clock.now = when
            yield batch

    metrics = Metrics(multiproc_dir="")
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    call.trace.started = 0.5
    reply = Reply(200, list(SSE_HEADERS), batches(), stream_id="s" if resumable else None)
    _, body = finish(call, reply, Settings(), metrics)
    assert not isinstance(body, bytes)
    with caplog.at_level(logging.INFO, logger="llmgate.access"):
        writes = list(body)
    figures = _figures(metrics)
    assert figures["llmgate_heartbeats_total"] == 2
    assert figures["llmgate_ttft_seconds_sum"] == pytest.approx(0.5)  # 1.0, from 0.5
    # Five events from 1.0 to 4.0: four more in three seconds.
    assert figures["llmgate_stream_tokens_per_second_count"] == 1
    assert figures["llmgate_stream_tokens_per_second_sum"] == pytest.approx(4 / 3)
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "llmgate.access"]
    # Every byte sent: the batches, and the relay's time before the end (Server-Timing's).
    relayed = sum(len(e) for _, b in timed for e in b)
    sent = b"".join(writes)
    without, relay = relay_of(sent)
    assert line["bytes_out"] == len(sent) and len(without) == relayed and relay is not None
    assert sent.endswith(b"data: [DONE]\n\n")
    assert (line["ttft_ms"], line["tokens_out"]) == (500.0, 4)


@pytest.mark.parametrize(
    ("tiers", "logged"),
    [
        (["default", "default", "default"], "default"),  # OpenAI: in every event
        ([None, None, "flex"], "flex"),  # once, with the usage at the end
        (["priority", None, None], "priority"),
        ([None, None, None], None),
        ([None, "scale", None], None),  # only in between: not looked for (finish.py's ended)
    ],
)
def test_a_streams_tier_is_its_first_data_events_else_its_last(
    caplog, tiers: list[str | None], logged: str | None
) -> None:
    def event(k: int, tier: str | None) -> bytes:
        data: dict[str, Any] = {"choices": [{"index": 0, "delta": {"content": str(k)}}]}
        if k == 2:
            data = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
        if tier is not None:
            data["service_tier"] = tier
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    batches = [[event(k, tier)] for k, tier in enumerate(tiers)] + [[b"data: [DONE]\n\n"]]
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    _, body = finish(call, Reply(200, list(SSE_HEADERS), iter(batches)), Settings(), UNOBSERVED)
    with caplog.at_level(logging.INFO, logger="llmgate.access"):
        list(body)
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "llmgate.access"]
    assert (line["service_tier"], line["tokens_out"]) == (logged, 2)


def test_a_request_is_counted_after_every_other_figure_of_it() -> None:
    """A scrape that sees a request counted (tests wait on that counter, from another
    worker) must see its time to first token and the rest of its figures too."""
    metrics = Metrics(multiproc_dir="")
    seen: list[dict[str, float]] = []
    counter = metrics.requests

    class Spy:  # the real counter, with a look at the other figures as it is counted
        def labels(self, *values: str) -> Any:
            seen.append(_figures(metrics))
            return counter.labels(*values)

    metrics.requests = Spy()  # type: ignore[assignment]
    event = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    call.trace.client_closed = True
    _, body = finish(call, Reply(200, list(SSE_HEADERS), iter([[event]])), Settings(), metrics)
    assert list(body)[:-1] == [event]  # then the relay time's comment
    (before,) = seen
    assert before["llmgate_ttft_seconds_count"] == 1
    assert before["llmgate_request_duration_seconds_count"] == 1
    assert before["llmgate_upstream_errors_total"] == 1
    assert before["llmgate_added_seconds_count"] > 0  # the stages (Server-Timing's)
    assert _figures(metrics)["llmgate_requests_total"] == 1


def _figures(metrics: Metrics) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def test_an_answer_with_negative_token_counts_is_still_logged_and_counted(caplog) -> None:
    """Usage is the provider's word, and a broken provider can send anything: a negative
    count reaches the log line as sent (the receipt) but no counter, which would refuse it
    and lose the log line and the request's own count with it."""
    metrics = Metrics(multiproc_dir="")
    usage = {
        "prompt_tokens": -5,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": -1},
    }
    answer = json.dumps({"choices": [], "usage": usage}).encode()
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    with caplog.at_level(logging.INFO, logger="llmgate.access"):
        finish(
            call, Reply(200, [("Content-Type", "application/json")], answer), Settings(), metrics
        )
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "llmgate.access"]
    assert line["usage"] == usage and line["tokens_in"] == -5
    figures = _figures(metrics)
    assert figures["llmgate_requests_total"] == 1
    assert figures.get("llmgate_prompt_tokens_total", 0) == 0


def test_the_upstreams_request_id_is_kept_and_ours_added_only_where_it_has_none() -> None:
    def finished(headers: list[tuple[str, str]]) -> tuple[Trace, list[tuple[str, str]]]:
        call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
        call.trace.request_id = "ours"
        reply, _ = finish(call, Reply(200, list(headers), b"{}"), Settings(), UNOBSERVED)
        return call.trace, [(k, v) for k, v in reply.headers if "request-id" in k.lower()]

    trace, ids = finished([("x-request-id", "req_up"), ("X-Request-ID", "second")])
    assert trace.upstream_request_id == "req_up"  # the first, in any case
    assert ids == [("x-request-id", "req_up"), ("X-Request-ID", "second"),
                   ("X-LLMGate-Request-ID", "ours")]  # fmt: skip
    trace, ids = finished([("X-REQUEST-ID", "")])  # named, if empty: the caller has an id
    assert trace.upstream_request_id == "" and ids == [
        ("X-REQUEST-ID", ""),
        ("X-LLMGate-Request-ID", "ours"),
    ]
    trace, ids = finished([("Content-Type", "application/json")])
    assert trace.upstream_request_id is None
    assert ids == [("X-LLMGate-Request-ID", "ours"), ("X-Request-ID", "ours")]
