"""chat_stream against a scripted loopback server: decoding, errors, early exit, deadlines."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from llmgate_client import (
    APIResponseError,
    APITimeoutError,
    Client,
    DeadlineExceeded,
    IncompleteStreamError,
    RetryPolicy,
    StreamError,
    Timeout,
)
from tests.support.scripted_server import (
    DONE,
    Exchange,
    Request,
    chunk,
    completion,
    error_body,
    serve,
    stream_tokens,
)
from tests.support.waiting import wait_for

FAST = RetryPolicy(max_retries=3, backoff_initial=0.01, backoff_max=0.05)
TOKENS = ["Hel", "lo", ", ", "wor", "ld"]


def tokens_app(request: Request, ex: Exchange) -> None:
    stream_tokens(ex, TOKENS)


def test_chunks_text_and_connection_reuse() -> None:
    with serve(tokens_app) as srv, Client(srv.url, "k", model="m") as client:
        with client.chat_stream("hi") as stream:
            chunks = list(stream)
        assert [c["choices"][0]["delta"].get("content") for c in chunks] == [*TOKENS, None]
        assert stream.completed and stream.text == "Hello, world"
        assert stream.finish_reason == "stop" and stream.request_id == "req-stream"
        assert "".join(client.chat_stream("again").text_deltas()) == "Hello, world"
        assert srv.stats.connections == 1  # a stream read to [DONE] returns its connection
        assert srv.stats.completed == 2
    body = srv.stats.paths
    assert body == ["/v1/chat/completions"] * 2


def test_request_asks_for_an_unencoded_event_stream() -> None:
    seen: list[Request] = []

    def app(request: Request, ex: Exchange) -> None:
        seen.append(request)
        tokens_app(request, ex)

    with serve(app) as srv, Client(srv.url, "k") as client:
        list(client.chat_stream("hi", model="m", stream_options={"include_usage": True}))
    headers, body = seen[0].headers, seen[0].json()
    assert headers["accept"] == "text/event-stream"
    assert headers["accept-encoding"] == "identity"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_heartbeats_and_byte_by_byte_delivery() -> None:
    wire = b": ping\n\n" + chunk("a") + b": ping\r\n\r\n" + chunk("b") + DONE

    def app(request: Request, ex: Exchange) -> None:
        ex.start_stream()
        for i in range(len(wire)):
            ex.send(wire[i : i + 1])
        ex.finish()

    with serve(app) as srv, Client(srv.url, "k") as client:
        assert list(client.chat_stream("hi", model="m").text_deltas()) == ["a", "b"]


def test_error_event_raises_stream_error() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.start_stream(headers={"x-request-id": "req-9"})
        ex.send(chunk("part"))
        ex.send(b'data: {"error": {"message": "upstream went away", "type": "upstream_error"}}\n\n')
        ex.finish()

    with serve(app) as srv, Client(srv.url, "k") as client:
        stream = client.chat_stream("hi", model="m")
        got = []
        with pytest.raises(StreamError) as info:
            for piece in stream.text_deltas():
                got.append(piece)
        assert srv.stats.requests == 1  # never retried once part of the stream was seen
    assert got == ["part"]
    err = info.value
    assert (err.message, err.type, err.request_id) == (
        "upstream went away",
        "upstream_error",
        "req-9",
    )


@pytest.mark.parametrize("ending", ["eof", "reset", "cut-event"])
def test_stream_that_ends_before_done_raises(ending: str) -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.start_stream()
        ex.send(chunk("part"))
        if ending == "cut-event":
            ex.send(b'data: {"choi')
            ex.finish()
        elif ending == "eof":
            ex.finish()
        else:
            time.sleep(0.05)
            ex.reset()

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        stream = client.chat_stream("hi", model="m")
        with pytest.raises(IncompleteStreamError):
            list(stream)
        assert srv.stats.requests == 1
    assert stream.text == "part" and not stream.completed


def test_statuses_before_the_stream_starts_are_retried() -> None:
    def app(request: Request, ex: Exchange) -> None:
        if request.number == 1:
            ex.respond(503, error_body("busy", "server_error"))
        else:
            tokens_app(request, ex)

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        stream = client.chat_stream("hi", model="m")
        assert stream.attempts == 2
        assert "".join(stream.text_deltas()) == "Hello, world"


def test_non_stream_reply_to_a_stream_request() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(200, completion("x"))

    with (
        serve(app) as srv,
        Client(srv.url, "k") as client,
        pytest.raises(APIResponseError, match="expected an event stream"),
    ):
        client.chat_stream("hi", model="m")


def slow_app(request: Request, ex: Exchange) -> None:
    stream_tokens(ex, [f"t{i} " for i in range(200)], gap=0.02)


@pytest.mark.parametrize("how", ["break", "break-text-deltas", "with-block", "close"])
def test_stopping_early_closes_the_connection(how: str) -> None:
    with serve(slow_app) as srv, Client(srv.url, "k", pool_size=1) as client:
        stream = client.chat_stream("hi", model="m")
        if how == "break":
            for _ in stream:
                break
        elif how == "break-text-deltas":
            for _ in stream.text_deltas():
                break
        elif how == "with-block":
            with stream:
                next(iter(stream))
        else:
            next(iter(stream.text_deltas()))  # the iterator is dropped right here
            stream.close()
        assert stream.closed and not stream.completed
        assert wait_for(lambda: srv.stats.abandoned == 1, timeout=3)
        # the pool's only slot came back: the next call does not wait for the old stream
        assert client.chat_stream("hi", model="m", timeout=5) is not None
        assert srv.stats.completed == 0


def test_abandoned_stream_is_closed_by_garbage_collection() -> None:
    with serve(slow_app) as srv, Client(srv.url, "k") as client:
        stream = client.chat_stream("hi", model="m")
        next(iter(stream))
        del stream
        gc.collect()
        assert wait_for(lambda: srv.stats.abandoned == 1, timeout=3)


def test_idle_timeout_mid_stream() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.start_stream()
        ex.send(chunk("a"))
        ex.wait_gone(10)

    spec = Timeout(connect=1, read=0.3, total=10)
    with serve(app) as srv, Client(srv.url, "k", timeout=spec) as client:
        stream = client.chat_stream("hi", model="m")
        with pytest.raises(APITimeoutError) as info:
            list(stream)
        assert not isinstance(info.value, DeadlineExceeded)
        assert stream.text == "a" and srv.stats.requests == 1


def test_total_deadline_covers_the_whole_stream() -> None:
    spec = Timeout(connect=1, read=5, total=0.5)
    with serve(slow_app) as srv, Client(srv.url, "k", timeout=spec) as client:
        started = time.monotonic()
        stream = client.chat_stream("hi", model="m")
        with pytest.raises(DeadlineExceeded):
            for _ in stream:
                pass
        assert time.monotonic() - started < 0.5 + 1.0
        assert stream.text  # it was streaming fine until the deadline
        assert wait_for(lambda: srv.stats.abandoned == 1, timeout=3)


def test_streams_from_many_threads_share_the_pool() -> None:
    failures: list[BaseException] = []
    with serve(tokens_app) as srv, Client(srv.url, "k", pool_size=4) as client:

        def worker() -> None:
            try:
                for _ in range(5):
                    assert (
                        "".join(client.chat_stream("hi", model="m").text_deltas()) == "Hello, world"
                    )
            except BaseException as exc:  # collected for the assert below
                failures.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert srv.stats.completed == 80 and srv.stats.connections <= 4
