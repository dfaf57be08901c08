"""An error is fixed once made: what it answers with (status, type, code, retryable, headers,
...) is given when it is made, and a stage that would answer otherwise makes a copy. The
tables of allowed moves (app/core/moves.py) that lives are written as."""

from __future__ import annotations

import pytest

from app.core.errors import (
    GatewayError,
    RateLimited,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from app.core.moves import IllegalMove, after, checked


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retryable", False),
        ("headers", {}),
        ("code", None),
        ("type", "x"),
        ("status", 500),
        ("message", "other"),
        ("param", "model"),
        ("before_send", False),
    ],
)
def test_what_an_error_answers_with_cannot_be_changed_once_it_is_made(field, value) -> None:
    error = UpstreamUnreachable("down", headers={"retry-after": "1"}, param="p")
    before = (error.retryable, error.headers, error.code, error.message, error.to_json())
    with pytest.raises(AttributeError, match="fixed once it is made"):
        setattr(error, field, value)
    assert (error.retryable, error.headers, error.code, error.message, error.to_json()) == before


def test_with_retryable_is_a_copy_that_says_so_and_leaves_the_error_as_it_was() -> None:
    down = UpstreamUnreachable("Upstream unreachable: a:1.", headers={"x-a": "1"})
    assert down.retryable and "x-should-retry" not in down.response_headers()
    told = down.with_retryable(False)
    assert told is not down and type(told) is UpstreamUnreachable
    assert (told.message, told.status, told.code, told.type, told.args) == (
        down.message, down.status, down.code, down.type, down.args,
    )  # fmt: skip
    assert told.headers == down.headers and told.headers is not down.headers
    assert told.retryable is False and told.response_headers()["x-should-retry"] == "false"
    assert down.retryable and "x-should-retry" not in down.response_headers()  # unchanged
    with pytest.raises(AttributeError):
        told.retryable = True  # the copy is made too
    assert down.with_retryable(True) is down  # says so already: itself


def test_a_copy_keeps_what_the_subclass_added() -> None:
    timeout = UpstreamTimeout("connect", 2, retryable=True, before_send=True)
    told = timeout.with_retryable(False)
    assert (told.phase, told.before_send, told.code) == ("connect", True, "connect_timeout")
    assert "2s" in str(told) and not told.retryable


def test_the_fields_are_given_when_the_error_is_made() -> None:
    error = GatewayError("gone", status=410, type="invalid_request_error", code=None)
    assert error.to_body()["error"] == {
        "message": "gone", "type": "invalid_request_error", "param": None, "code": None,
    }  # fmt: skip
    assert GatewayError("x").code == "internal_error"  # not given: the class's
    # A call no wait makes fit: not retryable, and no retry-after to wait for.
    never = RateLimited("too large", kind="tokens", retry_after_s=None)
    assert (never.retryable, never.headers, never.type) == (False, {}, "tokens")
    later = RateLimited("later", kind="requests", retry_after_s=0)
    assert later.retryable and later.headers["retry-after"] == "1"


# -- the tables of allowed moves ------------------------------------------------------------
TABLE = checked({"idle": {"go": "busy"}, "busy": {"stop": "idle", "end": "done"}, "done": {}})


def test_a_move_the_table_lists_leads_where_it_says() -> None:
    assert after(TABLE, "a thing", "idle", "go") == "busy"
    assert after(TABLE, "a thing", "busy", "end") == "done"


def test_a_move_the_table_does_not_list_is_illegal_and_says_which() -> None:
    with pytest.raises(IllegalMove, match="a thing cannot go when busy") as caught:
        after(TABLE, "a thing", "busy", "go")
    assert (caught.value.state, caught.value.move) == ("busy", "go")
    with pytest.raises(IllegalMove):
        after(TABLE, "a thing", "done", "stop")  # a final state allows nothing


def test_a_table_that_sends_a_move_nowhere_fails_when_written() -> None:
    with pytest.raises(ValueError, match="without a row"):
        checked({"idle": {"go": "gone"}})
