"""The upstream answer's headers parsed without the email package, to the same message.

http.client (beneath urllib3) parses the headers of every response with ``email.parser``: a
FeedParser, a policy and a regular expression per line, about 40 µs for a provider's dozen
headers — on every call, the floor's as much as the gateway's (docs/performance.md, "The
upstream's headers"). ``parse_headers`` builds the same ``HTTPMessage`` directly when every
line is a plain ``Name: value`` — what providers send — and hands anything else (a folded
line, a line without a colon, a name the email parser would not take, a bare CR, a Unix
"From " line) to the standard parser, so the message is always the one http.client would
have made: the same headers in the same order, the same empty payload, no defects.
``install`` makes it http.client's, once per worker (the app factory; the floor app too).
"""

from __future__ import annotations

import email.parser
import http.client
import re
from typing import Any

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


def install() -> None:
    """Make ``parse_headers`` http.client's (HTTPResponse.begin looks it up at each call);
    on a Python whose http.client reads headers otherwise, keep its own."""
    if hasattr(http.client, "_read_headers"):
        http.client.parse_headers = parse_headers  # type: ignore[assignment]
