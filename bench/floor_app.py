"""The least a gateway of llmgate's shape does: `python -m bench.floor` serves this with gunicorn.

A Flask app that forwards a chat call with its headers to the upstream (the simulator)
through one urllib3 PoolManager per worker and relays the answer as it arrives: a stream
piece by piece, as read, and any other answer whole. Nothing else: no validation of the
request, no cache (with the gateway's cache on, answers kept by the request's bytes in a
dict: the floor of a cache hit), no metrics or log line, no timeouts beyond urllib3's, no
retries, no heartbeats, no error shapes. What it costs per call is the floor under the
gateway's own cost in this shape (nginx → gunicorn with gevent workers → Flask → urllib3);
it is a measuring stick, never something to deploy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import urllib3
from flask import Flask, Response, request

app = Flask(__name__)
_UPSTREAM = os.environ["LLMGATE_UPSTREAM_URL"].rstrip("/")
_POOL = urllib3.PoolManager(maxsize=1000, block=False, retries=False)
# Not passed on, either way: hop-by-hop headers and those urllib3 writes itself.
_HOP = {"connection", "transfer-encoding", "keep-alive", "content-length", "host"}
# With the gateway's cache on (bench/ab.py's hit kinds), answers are kept in the worker by
# the request's bytes and given again: the floor of a cache hit (the gateway's L1 is also
# a dict in the worker). A stream is kept as the pieces it arrived in, replayed as they were.
_KEEP = os.environ.get("LLMGATE_CACHE_MODE", "deterministic") != "off"  # the gateway's default
_KEPT: dict[bytes, tuple[int, list[tuple[str, str]], list[bytes]]] = {}


@app.get("/healthz")
def healthz() -> str:
    return "ok"


@app.post("/v1/chat/completions")
def chat() -> Response:
    body = request.get_data()
    kept = _KEPT.get(body) if _KEEP else None
    if kept is not None:
        status, headers, pieces = kept
        return Response(iter(pieces) if len(pieces) > 1 else pieces, status, headers)
    upstream = _POOL.request(
        "POST",
        _UPSTREAM + "/chat/completions",
        body=body,
        # The caller's headers, as the gateway forwards them: the simulator's controls
        # (x-sim-ttft-ms, x-sim-tps) among them, so both relay the same answer.
        headers={k: v for k, v in request.headers.items() if k.lower() not in _HOP},
        preload_content=False,
    )
    headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP]
    status = upstream.status
    keep = _KEEP and status == 200
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return Response(_pieces(upstream, body if keep else None, headers), status, headers)
    answer = upstream.read()
    upstream.release_conn()
    if keep:
        _KEPT[body] = (status, headers, [answer])
    return Response(answer, status, headers)


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
