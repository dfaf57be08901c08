"""The one wait before a reply (app/streams/reply.py's ``reply_after``), which a flight's
listener and a stream of the caller's own both go through: a caller gone before the head is
a 499, a wait that raises leaves what it read, a head is what the trace learns."""

from __future__ import annotations

import gevent.socket
import pytest

from app.core.config import Settings
from app.core.errors import UpstreamReset
from app.request import routes
from app.request.call import CLIENT_CLOSED, Call
from app.streams.answer import ClientGone, Head
from app.streams.reply import Replies

BODY = Head(200, [("Content-Type", "application/json")], 2, b"{}", upstream="a")


class Source:
    """What a reply reads, counting its leaves; its caller's leaving recorded."""

    position = 0
    began = 10.0
    head_at: float | None = 10.25

    def __init__(self) -> None:
        self.left = 0
        self.gone = False

    def wait_head(self, timeout: float | None) -> Head | None:
        return None

    def next_batch(self, timeout: float | None) -> None:
        return None

    def lost(self) -> None:
        self.gone = True

    def leave(self) -> None:
        self.left += 1


def _call() -> Call:
    return Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}")


def _replies() -> Replies:
    return Replies(Settings(), lambda name: {})


def test_a_caller_gone_before_the_head_gets_nothing_and_what_it_read_is_left() -> None:
    reading = Source()

    def gone() -> Head | None:
        raise ClientGone()

    reply = _replies().reply_after(_call(), reading, gone)
    assert (reply.status, reply.body, reading.left) == (CLIENT_CLOSED, b"", 1)


def test_a_wait_that_raises_leaves_what_it_read_and_the_error_goes_on_up() -> None:
    reading = Source()

    def broken() -> Head | None:
        raise UpstreamReset("cut")

    with pytest.raises(UpstreamReset):
        _replies().reply_after(_call(), reading, broken)
    assert reading.left == 1


def test_a_head_is_what_the_trace_learns_and_a_whole_answer_leaves_at_once() -> None:
    reading, call = Source(), _call()
    reply = _replies().reply_after(call, reading, lambda: BODY)
    assert (reply.status, reply.body, reading.left) == (200, b"{}", 1)
    assert (call.trace.attempts, call.trace.upstream) == (2, "a")
    assert call.trace.stages.upstream_s == pytest.approx(0.25)


def test_the_caller_is_watched_while_the_head_is_waited_for() -> None:
    ours, peer = gevent.socket.socketpair()
    call = Call(routes.CHAT, "POST", "/v1/chat/completions", "", [], b"{}", ours)
    reading = Source()

    def slow() -> Head | None:
        peer.close()
        gevent.sleep(0.05)  # the watcher calls back from the hub meanwhile
        raise ClientGone() if reading.gone else AssertionError("not told")

    reply = _replies().reply_after(call, reading, slow)
    assert reply.status == CLIENT_CLOSED and call.trace.client_closed and reading.left == 1
    ours.close()
