"""bench/kit/loadgen.py's response parser keeps the one header it is asked for (the public
method reads each answer's Server-Timing so) and no other."""

from __future__ import annotations

from bench.kit.loadgen import _Response

ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nServer-Timing: queue;dur=1.0, gateway;dur=2.0"
    b"\r\nX-Other: y\r\n\r\n{}"
)


def test_the_header_asked_for_is_kept_with_its_value() -> None:
    resp = _Response(b"server-timing")
    assert resp.feed(ANSWER[:40]) is False and resp.feed(ANSWER[40:]) is True
    assert resp.kept == "queue;dur=1.0, gateway;dur=2.0"


def test_no_header_is_kept_unless_asked_for() -> None:
    resp = _Response()
    assert resp.feed(ANSWER) and resp.kept == ""
