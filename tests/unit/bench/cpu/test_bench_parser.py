"""bench/cpu/parser.py measures what it says: gunicorn parses its request into the call nginx
sends."""

from __future__ import annotations

from gunicorn.config import Config
from gunicorn.http.parser import RequestParser

from bench.cpu import parser


def test_the_request_is_a_whole_chat_call_as_gunicorn_reads_it() -> None:
    cfg = Config()
    cfg.set("http_parser", "python")
    request = next(RequestParser(cfg, parser._Socket(parser.REQUEST), ("127.0.0.1", 1)))
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert len(request.headers) == len(parser.HEADERS) == 14
    assert request.body.read() == b"x" * 120


def test_it_times_the_python_parser() -> None:
    best, median = parser.us_per_request("python", requests=50, rounds=2)
    assert 0 < best <= median
