"""The upstream exchange's one entry and its one exit (app/upstream/exchange.py): however the
block under ``Exchange.run`` ends, the attempt is closed and accounted for once.

Scripted answers through the transport seam (no sockets); what is counted is read from the
metrics and the scripted response itself.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.core.config import Settings
from app.core.errors import ClientTooSlow, UpstreamEventTooLarge, UpstreamProtocolError
from app.observe.metrics import Metrics
from app.request import routes
from app.upstream.catalog import UpstreamSpec
from app.upstream.exchange import ReadRules, Upstream, UpstreamRequest
from app.upstream.retry import Deadline
from app.upstream.transport import Transport


class Streamed:
    """An answer's raw response: its body in the chunks one read each returns."""

    def __init__(self, chunks: list[bytes], ctype: str = "text/event-stream") -> None:
        self.status = 200
        self.headers = {"content-type": ctype}
        self.chunks = chunks
        self.closed = self.pooled = False

    def read1(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        if not self.closed:  # released open: its connection goes back to the pool
            self.pooled = True


class Answering(Transport):
    """Every attempt gets ``raw``; ``sent`` counts them."""

    def __init__(self, raw: Streamed) -> None:
        super().__init__(Settings())
        self.raw, self.sent = raw, 0

    def send(self, spec: Any, req: Any, deadline: Any) -> Any:
        self.sent += 1
        return self.raw


def _exchange(raw: Streamed, **reading: Any) -> tuple[Any, Upstream, Metrics]:
    metrics = Metrics(multiproc_dir="")
    upstream = Upstream(Settings(), [UpstreamSpec("a", "http://a.test/v1")], metrics=metrics,
                        transport=Answering(raw))  # fmt: skip
    req = UpstreamRequest(
        "POST", "/chat/completions", "", {}, b"{}", stream=True, route=routes.CHAT
    )
    exchange = upstream.exchange(
        req, Deadline.start(60), ReadRules(1 << 20, route=routes.CHAT, **reading)
    )
    return exchange, upstream, metrics


def _counted(metrics: Metrics) -> dict[str, float]:
    """Attempts by result and errors by cause, the ones that are not 0."""
    found = {}
    for family in (metrics.upstream_attempts, metrics.upstream_errors):
        for metric in family.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    found[sample.labels.get("result") or sample.labels["cause"]] = sample.value
    return found


def _read(answer: Any) -> list[list[bytes]]:
    return [[event.raw for event in batch] for batch in answer.events()]


def test_a_stream_comes_a_batch_per_read_and_its_attempt_is_ok_once_at_its_end() -> None:
    raw = Streamed([b"data: 1\n\ndata: 2\n\n", b"data: 3\n", b"\ndata: [DONE]\n\n", b"data: x"])
    exchange, upstream, metrics = _exchange(raw)
    with exchange.run(began=time.monotonic()) as answer:
        assert (answer.status, answer.body, answer.upstream, answer.attempts) == (200, None, "a", 1)
        assert answer.started_at is not None  # its first event is in
        batches = _read(answer)
        leftover = answer.leftover()
    assert batches == [[b"data: 1\n\n", b"data: 2\n\n"], [b"data: 3\n\n", b"data: [DONE]\n\n"]]
    assert leftover == b"data: x"
    assert raw.pooled  # read to its end: back to the pool
    assert _counted(metrics) == {"ok": 1}
    assert upstream.transport.in_use == 0


def test_a_block_that_fails_leaves_the_attempt_cancelled_and_its_connection_dropped() -> None:
    raw = Streamed([b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"])
    exchange, upstream, metrics = _exchange(raw)
    with pytest.raises(ClientTooSlow), exchange.run(began=time.monotonic()) as answer:
        for _ in answer.events():
            raise ClientTooSlow("the caller read nothing")
    assert raw.closed and not raw.pooled
    assert _counted(metrics) == {"cancelled": 1, "client_closed": 1}
    assert upstream.transport.in_use == 0


def test_a_bug_in_the_block_is_a_protocol_error_and_the_exchange_is_made_once() -> None:
    raw = Streamed([b"data: 1\n\n"])
    exchange, upstream, metrics = _exchange(raw)
    relayed = pytest.raises(UpstreamProtocolError, match="could not be relayed")
    with relayed, exchange.run(began=time.monotonic()):
        raise KeyError("a bug")
    assert raw.closed and _counted(metrics) == {"cancelled": 1, "protocol": 1}
    with pytest.raises(UpstreamProtocolError), exchange.run(began=time.monotonic()):
        pass  # run again: nothing is sent twice
    transport = upstream.transport
    assert isinstance(transport, Answering) and (transport.sent, transport.in_use) == (1, 0)


def test_an_event_too_large_comes_after_the_events_before_it_and_fails_the_attempt() -> None:
    raw = Streamed([b"data: 1\n\n", b"data: " + b"x" * 40 + b"\n\n", b"data: [DONE]\n\n"])
    exchange, upstream, metrics = _exchange(raw, max_event_bytes=16)
    batches: list[list[bytes]] = []
    with pytest.raises(UpstreamEventTooLarge), exchange.run(began=time.monotonic()) as answer:
        for batch in answer.events():
            batches.append([event.raw for event in batch])
    assert batches == [[b"data: 1\n\n"]]
    assert raw.closed and _counted(metrics) == {"failed": 1, "protocol": 1}
    assert upstream.transport.in_use == 0


def test_a_stream_cut_short_ends_quietly_and_fails_the_attempt() -> None:
    """No [DONE] on a chat stream: the relay tells each caller; the upstream is judged."""
    raw = Streamed([b"data: 1\n\n"])
    exchange, _, metrics = _exchange(raw)
    with exchange.run(began=time.monotonic()) as answer:
        assert _read(answer) == [[b"data: 1\n\n"]]
    assert raw.pooled and _counted(metrics) == {"failed": 1}


@pytest.mark.parametrize(
    ("chunks", "result"),
    [
        # [DONE], then the upstream's own keep-alive comments in reads of their own: an end.
        ([b"data: 1\n\n", b"data: [DONE]\n\n", b": ping\n\n", b": ping\n\n"], "ok"),
        ([b"data: 1\n\ndata: [DONE]\n\n: ping\n\n"], "ok"),
        ([b"data: 1\n\n", b"data: [DONE]\n\n: ping\n\n"], "ok"),
        # Comments after the last token do not stand in for the [DONE] that never came.
        ([b"data: 1\n\n", b": ping\n\n"], "failed"),
        ([b"data: 1\n\n: ping\n\n", b": ping\n\n"], "failed"),
    ],
)
def test_comments_after_the_last_event_neither_end_a_stream_nor_cut_it(
    chunks: list[bytes], result: str
) -> None:
    """What judges a stream's end is its last event that is not a comment."""
    exchange, _, metrics = _exchange(Streamed(chunks))
    with exchange.run(began=time.monotonic()) as answer:
        _read(answer)
    assert _counted(metrics) == {result: 1}
