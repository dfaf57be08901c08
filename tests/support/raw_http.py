"""Requests written byte for byte on a socket of their own, and the error they must get back.

urllib3 refuses to send a duplicated header, a broken request line or a body that does not
match its length, which is what a hostile or broken caller sends; these go out as written,
and every refusal, whoever makes it (nginx, gunicorn, the app), must be OpenAI-shaped JSON.
"""

from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import urlsplit


def send_raw(url: str, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request written as is; the answer as (status, headers, body)."""
    status, headers, answer = send_raw_headers(url, head, body)
    return status, {k.lower(): v for k, v in headers}, answer


def send_raw_headers(
    url: str, head: bytes, body: bytes = b""
) -> tuple[int, list[tuple[str, str]], bytes]:
    """As send_raw, with every header line of the answer as it came (repeats included)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head + body)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, resp.getheaders(), resp.read()


def request_head(
    method: str, target: str, headers: list[tuple[str, str]], *, body: bytes = b""
) -> bytes:
    """A request head on one connection (closed after it), Content-Length from ``body``."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def assert_json_error(
    answer: tuple[int, dict[str, str], bytes], status: int | tuple[int, ...], code: str | None
) -> dict:
    """The OpenAI error object of ``answer``, asserted: JSON, never HTML, with ``status`` (or
    one of them), the four members, and ``code`` unless it is None."""
    got, headers, body = answer
    is_html = b"<html" in body.lower()
    assert not is_html, body[:300]
    assert got in (status if isinstance(status, tuple) else (status,)), (got, body[:300])
    assert headers["content-type"].startswith("application/json"), (headers, body[:300])
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code, error
    return error
