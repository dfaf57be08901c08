"""The least a gateway of llmgate's shape does: `python -m bench.floor` serves this with gunicorn.

A Flask app that forwards a chat call with its headers to the upstream (the simulator)
through one urllib3 PoolManager per worker and relays the answer as it arrives: a stream
piece by piece, as read, and any other answer whole. Nothing else: no validation of the
request, no cache (with the gateway's cache on, answers kept by the request's bytes in a
dict: the floor of a cache hit), no metrics or log line, no timeouts beyond urllib3's, no
retries, no heartbeats, no error shapes. What it costs per call is the floor under the
gateway's own cost in this shape (nginx → gunicorn with gevent workers → Flask → urllib3);
it is a measuring stick, never something to deploy.

It makes the gateway's choices inside the shape, so the ratio of the two stays honest: a
POST to /v1/chat/completions takes the same kind of lane as the gateway's API calls
(app/edge/lane.py), answered from the WSGI environ around Flask's per-request machinery, its
headers read from the environ as the gateway reads them (app/request/headers.py), and the
upstream's headers are parsed as the gateway parses them (app/patches/http_headers.py).
``LLMGATE_FLOOR_LANE=0`` sends the call through Flask's view instead, and
``LLMGATE_FLOOR_HEADERS=email`` leaves http.client's own header parser in place: `python -m
bench.floor.layers` measures what each choice saves a call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import urllib3
from flask import Flask, Response, request
from werkzeug.http import HTTP_STATUS_CODES

from app.patches import http_headers
from app.request.headers import environ_headers

app = Flask(__name__)
_UPSTREAM = os.environ["LLMGATE_UPSTREAM_URL"].rstrip("/")
_POOL = urllib3.PoolManager(maxsize=1000, block=False, retries=False)
# Not passed on, either way: hop-by-hop headers and those urllib3 writes itself.
_HOP = {"connection", "transfer-encoding", "keep-alive", "content-length", "host"}
# With the gateway's cache on (bench/cpu/ab.py's hit kinds), answers are kept in the worker by
# the request's bytes and given again: the floor of a cache hit (the gateway's L1 is also
# a dict in the worker). A stream is kept as the pieces it arrived in, replayed as they were.
_KEEP = os.environ.get("LLMGATE_CACHE_MODE", "deterministic") != "off"  # the gateway's default
_KEPT: dict[bytes, tuple[int, list[tuple[str, str]], list[bytes]]] = {}
Answer = tuple[int, list[tuple[str, str]], Iterable[bytes]]


@app.get("/healthz")
def healthz() -> str:
    return "ok"


@app.post("/v1/chat/completions")
def chat() -> Response:
    status, headers, pieces = relay(request.get_data(), request.headers.items())
    return Response(pieces, status, headers)


def relay(body: bytes, asked: Iterable[tuple[str, str]]) -> Answer:
    """The call's answer: status, headers and the pieces to send."""
    kept = _KEPT.get(body) if _KEEP else None
    if kept is not None:
        status, headers, pieces = kept
        return status, headers, iter(pieces) if len(pieces) > 1 else pieces
    upstream = _POOL.request(
        "POST",
        _UPSTREAM + "/chat/completions",
        body=body,
        # The caller's headers, as the gateway forwards them: the simulator's controls
        # (x-sim-ttft-ms, x-sim-tps) among them, so both relay the same answer.
        headers={k: v for k, v in asked if k.lower() not in _HOP},
        preload_content=False,
    )
    headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP]
    status = upstream.status
    keep = _KEEP and status == 200
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return status, headers, _pieces(upstream, body if keep else None, headers)
    answer = upstream.read()
    upstream.release_conn()
    headers.append(("Content-Length", str(len(answer))))
    if keep:
        _KEPT[body] = (status, headers, [answer])
    return status, headers, [answer]


def _pieces(
    upstream: urllib3.BaseHTTPResponse, key: bytes | None, headers: list[tuple[str, str]]
) -> Iterator[bytes]:
    pieces = []
    try:
        while piece := upstream.read1(65536):
            if key is not None:
                pieces.append(piece)
            yield piece
        if key is not None:  # kept once whole, never in part
            _KEPT[key] = (200, headers, pieces)
    finally:
        upstream.release_conn()


def _lane(flask_app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if (
            environ.get("PATH_INFO") != "/v1/chat/completions"
            or environ["REQUEST_METHOD"] != "POST"
        ):
            return flask_app(environ, start_response)
        body = environ["wsgi.input"].read()
        status, headers, pieces = relay(body, environ_headers(environ))
        start_response(f"{status} {HTTP_STATUS_CODES.get(status, 'unknown').upper()}", headers)
        return pieces

    return wsgi_app


if os.environ.get("LLMGATE_FLOOR_HEADERS", "") != "email":
    http_headers.install()
if os.environ.get("LLMGATE_FLOOR_LANE", "1") != "0":
    app.wsgi_app = _lane(app.wsgi_app)  # type: ignore[method-assign]
