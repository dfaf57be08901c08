"""A ledger URL's password never reaches a log line or the spend CLI's output: not in the URL
as shown (``redacted``), nor in a driver's message that quotes the URL or the password
(``scrubbed``), plain or percent-encoded."""

from __future__ import annotations

import io

import pytest

from app.store.spend_db import failure, redacted, scrubbed
from app.tenancy import spend

URL = "postgresql://spend:p%40ss-9f2@127.0.0.1:1/llmgate"


def test_a_url_shows_no_password_in_either_form() -> None:
    assert redacted(URL) == "postgresql://spend:***@127.0.0.1:1/llmgate"
    keyword = "postgresql://127.0.0.1/llmgate?user=spend&password=hunter2&sslmode=require"
    assert (
        redacted(keyword)
        == "postgresql://127.0.0.1/llmgate?user=spend&password=***&sslmode=require"
    )


@pytest.mark.parametrize(
    "message",
    [
        f'missing "=" after "{URL}" in connection info string',  # the URL quoted
        'password authentication failed: "p@ss-9f2"',  # the password, decoded
        "bad password p%40ss-9f2",  # the password as the URL spells it
    ],
)
def test_a_drivers_message_loses_the_password_wherever_it_quotes_it(message: str) -> None:
    for text in (scrubbed(message, URL), failure(RuntimeError(message), URL)):
        assert "p@ss-9f2" not in text and "p%40ss-9f2" not in text
        assert "***" in text


def test_the_cli_says_an_unreachable_ledger_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert spend.main(["--url", URL, "report", "--period", "2026-01"], out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert err.startswith("spend: ") and err.count("\n") == 1
    assert "9f2" not in err and "127.0.0.1:1" in err
