"""The request path a call may be forwarded with: confined to /v1. No I/O here.

gunicorn percent-decodes the path before the app sees it, and urllib3 resolves dot segments
(RFC 3986 5.2.4) in the URL the gateway builds from it: ``/v1/../admin``, ``/v1/%2e%2e/admin``
and ``/v1/models/..%2F..%2Fadmin`` all reached the upstream as ``/admin``, outside the
configured base path. A decoded ``?`` or ``#`` (``%3F``, ``%23``) turned part of the path into a
query or cut it off. nginx does not help: ``proxy_pass`` without a URI passes the caller's
request target on unchanged.

So a path is checked after decoding, segment by segment, and every segment is encoded again
before it leaves: no ``.`` or ``..`` segment, no empty segment (``//``) but a trailing slash,
no control character or backslash; the rest goes upstream as data, never as syntax.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from app.core.errors import BadRequest

PREFIX = "/v1"
# RFC 3986 3.3: pchar = unreserved / pct-encoded / sub-delims / ":" / "@". Anything else
# (a decoded "?", "#", "%", space, non-ASCII) is encoded again.
_SAFE = "!$&'()*+,;=:@-._~"
# The usual path: /v1 and segments of those characters only, none of them "." or "..", no
# empty one but a trailing slash. Nothing in it to refuse or to encode: it leaves as it came.
_PLAIN = re.compile(r"/v1(?:/(?!\.\.?(?:/|\Z))[A-Za-z0-9!$&'()*+,;=:@._~-]+)*/?")


def forwarded_path(path: str) -> str:
    """``path`` (decoded, as the WSGI server gives it) as it may be sent upstream, or
    BadRequest (``invalid_path``) when it could leave /v1 or smuggle syntax."""
    if _PLAIN.fullmatch(path):
        return path
    return _checked(path)


def _checked(path: str) -> str:
    """``forwarded_path`` segment by segment, for any path."""
    if path != PREFIX and not path.startswith(PREFIX + "/"):
        raise _invalid(path, "it is not under /v1")
    segments = path[len(PREFIX) :].split("/")[1:]
    for index, segment in enumerate(segments):
        if segment in (".", ".."):
            raise _invalid(path, "it has a '.' or '..' segment")
        if segment == "" and index != len(segments) - 1:
            raise _invalid(path, "it has an empty segment ('//')")
        if "\\" in segment or any(ord(c) < 0x20 or ord(c) == 0x7F for c in segment):
            raise _invalid(path, "it has a control character or a backslash")
    return PREFIX + "".join("/" + quote(s, safe=_SAFE) for s in segments)


def _invalid(path: str, why: str) -> BadRequest:
    shown = path.encode("unicode_escape").decode("ascii")[:200]
    return BadRequest(f"Invalid request path {shown!r}: {why}.", code="invalid_path")
