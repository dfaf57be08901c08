"""gunicorn's own error answers, as the worker class writes them: OpenAI JSON, never HTML."""

from __future__ import annotations

import inspect
import json

import pytest
from gunicorn.workers.base import Worker

from app.edge.worker import error_answer


def parse(raw: bytes) -> tuple[str, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    assert int(headers["Content-Length"]) == len(body)
    return status_line, headers, json.loads(body)


INVALID = "invalid_request_error"


@pytest.mark.parametrize(
    ("status", "reason", "mesg", "kind", "code"),
    [
        (400, "Bad Request", "Invalid HTTP Header: 'CONTENT-TYPE'", INVALID, "bad_request"),
        (414, "URI Too Long", "Request Line is too large (9000 > 8190)", INVALID, "uri_too_long"),
        (431, "Request Header Fields Too Large", "Error parsing headers: 'x'", INVALID,
         "headers_too_large"),
        (418, "I'm a teapot", "", INVALID, None),
        (500, "Internal Server Error", "", "api_error", "internal_error"),
    ],
)  # fmt: skip
def test_every_gunicorn_error_is_openai_json(
    status: int, reason: str, mesg: str, kind: str, code: str | None
) -> None:
    status_line, headers, body = parse(error_answer(status, reason, mesg))
    assert status_line == f"HTTP/1.1 {status} {reason}"
    assert headers["Content-Type"] == "application/json"
    assert headers["Connection"] == "close"
    assert body == {
        "error": {"message": body["error"]["message"], "type": kind, "param": None, "code": code}
    }
    if status < 500:
        assert body["error"]["message"].startswith(reason)
        assert mesg in body["error"]["message"]


def test_a_500_says_nothing_of_the_failure() -> None:
    _, _, body = parse(error_answer(500, "Internal Server Error", "Traceback: secret details"))
    assert body["error"]["message"] == "Internal gateway error."


def test_gunicorn_still_writes_its_error_pages_through_util_write_error() -> None:
    # The worker class swaps gunicorn.util.write_error; a gunicorn that stops calling it
    # from Worker.handle_error would bring the HTML pages back.
    assert "util.write_error(" in inspect.getsource(Worker.handle_error)
