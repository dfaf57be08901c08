"""gunicorn's error log keeps the kind of a refused request, never its content
(app/edge/worker.py)."""

from __future__ import annotations

import logging

from app.edge.worker import WithoutRequestContent


def logged(msg: str, *args: object) -> str:
    record = logging.LogRecord("gunicorn.error", logging.WARNING, __file__, 1, msg, args, None)
    assert WithoutRequestContent().filter(record)
    return record.getMessage()


def test_a_refused_request_line_is_logged_without_its_content() -> None:
    line = "Invalid request from ip=127.0.0.1: Invalid HTTP request line: 'GET /v1/m?api-key=sk-1'"
    assert logged(line) == (
        "Invalid request from ip=127.0.0.1: Invalid HTTP request line: (request content not logged)"
    )
    quoted = 'Invalid request from ip=::1: Invalid HTTP method: "G\'T sk-2"'
    assert "sk-2" not in logged(quoted)
    assert logged("Invalid request from ip=::1: Request Line is too large (9000 > 8190)") == (
        "Invalid request from ip=::1: Request Line is too large (9000 > 8190)"
    )


def test_a_failed_request_is_logged_with_its_path_only() -> None:
    message = logged("Error handling request %s %s", "GET", "/v1/models?api-key=sk-3")
    assert message == "Error handling request GET /v1/models"


def test_other_lines_pass_unchanged() -> None:
    assert logged("Booting worker with pid: %s", 42) == "Booting worker with pid: 42"
