"""Patch: http.client's ``parse_headers``, for the upstream answer's headers parsed without
the email package, to the same message.

http.client (beneath urllib3) parses the headers of every response with ``email.parser``: a
FeedParser, a policy and a regular expression per line, about 40 µs for a provider's dozen
headers — on every call, the floor's as much as the gateway's (bench/HISTORY.md, "The
upstream's headers"). ``parse_headers`` builds the same ``HTTPMessage`` directly when every
line is a plain ``Name: value`` — what providers send — and hands anything else (a folded
line, a line without a colon, a name the email parser would not take, a bare CR, a Unix
"From " line) to the standard parser, so the message is always the one http.client would
have made: the same headers in the same order, the same empty payload, no defects.
``install`` makes it http.client's, once per worker (the app factory; the floor app too),
when ``fits``: http.client reads header lines with ``_read_headers`` and ``HTTPMessage``
keeps them in a ``_headers`` list, as compat32 stores them (CPython 3.11 to 3.13).
"""

from __future__ import annotations

import email.parser
import http.client
import re
from typing import Any

from app.patches import refuse

# What email's FeedParser takes for a header line's name: printable ASCII but the colon.
_NAME = re.compile(r"[\041-\071\073-\176]+")
_END = (b"\r\n", b"\n", b"")


def parse_headers(fp: Any, _class: type = http.client.HTTPMessage) -> http.client.HTTPMessage:
    """Read the header lines from ``fp`` (as http.client does: its line and count limits)
    and parse them into ``_class``."""
    lines = http.client._read_headers(fp)  # type: ignore[attr-defined]
    return parse_lines(lines, _class)


def parse_lines(lines: list[bytes], _class: type = http.client.HTTPMessage) -> Any:
    """The message of ``lines`` (each with its line end, the blank line last)."""
    message = _class()
    fields = message._headers
    for raw in lines:
        if raw in _END:
            break
        line = raw.decode("iso-8859-1")
        text = line[:-2] if line.endswith("\r\n") else line.rstrip("\n")
        name, colon, value = text.partition(":")
        if not colon or "\r" in text or "\n" in text or not _NAME.fullmatch(name):
            return _standard(lines, _class)  # includes a leading space or tab: a folded line
        # As email's compat32 policy stores a header: its name as sent, the value without
        # the spaces after the colon (and without trailing line-end characters).
        fields.append((name, value.lstrip(" \t").rstrip("\r\n")))
    message.set_payload("")
    return message


def _standard(lines: list[bytes], _class: type) -> Any:
    """http.client's own parse of the same lines."""
    text = b"".join(lines).decode("iso-8859-1")
    return email.parser.Parser(_class=_class).parsestr(text)


# A sample of what the fast path parses: the message it makes must be the standard one.
_SAMPLE = [b"Content-Type: text/plain\r\n", b"x-a:  b c \r\n", b"x-e:\r\n", b"\r\n"]


def fits() -> str | None:
    """None when http.client's internals are those ``parse_headers`` relies on."""
    if not callable(getattr(http.client, "_read_headers", None)):
        return "http.client has no _read_headers"
    if not isinstance(getattr(http.client.HTTPMessage(), "_headers", None), list):
        return "http.client.HTTPMessage keeps no _headers list"
    ours, theirs = parse_lines(_SAMPLE), _standard(_SAMPLE, http.client.HTTPMessage)
    if ours._headers != theirs._headers or ours.get_payload() != theirs.get_payload():
        return "the email parser stores header lines otherwise"
    return None


def install() -> None:
    """Make ``parse_headers`` http.client's (HTTPResponse.begin looks it up at each call)
    when it fits; else keep http.client's own, said once."""
    reason = fits()
    if reason is None:
        http.client.parse_headers = parse_headers  # type: ignore[assignment]
    else:
        refuse("http_headers", reason)
