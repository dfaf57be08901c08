"""app/patches/http_headers.py builds the very message http.client's own parser builds, for
any header lines: plain ones on its own path, anything else through the standard parser."""

from __future__ import annotations

import email.parser
import http.client
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.patches import http_headers as header_parse
from app.patches.http_headers import parse_headers, parse_lines


def _standard(lines: list[bytes]) -> http.client.HTTPMessage:
    text = b"".join(lines).decode("iso-8859-1")
    return email.parser.Parser(_class=http.client.HTTPMessage).parsestr(text)


def _same(a: http.client.HTTPMessage, b: http.client.HTTPMessage) -> None:
    assert type(a) is type(b)
    assert a._headers == b._headers  # type: ignore[attr-defined]
    assert a.get_payload() == b.get_payload()
    assert [type(d) for d in a.defects] == [type(d) for d in b.defects]
    assert a.get_unixfrom() == b.get_unixfrom()
    assert (a.preamble, a.epilogue, a.policy) == (b.preamble, b.epilogue, b.policy)
    assert a.items() == b.items() and a.get("content-type") == b.get("content-type")


PROVIDER = [
    b"date: Wed, 02 Dec 2026 01:00:00 GMT\r\n",
    b"content-type: application/json\r\n",
    b"Content-Length: 512\r\n",
    b"openai-processing-ms: 40\r\n",
    b"x-request-id: req_abc\r\n",
    b"x-empty:\r\n",
    b"X-Spaced:   value with  spaces  \r\n",
    b"set-cookie: a=1; Path=/\r\n",
    b"set-cookie: b=2\r\n",
    b"x-latin: caf\xe9\r\n",
    b"\r\n",
]


def test_a_providers_headers_are_parsed_on_the_fast_path_to_the_same_message(monkeypatch) -> None:
    monkeypatch.setattr(header_parse, "_standard", lambda *a: (_ for _ in ()).throw(AssertionError))
    _same(parse_lines(PROVIDER), _standard(PROVIDER))
    _same(parse_lines([b"a: b\n", b"\n"]), _standard([b"a: b\n", b"\n"]))  # bare LF ends


# Lines mixing what email's parser treats specially: folds, missing colons, spaces in
# names, bare CRs, "From " lines, empty names, non-ASCII, early EOF.
PIECES = st.sampled_from(
    ["a", "Name", "x-y", ":", " ", "\t", "\r", "From ", "é", "v", ";", "=", "\x7f", "\x00"]
)
LINE = st.lists(PIECES, max_size=8).map("".join)
ENDING = st.sampled_from(["\r\n", "\n"])


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(LINE, ENDING), max_size=8), st.sampled_from(["\r\n", "\n", ""]))
def test_any_lines_give_the_standard_parsers_message(lines, last) -> None:
    raw = [(text + end).encode("iso-8859-1") for text, end in lines if text + end not in END]
    raw.append(last.encode())
    _same(parse_lines(raw), _standard(raw))


END = {"\r\n", "\n"}

TRICKY = [
    [b"a: x\ry\r\n", b"\r\n"],  # a bare CR: the email parser ends the headers there
    [b"a: x\r\r\n", b"\r\n"],
    [b"a: x\r\n", b" folded\r\n", b"\r\n"],
    [b"a: x\r\n", b"\tfolded\r\n", b"\r\n"],
    [b"no colon\r\n", b"a: b\r\n", b"\r\n"],
    [b": empty name\r\n", b"\r\n"],
    [b"bad name: x\r\n", b"\r\n"],
    [b"From someone\r\n", b"a: b\r\n", b"\r\n"],
    [b"a: b\r\n", b""],  # the connection closed before the blank line
    [b"a: b", b""],
]


@pytest.mark.parametrize("lines", TRICKY)
def test_what_the_email_parser_treats_apart_gives_its_message(lines) -> None:
    _same(parse_lines(lines), _standard(lines))


def test_installed_http_client_reads_a_response_with_it(monkeypatch) -> None:
    monkeypatch.setattr(http.client, "parse_headers", http.client.parse_headers)
    header_parse.install()
    assert http.client.parse_headers is parse_headers
    answer = b"HTTP/1.1 200 OK\r\n" + b"".join(PROVIDER) + b"x" * 512

    class Sock:
        def makefile(self, mode: str) -> io.BytesIO:
            return io.BytesIO(answer)

    resp = http.client.HTTPResponse(Sock())  # type: ignore[arg-type]
    resp.begin()
    assert resp.status == 200 and resp.getheader("X-Spaced") == "value with  spaces  "
    assert resp.msg.get_all("set-cookie") == ["a=1; Path=/", "b=2"]
    assert resp.read() == b"x" * 512


def test_the_line_and_count_limits_stay_http_clients() -> None:
    with pytest.raises(http.client.LineTooLong):
        parse_headers(io.BytesIO(b"a: " + b"x" * 70000 + b"\r\n\r\n"))
    with pytest.raises(http.client.HTTPException):
        parse_headers(io.BytesIO(b"a: b\r\n" * 101 + b"\r\n"))
