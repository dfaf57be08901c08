"""A forwarded header value never carries a line break (app/request/headers.py)."""

from __future__ import annotations

import pytest

from app.core.errors import BadRequest
from app.request.headers import upstream_request_headers


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b", "\r\n"])
def test_a_value_with_cr_lf_or_nul_is_refused(value: str) -> None:
    with pytest.raises(BadRequest) as info:
        upstream_request_headers([("X-Custom", value)], stream=False)
    assert (info.value.status, info.value.code) == (400, "invalid_header_value")
    # The caller is told which header, and the message itself breaks no line (nor a log's).
    assert info.value.message == "The value of header 'X-Custom' has a CR, LF or NUL character."


def test_tabs_and_latin1_pass_and_dropped_headers_are_not_judged() -> None:
    out = upstream_request_headers(
        [("X-Custom", "a\tb ÿ"), ("X-Forwarded-For", "a\r\nb"), ("Cookie", "\x00")],
        stream=False,
    )
    assert out["X-Custom"] == "a\tb ÿ"
    assert "X-Forwarded-For" not in out and "Cookie" not in out
