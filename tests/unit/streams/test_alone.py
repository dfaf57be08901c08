"""A caller's own whole answer, made in its greenlet: what interrupts it, and only while it
runs; a bug before the exchange is a 502 with the log's word, as a flight's is. A stream of
the caller's own (``Solo``): the drain between two reads ends it before the next."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import gevent
import pytest

from app.core.config import Settings
from app.core.errors import GatewayShutdown, UpstreamProtocolError
from app.request import routes
from app.request.call import Call
from app.streams.alone import Guard, Interrupted, Solo, answer_alone
from app.streams.answer import Head
from app.streams.drain import Lifecycle
from app.streams.reply import Replies
from app.streams.upstream_call import UpstreamCall
from app.upstream.exchange import Upstream
from app.upstream.retry import Deadline
from llmgate_wire import sse


def _parked(guard_out: list[Guard], seen: list[BaseException | str]) -> None:
    """A call's greenlet: waits (as on an upstream), inside its guard, then outside it."""
    guard_out.append(Guard())
    try:
        gevent.sleep(30)
    except Interrupted as exc:
        gevent.sleep(0.01)  # its unwinding may wait too (closing an upstream connection)
        seen.append(exc)
    finally:
        guard_out[0].off()
    gevent.sleep(0.05)  # past its guard: nothing may reach it here
    seen.append("after")


def test_the_drain_interrupts_a_call_parked_in_its_guard_with_its_error() -> None:
    lifecycle = Lifecycle()
    guards: list[Guard] = []
    seen: list[BaseException | str] = []
    call = gevent.spawn(_parked, guards, seen)
    gevent.sleep(0.01)
    lifecycle.track(guards[0])
    lifecycle.stop_calls()  # from this greenlet, not the call's nor the hub
    call.join(5)
    assert call.successful() and len(seen) == 2 and seen[1] == "after"
    assert isinstance(seen[0], Interrupted) and isinstance(seen[0].error, GatewayShutdown)


def test_a_caller_leaving_interrupts_once_and_never_after_the_guard_is_off() -> None:
    guards: list[Guard] = []
    seen: list[BaseException | str] = []
    call = gevent.spawn(_parked, guards, seen)
    gevent.sleep(0.01)
    hub = gevent.get_hub()
    # Twice from the hub's loop, as the socket watcher calls it: the second finds it off.
    hub.loop.run_callback(guards[0].caller_left)
    hub.loop.run_callback(guards[0].caller_left)
    gevent.sleep(0.01)
    guards[0].shut_down(GatewayShutdown("late"))  # the drain, once the call left its guard
    call.join(5)
    assert call.successful() and len(seen) == 2 and seen[1] == "after"
    assert isinstance(seen[0], Interrupted) and seen[0].error is None


def test_a_bug_before_the_exchange_is_a_502_and_the_log_says_why(caplog) -> None:
    def build():
        raise ValueError("a bug of ours")

    upstream = Upstream(Settings(upstream_url="http://127.0.0.1:9/v1"))
    made = UpstreamCall(upstream, build, Deadline.start(30), max_body=1 << 20)
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")
    replies = Replies(Settings(), lambda name: {})
    lifecycle = Lifecycle()
    with caplog.at_level(logging.ERROR), pytest.raises(UpstreamProtocolError, match="relayed"):
        answer_alone(call, made, lifecycle, replies)
    assert "answer producer failed" in caplog.text and "a bug of ours" in caplog.text


class EndlessStream:
    """What ``Solo`` reads of an ``UpstreamCall``: a stream's head with its first event,
    then one event a read for as long as it is read; its reads counted."""

    def __init__(self) -> None:
        self.reads = 0
        self.closed = False

    def parts(self, began: float, request_id: str, patience: object = None) -> Iterator[object]:
        try:
            yield Head(200, [], 1, None), began
            while True:
                self.reads += 1
                yield [sse.Event.of_data(b"data: x\n\n", "x")]
        finally:
            self.closed = True

    def waitable(self) -> bool:
        return True  # read in the caller's greenlet once the first event is in


def test_the_drain_between_two_reads_ends_a_solo_stream_before_the_next() -> None:
    upstream = EndlessStream()
    solo = Solo(upstream, "req")  # type: ignore[arg-type]
    assert solo.wait_head(5) is not None
    batch = solo.next_batch(5)
    assert isinstance(batch, list) and len(batch) == 1
    assert isinstance(solo.next_batch(5), list)  # and another
    reads = upstream.reads
    solo.shut_down(GatewayShutdown("draining"))  # while no read runs: the caller writes
    assert isinstance(solo.next_batch(5), GatewayShutdown)
    assert upstream.reads == reads and upstream.closed  # no read after it; the call closed
