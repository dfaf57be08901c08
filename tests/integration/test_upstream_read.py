"""How the gateway reads an upstream's answer: through a small buffer, whole all the same;
and how it finds that a kept connection was closed before it uses it again.

A held stream keeps its answer's buffered file open for as long as it lasts, so the buffer's
size is paid per open stream (the memory benchmark, bench/load/memory.py, counts it). The caller
still gets every byte: tests/integration/test_relay_faithful.py sends events of 60 KB in
awkward chunks through the same reader.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import weakref

import pytest
import urllib3

from app.core.config import Settings
from app.core.errors import UpstreamProtocolError
from app.streams.flight import Flight
from app.streams.upstream_call import UpstreamCall
from app.upstream.exchange import ReadRules, Upstream, UpstreamRequest
from app.upstream.pools import READ_BUFFER
from app.upstream.retry import Deadline
from tests.support.scripted_server import Exchange, LoopbackServer, Request, completion
from tests.support.sim import SimProcess
from tests.support.waiting import wait_for


def test_a_stream_is_read_through_a_small_buffer_to_its_end(sim: SimProcess) -> None:
    upstream = Upstream(Settings(upstream_url=sim.url + "/v1"))
    body = {"model": "sim-model", "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "read me"}]}  # fmt: skip
    req = UpstreamRequest("POST", "/chat/completions", "", {}, json.dumps(body).encode(), True)
    deadline = Deadline.start(30)
    resp = upstream.attempts.open(req, deadline)
    try:
        assert isinstance(resp.raw, urllib3.HTTPResponse) and resp.raw._fp is not None
        buffered = resp.raw._fp.fp  # http.client's file over the socket
        # A buffered reader's size counts its buffer: 8 KiB with http.client's default.
        assert sys.getsizeof(buffered) < READ_BUFFER + 1024 < 8192
        received = b""
        while chunk := upstream.reader.chunk(resp, deadline):
            received += chunk
        resp.release()  # read to its end: back to the pool (app/upstream/reading.py)
    finally:
        upstream.ledger.close(resp)
        upstream.transport.pool.clear()  # closes the pooled connection
    assert received.endswith(b"data: [DONE]\n\n")
    assert received.count(b"\n\ndata: {") >= 200  # every token's event, none cut


def test_a_kept_connection_the_upstream_closed_is_not_used_again() -> None:
    """An upstream that closes a kept connection while it is idle (its keep-alive timeout):
    the next call must see that before sending (urllib3's check of a kept connection, a
    poll for EOF) and go on a new connection. Nothing is retried here (LLMGATE_RETRIES=0),
    so a call sent on the dead connection would fail: it did, with the check overridden to
    answer "still open"."""

    def app(request: Request, exchange: Exchange) -> None:
        exchange.respond(200, completion("hi"))
        exchange.close()  # after the answer, no Connection: close: as an idle timeout does

    with LoopbackServer(app) as server:
        upstream = Upstream(Settings(upstream_url=server.url + "/v1", retries=0))
        req = UpstreamRequest("POST", "/chat/completions", "", {}, b"{}", False)
        try:
            for number in (1, 2):
                exchange = upstream.exchange(req, Deadline.start(10), ReadRules(1 << 20))
                with exchange.run(began=time.monotonic()) as answer:
                    assert answer.status == 200
                    assert answer.body is not None and json.loads(answer.body)["object"]

                def connected(n: int = number) -> bool:
                    return server.stats.connections == n

                assert wait_for(connected)
                time.sleep(0.2)  # the server's FIN has reached the kept connection
        finally:
            upstream.transport.pool.clear()
    assert (server.stats.requests, server.stats.connections) == (2, 2)


class _Builder:
    """Builds the request as the gateway's plan does (app/upstream/call_request.py), holding
    what the caller sent; ``built``: a weak reference to each request it built."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.built: list[weakref.ref[UpstreamRequest]] = []

    def __call__(self) -> UpstreamRequest:
        req = UpstreamRequest("POST", "/chat/completions", "", {}, self.body, False)
        self.built.append(weakref.ref(req))
        return req


def test_a_producer_makes_its_call_once_and_lets_go_of_the_request(sim: SimProcess) -> None:
    """The producer builds the request only when it runs, and keeps it (the caller's prompt)
    only until the answer started, nor what built it; run again, it has none to send and
    says so instead of sending something else."""
    upstream = Upstream(Settings(upstream_url=sim.url + "/v1"))
    body = {"model": "sim-model", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}
    build = _Builder(json.dumps(body).encode())
    produce = UpstreamCall(upstream, build, Deadline.start(30), max_body=1 << 20)
    built, builder = build.built, weakref.ref(build)
    del build
    assert built == []  # a producer that has not run has built nothing (a cache hit's)
    sim.reset()
    try:
        first = Flight(produce)
        listener = first.join()
        listener.wait_complete()
        listener.leave()
        assert first.head is not None and first.head.status == 200
        gc.collect()
        # The producer (still referenced here) let go of the request and of its builder.
        assert len(built) == 1 and built[0]() is None and builder() is None
        again = Flight(produce).join()
        with pytest.raises(UpstreamProtocolError, match="could not be relayed"):
            again.wait_complete()
        again.leave()
    finally:
        upstream.transport.pool.clear()
    assert sim.stats()["requests"] == 1
