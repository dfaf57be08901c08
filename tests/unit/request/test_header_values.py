"""A forwarded header value never carries a line break (app/request/headers.py); the check
made when a call is planned refuses what building its headers would, without building them."""

from __future__ import annotations

import pytest

from app.core.errors import BadRequest
from app.request.headers import check_header_values, upstream_request_headers

BROKEN = ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b", "\r\n"]
# Tabs and latin-1 go on; a header that never goes upstream is not judged.
PASSING = [("X-Custom", "a\tb ÿ"), ("X-Forwarded-For", "a\r\nb"), ("Cookie", "\x00")]


@pytest.mark.parametrize("value", BROKEN)
def test_a_value_with_cr_lf_or_nul_is_refused(value: str) -> None:
    with pytest.raises(BadRequest) as info:
        upstream_request_headers([("X-Custom", value)], stream=False)
    assert (info.value.status, info.value.code) == (400, "invalid_header_value")
    # The caller is told which header, and the message itself breaks no line (nor a log's).
    assert info.value.message == "The value of header 'X-Custom' has a CR, LF or NUL character."


def test_tabs_and_latin1_pass_and_dropped_headers_are_not_judged() -> None:
    out = upstream_request_headers(PASSING, stream=False)
    assert out["X-Custom"] == "a\tb ÿ"
    assert "X-Forwarded-For" not in out and "Cookie" not in out


@pytest.mark.parametrize("value", BROKEN)
def test_the_plans_check_refuses_what_building_the_headers_refuses(value: str) -> None:
    """A cache hit builds no upstream headers (app/gateway.py) and is refused all the same."""
    sent = [("Accept", "*/*"), ("X-Custom", value), ("X-Other", "fine")]
    with pytest.raises(BadRequest) as checked:
        check_header_values(sent)
    with pytest.raises(BadRequest) as built:
        upstream_request_headers(sent, stream=False)
    assert checked.value.to_body() == built.value.to_body()
    assert checked.value.status == 400


def test_the_plans_check_passes_what_building_the_headers_passes() -> None:
    check_header_values(PASSING)
    check_header_values([])
