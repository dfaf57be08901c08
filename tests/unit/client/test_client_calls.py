"""Client calls against a scripted loopback server: parsing, errors, retries, timeouts, pool."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from llmgate_client import (
    APIConnectionError,
    APIResponseError,
    APITimeoutError,
    BadRequestError,
    Client,
    DeadlineExceeded,
    RateLimitError,
    RetryPolicy,
    ServiceUnavailableError,
    Timeout,
)
from tests.support.scripted_server import Exchange, Request, completion, error_body, serve
from tests.support.waiting import wait_for

FAST = RetryPolicy(max_retries=3, backoff_initial=0.01, backoff_max=0.05)


def ok_app(request: Request, ex: Exchange) -> None:
    ex.respond(200, completion(f"echo {request.path}"), {"x-request-id": f"req-{request.number}"})


def test_chat_returns_parsed_completion_and_sends_auth() -> None:
    seen: list[Request] = []

    def app(request: Request, ex: Exchange) -> None:
        seen.append(request)
        ok_app(request, ex)

    with serve(app) as srv, Client(srv.url, "sk-test", model="m1") as client:
        result = client.chat("hi", temperature=0)
    assert result["object"] == "chat.completion"
    assert result.text == "echo /v1/chat/completions"
    assert (result.request_id, result.attempts) == ("req-1", 1)
    request = seen[0]
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.json() == {
        "model": "m1",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0,
    }


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_base_url_with_or_without_v1(suffix: str) -> None:
    with serve(ok_app) as srv, Client(srv.url + suffix, "k") as client:
        client.chat([{"role": "user", "content": "x"}], model="m")
        client.embeddings("x", model="e")
        assert srv.stats.paths == ["/v1/chat/completions", "/v1/embeddings"]


def test_models_and_embeddings() -> None:
    def app(request: Request, ex: Exchange) -> None:
        if request.path == "/v1/models":
            ex.respond(200, {"object": "list", "data": [{"id": "a"}, {"id": "b"}]})
        else:
            ex.respond(200, {"object": "list", "data": [{"index": 0, "embedding": [0.5]}]})

    with serve(app) as srv, Client(srv.url, "k") as client:
        assert [m["id"] for m in client.models()] == ["a", "b"]
        assert client.embeddings(["x"], model="e")["data"][0]["embedding"] == [0.5]


def test_error_body_becomes_typed_error_without_retry() -> None:
    def app(request: Request, ex: Exchange) -> None:
        body = error_body("bad field", "invalid_request_error", "bad")
        ex.respond(400, body, {"x-request-id": "req-err"})

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        with pytest.raises(BadRequestError) as info:
            client.chat("hi", model="m")
        assert srv.stats.requests == 1
    err = info.value
    assert (err.status, err.type, err.message) == (400, "invalid_request_error", "bad field")
    assert (err.request_id, err.attempts) == ("req-err", 1)


def test_retryable_status_then_success_reports_attempts() -> None:
    def app(request: Request, ex: Exchange) -> None:
        if request.number <= 2:
            ex.respond(503, error_body("busy", "server_error"))
        else:
            ok_app(request, ex)

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        result = client.chat("hi", model="m")
        assert srv.stats.requests == 3
        assert srv.stats.connections == 1  # error bodies are read, so keep-alive survives
    assert result.attempts == 3


def test_x_should_retry_false_is_final() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(503, error_body("busy", "server_error"), {"x-should-retry": "false"})

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        with pytest.raises(ServiceUnavailableError) as info:
            client.chat("hi", model="m")
        assert srv.stats.requests == 1
    assert info.value.attempts == 1


def test_retry_after_ms_is_honoured() -> None:
    def app(request: Request, ex: Exchange) -> None:
        if request.number == 1:
            ex.respond(429, error_body("slow", "rate_limit_error"), {"retry-after-ms": "300"})
        else:
            ok_app(request, ex)

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        started = time.monotonic()
        result = client.chat("hi", model="m")
        waited = time.monotonic() - started
    assert result.attempts == 2
    assert waited >= 0.25  # the server's 300 ms, not the 10-50 ms backoff


def test_retries_exhausted_raise_the_last_error_with_attempts() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(429, error_body("slow", "rate_limit_error"))

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        with pytest.raises(RateLimitError) as info:
            client.chat("hi", model="m")
        assert srv.stats.requests == 4
    assert info.value.attempts == 4


def test_total_deadline_bounds_retries() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(503, error_body("busy", "server_error"))

    policy = RetryPolicy(max_retries=1000, backoff_initial=0.05, backoff_max=0.1)
    with serve(app) as srv, Client(srv.url, "k", retries=policy, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(ServiceUnavailableError) as info:
            client.chat("hi", model="m")
        elapsed = time.monotonic() - started
        requests = srv.stats.requests
    assert elapsed < 1.0 + 0.5
    assert 2 <= info.value.attempts == requests < 1000


def test_a_backoff_that_oversleeps_the_deadline_raises_the_last_error() -> None:
    # A busy machine wakes a sleeper late: the backoff fitted when it began, the deadline
    # passed during it. That deadline prevented a retry and cut nothing off.
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(503, error_body("busy", "server_error"))

    with serve(app) as srv, Client(srv.url, "k", retries=FAST, timeout=0.5) as client:
        client._sleep = lambda delay: time.sleep(delay + 0.6)
        with pytest.raises(ServiceUnavailableError) as info:
            client.chat("hi", model="m")
        requests = srv.stats.requests
    assert info.value.attempts == requests == 1


def test_retry_that_cannot_fit_in_the_deadline_is_not_attempted() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(503, error_body("busy", "server_error"), {"retry-after": "5"})

    with serve(app) as srv, Client(srv.url, "k", retries=FAST, timeout=2.0) as client:
        started = time.monotonic()
        with pytest.raises(ServiceUnavailableError) as info:
            client.chat("hi", model="m")
        assert time.monotonic() - started < 1.0  # gave up at once instead of sleeping
        assert srv.stats.requests == 1
    assert info.value.attempts == 1


def test_connect_errors_are_retried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        client = Client(f"http://127.0.0.1:{port}", "k", retries=FAST)
        with client, pytest.raises(APIConnectionError) as info:
            client.chat("hi", model="m")
    assert info.value.attempts == 4
    assert info.value.request_sent is False


def test_connection_dropped_after_send_is_not_retried() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.reset()

    with serve(app) as srv, Client(srv.url, "k", retries=FAST) as client:
        with pytest.raises(APIConnectionError) as info:
            client.chat("hi", model="m")
        assert srv.stats.requests == 1  # the server may have started: no second bill
    assert info.value.request_sent is True and info.value.attempts == 1


def test_idle_timeout_before_headers() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.wait_gone(10)

    spec = Timeout(connect=1, read=0.3, total=10)
    with serve(app) as srv, Client(srv.url, "k", retries=FAST, timeout=spec) as client:
        started = time.monotonic()
        with pytest.raises(APITimeoutError) as info:
            client.chat("hi", model="m")
        assert time.monotonic() - started < 3
        assert srv.stats.requests == 1
    assert not isinstance(info.value, DeadlineExceeded)


def test_total_deadline_while_waiting_for_headers() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.wait_gone(10)

    spec = Timeout(connect=1, read=30, total=0.4)
    with serve(app) as srv, Client(srv.url, "k", timeout=spec) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.chat("hi", model="m")
        assert time.monotonic() - started < 0.4 + 1.0


def test_total_deadline_holds_against_a_trickling_body() -> None:
    def app(request: Request, ex: Exchange) -> None:
        body = b'{"choices": []' + b" " * 100 + b"}"
        ex.sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
        for i in range(len(body)):
            ex.sock.sendall(body[i : i + 1])
            if ex.wait_gone(0.05):
                return

    spec = Timeout(connect=1, read=1, total=0.6)  # every read is quick; the sum is not
    with serve(app) as srv, Client(srv.url, "k", timeout=spec) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.chat("hi", model="m")
        assert time.monotonic() - started < 0.6 + 1.0


def test_keep_alive_reuses_one_connection() -> None:
    with serve(ok_app) as srv, Client(srv.url, "k") as client:
        for _ in range(20):
            client.chat("hi", model="m")
        assert (srv.stats.requests, srv.stats.connections) == (20, 1)


def test_threads_share_a_bounded_pool() -> None:
    def app(request: Request, ex: Exchange) -> None:
        time.sleep(0.02)
        ok_app(request, ex)

    errors: list[BaseException] = []
    with serve(app) as srv, Client(srv.url, "k", pool_size=3) as client:

        def worker() -> None:
            try:
                for _ in range(5):
                    client.chat("hi", model="m")
            except BaseException as exc:  # collected for the assert below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert srv.stats.requests == 60
        assert srv.stats.connections <= 3
        assert srv.stats.max_in_flight <= 3


def test_waiting_for_a_pooled_connection_is_bounded_by_the_deadline() -> None:
    release = threading.Event()

    def app(request: Request, ex: Exchange) -> None:
        release.wait(10)
        ok_app(request, ex)

    with serve(app) as srv, Client(srv.url, "k", pool_size=1) as client:
        holder = threading.Thread(target=client.chat, args=("hi",), kwargs={"model": "m"})
        holder.start()
        assert wait_for(lambda: srv.stats.requests == 1)
        with pytest.raises(DeadlineExceeded) as info:
            client.chat("hi", model="m", timeout=0.3)
        assert info.value.request_sent is False
        release.set()
        holder.join()
        assert srv.stats.connections == 1


def test_non_json_success_body_is_a_response_error() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(200, b"<html>hello</html>", {"x-request-id": "req-html"})

    with serve(app) as srv, Client(srv.url, "k") as client:
        with pytest.raises(APIResponseError) as info:
            client.chat("hi", model="m")
        with pytest.raises(ValueError, match="chat_stream"):
            client.chat("hi", model="m", stream=True)
    assert info.value.request_id == "req-html" and info.value.status == 200
