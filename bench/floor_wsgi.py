"""bench/floor_app.py's relay without Flask: the same calls, as a bare WSGI callable.

What it saves against bench/floor_app.py, measured in turns by `python -m bench.floor_layers`,
is what Flask's per-request machinery (its request context, routing, the Request and Response
objects) costs a call of the floor: issue 25 asks what each layer costs before any is cut. A
measuring stick like the floor app, never something to deploy; no cache (the hit kinds are
the floor app's).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import urllib3

_UPSTREAM = os.environ["LLMGATE_UPSTREAM_URL"].rstrip("/")
_POOL = urllib3.PoolManager(maxsize=1000, block=False, retries=False)
_HOP = {"connection", "transfer-encoding", "keep-alive", "content-length", "host"}
StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    if path == "/healthz":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]
    if path != "/v1/chat/completions" or environ["REQUEST_METHOD"] != "POST":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    # The caller's headers as the floor app forwards them (the simulator's controls too).
    headers = {
        key[5:].replace("_", "-").lower(): value
        for key, value in environ.items()
        if key.startswith("HTTP_") and key[5:].replace("_", "-").lower() not in _HOP
    }
    headers["content-type"] = environ.get("CONTENT_TYPE", "application/json")
    upstream = _POOL.request("POST", _UPSTREAM + "/chat/completions", body=body,
                             headers=headers, preload_content=False)  # fmt: skip
    out = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP]
    start_response(f"{upstream.status} {upstream.reason or ''}".strip(), out)
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return _pieces(upstream)
    answer = upstream.read()
    upstream.release_conn()
    return [answer]


def _pieces(upstream: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    try:
        while piece := upstream.read1(65536):
            yield piece
    finally:
        upstream.release_conn()
