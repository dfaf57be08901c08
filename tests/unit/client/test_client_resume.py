"""A resumable chat_stream that drops reconnects and carries on (docs/streams.md), against a
scripted gateway on loopback (tests/support/resumable.py): every chunk once, the resume
bound by the deadline, and a drop it cannot resume still an IncompleteStreamError."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgate_client import (
    Client,
    IncompleteStreamError,
    NotFoundError,
    ResumePolicy,
    StreamError,
    Timeout,
)
from llmgate_client.resume import event_number, offered_stream_id
from tests.support.resumable import SID, WHOLE, ResumableGateway, numbered
from tests.support.scripted_server import Exchange, Request, chunk, serve

SPEC = Timeout(connect=2, read=2, total=10)
QUICK = ResumePolicy(attempts=4, backoff_initial=0.01, backoff_max=0.05)
WHOLE_TEXT = "".join(WHOLE)


def contents(chunks: list[dict[str, Any]]) -> list[str | None]:
    return [c["choices"][0]["delta"].get("content") for c in chunks]


def run(gateway: ResumableGateway, **client: Any) -> tuple[list[dict[str, Any]], Any]:
    """Stream the gateway's answer with a fresh client; the chunks and the stream."""
    options: dict[str, Any] = {"timeout": SPEC, "resume": QUICK, **client}
    with serve(gateway.app) as srv, Client(srv.url, "sk-own", model="m", **options) as llm:
        stream = llm.chat_stream("hi", extra_headers={"x-tenant": "t1"})
        with stream:
            return list(stream), stream


@pytest.mark.parametrize("cut", ["reset", "eof"])
@pytest.mark.parametrize("done_numbered", [True, False])
def test_a_cut_stream_resumes_and_gives_each_chunk_once(cut: str, done_numbered: bool) -> None:
    gateway = ResumableGateway(cut_at=0, cut=cut, done_numbered=done_numbered)
    gateway.cut_at = gateway.offset_after(3)
    chunks, stream = run(gateway)
    assert contents(chunks) == [*WHOLE, None]
    assert stream.text == WHOLE_TEXT and stream.completed and stream.finish_reason == "stop"
    assert (stream.resumes, stream.stream_id) == (1, SID)
    post, get = gateway.requests
    assert post.headers["x-llmgate-resumable"] == "true"
    assert (get.method, get.path) == ("GET", f"/v1/streams/{SID}")
    assert get.headers["last-event-id"] == f"{SID}:3"
    assert get.headers["authorization"] == "Bearer sk-own"
    assert get.headers["x-tenant"] == "t1"  # the call's own headers go with it
    assert get.headers["accept"] == "text/event-stream"
    assert "x-llmgate-resumable" not in get.headers and get.body == b""


@settings(max_examples=60, deadline=None)
@given(data=st.data(), cut=st.sampled_from(["reset", "eof"]))
def test_a_cut_at_any_byte_loses_and_repeats_nothing(data: st.DataObject, cut: str) -> None:
    gateway = ResumableGateway(cut_at=0, cut=cut)
    gateway.cut_at = data.draw(st.integers(0, len(gateway.wire) - 1), label="cut_at")
    chunks, stream = run(gateway)
    assert contents(chunks) == [*WHOLE, None] and stream.text == WHOLE_TEXT
    assert stream.resumes == 1 and len(gateway.gets) == 1
    # The events the client had whole when the connection went: each ends in a blank line.
    whole_events = gateway.wire[: gateway.cut_at].count(b"\n\n")
    assert gateway.gets[0].headers["last-event-id"] == f"{SID}:{whole_events}"


def test_repeated_events_are_skipped() -> None:
    gateway = ResumableGateway(cut_at=0, resumes=["repeat"])
    gateway.cut_at = gateway.offset_after(4)
    chunks, stream = run(gateway)
    assert contents(chunks) == [*WHOLE, None] and stream.resumes == 1


def test_a_stream_that_drops_again_resumes_again() -> None:
    gateway = ResumableGateway(cut_at=0, resumes=["cut", "rest"])
    gateway.cut_at = gateway.offset_after(2)
    chunks, stream = run(gateway)
    assert contents(chunks) == [*WHOLE, None] and stream.resumes == 2
    assert [g.headers["last-event-id"] for g in gateway.gets] == [f"{SID}:2", f"{SID}:4"]


def test_failed_reconnects_are_tried_again() -> None:
    gateway = ResumableGateway(cut_at=0, resumes=["503", "reset", "rest"])
    gateway.cut_at = gateway.offset_after(3)
    chunks, stream = run(gateway)
    assert contents(chunks) == [*WHOLE, None] and stream.resumes == 1
    assert [g.headers["last-event-id"] for g in gateway.gets] == [f"{SID}:3"] * 3


def test_each_drop_has_its_own_attempts() -> None:
    # Three failed reconnects, one that brings two events and drops, three more failures:
    # with 4 attempts, the events in between start the second drop's count afresh.
    plans = ["503", "503", "503", "cut", "503", "503", "503", "rest"]
    gateway = ResumableGateway(cut_at=0, resumes=plans)
    gateway.cut_at = gateway.offset_after(2)
    chunks, stream = run(gateway)
    assert contents(chunks) == [*WHOLE, None] and stream.resumes == 2
    assert len(gateway.gets) == 8


def test_reconnects_run_out() -> None:
    gateway = ResumableGateway(cut_at=0, resumes=["503"] * 10)
    gateway.cut_at = gateway.offset_after(3)
    with pytest.raises(IncompleteStreamError, match=r"4 reconnects failed.*503") as info:
        run(gateway)
    assert len(gateway.gets) == 4 and "stream broke before [DONE]" in info.value.message


@pytest.mark.parametrize("cut", ["reset", "eof"])
def test_a_404_on_resume_is_an_incomplete_stream_naming_it(cut: str) -> None:
    gateway = ResumableGateway(cut_at=0, cut=cut, resumes=["404"])
    gateway.cut_at = gateway.offset_after(3)
    with pytest.raises(IncompleteStreamError, match="no longer has the stream") as info:
        run(gateway)
    assert "404" in info.value.message and "expired" in info.value.message
    assert isinstance(info.value.__cause__, NotFoundError)
    assert len(gateway.gets) == 1  # a 404 is final: not tried again


def test_the_deadline_bounds_resume_attempts() -> None:
    gateway = ResumableGateway(cut_at=0, resumes=["stall"] * 100)
    gateway.cut_at = gateway.offset_after(3)
    spec = Timeout(connect=1, read=0.3, total=1.5)
    patient = ResumePolicy(attempts=100, backoff_initial=0.01, backoff_max=0.05)
    started = time.monotonic()
    with pytest.raises(IncompleteStreamError, match="deadline") as info:
        run(gateway, timeout=spec, resume=patient)
    elapsed = time.monotonic() - started
    assert elapsed < 1.5 + 1.0
    assert 2 <= len(gateway.gets) <= 7  # each reconnect waited its idle timeout, 0.3 s
    assert info.value.request_id == "req-stream"


@pytest.mark.parametrize(
    ("offer", "stream_id"),
    [("no; reason=disabled", None), (None, None), ("yes; window=30", None), ("no", SID)],
)
def test_a_drop_the_gateway_did_not_make_resumable_raises(
    offer: str | None, stream_id: str | None
) -> None:
    gateway = ResumableGateway(cut_at=0, offer=offer, stream_id=stream_id)
    gateway.cut_at = gateway.offset_after(3)
    with pytest.raises(IncompleteStreamError, match="broke before"):
        run(gateway)
    assert len(gateway.requests) == 1


def test_resume_off_neither_asks_nor_resumes() -> None:
    gateway = ResumableGateway(cut_at=0)
    gateway.cut_at = gateway.offset_after(3)
    with pytest.raises(IncompleteStreamError):
        run(gateway, resume=False)
    assert len(gateway.requests) == 1
    assert "x-llmgate-resumable" not in gateway.requests[0].headers


def test_an_error_event_is_a_stream_error_and_no_resume() -> None:
    seen: list[Request] = []

    def app(request: Request, ex: Exchange) -> None:
        seen.append(request)
        ex.start_stream(headers={"x-llmgate-resumable": "yes", "x-llmgate-stream-id": SID})
        ex.send(numbered([chunk("part")]))
        ex.send(b'data: {"error": {"message": "upstream went away", "type": "upstream_error"}}\n\n')
        ex.finish()

    with serve(app) as srv, Client(srv.url, "k", model="m", resume=QUICK) as llm:
        stream = llm.chat_stream("hi")
        with pytest.raises(StreamError, match="upstream went away"):
            list(stream)
    assert [r.method for r in seen] == ["POST"] and stream.resumes == 0


def test_an_event_of_another_stream_is_not_taken_for_a_repeat() -> None:
    wire = b"id: other:1\n" + chunk("a") + f"id: {SID}:1\n".encode() + chunk("b")

    def app(request: Request, ex: Exchange) -> None:
        ex.start_stream(headers={"x-llmgate-resumable": "yes", "x-llmgate-stream-id": SID})
        ex.send(wire + b"data: [DONE]\n\n")
        ex.finish()

    with serve(app) as srv, Client(srv.url, "k", model="m") as llm:
        assert "".join(llm.chat_stream("hi").text_deltas()) == "ab"


def test_the_offer_and_the_event_numbers() -> None:
    assert offered_stream_id({"x-llmgate-resumable": "yes; window=30", "x-llmgate-stream-id": SID})
    assert offered_stream_id({"x-llmgate-resumable": "YES", "x-llmgate-stream-id": " a "}) == "a"
    assert offered_stream_id({"x-llmgate-resumable": "no; reason=budget"}) is None
    assert offered_stream_id({"x-llmgate-resumable": "yes"}) is None  # no id to resume with
    assert offered_stream_id({"x-llmgate-stream-id": SID}) is None
    assert event_number(f"{SID}:12", SID) == 12
    assert event_number(f"{SID}:0", SID) == 0
    for other in (None, "", "12", f"{SID}:", f"{SID}:x", f"{SID}:-1", f"x{SID}:3", f"{SID}:3:4"):
        assert event_number(other, SID) is None, other


def test_a_stream_stopped_early_is_deleted_and_one_read_to_the_end_is_not() -> None:
    gateway = ResumableGateway(cut_at=0)
    gateway.cut_at = len(gateway.wire)  # the whole answer, then the connection closes
    with serve(gateway.app) as srv, Client(srv.url, "sk-own", model="m", resume=QUICK) as llm:
        stream = llm.chat_stream("hi")
        with stream:
            next(iter(stream))  # the caller takes one chunk and stops
        finished = llm.chat_stream("hi")
        with finished:
            list(finished)
    deletes = [r for r in gateway.requests if r.method == "DELETE"]
    assert [(r.path, r.headers["authorization"]) for r in deletes] == [
        (f"/v1/streams/{SID}", "Bearer sk-own")
    ]


def test_a_stream_left_to_the_garbage_collector_sends_no_delete() -> None:
    import gc

    gateway = ResumableGateway(cut_at=0)
    gateway.cut_at = len(gateway.wire)
    with serve(gateway.app) as srv, Client(srv.url, "sk-own", model="m", resume=QUICK) as llm:
        stream = llm.chat_stream("hi")  # begun, never read, never closed by its caller
        del stream
        gc.collect()
    assert [r.method for r in gateway.requests] == ["POST"]
