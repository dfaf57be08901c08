"""The least a gateway of llmgate's shape does: `python -m bench.floor` serves this with gunicorn.

A Flask app that forwards a chat call with its headers to the upstream (the simulator)
through one urllib3 PoolManager per worker and relays the answer as it arrives: a stream
piece by piece, as read, and any other answer whole. Nothing else: no validation of the
request, no cache, no metrics or log line, no timeouts beyond urllib3's, no retries, no
heartbeats, no error shapes. What it costs per call is the floor under the gateway's own
cost in this shape (nginx → gunicorn with gevent workers → Flask → urllib3); it is a
measuring stick, never something to deploy.
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


@app.get("/healthz")
def healthz() -> str:
    return "ok"


@app.post("/v1/chat/completions")
def chat() -> Response:
    upstream = _POOL.request(
        "POST",
        _UPSTREAM + "/chat/completions",
        body=request.get_data(),
        # The caller's headers, as the gateway forwards them: the simulator's controls
        # (x-sim-ttft-ms, x-sim-tps) among them, so both relay the same answer.
        headers={k: v for k, v in request.headers.items() if k.lower() not in _HOP},
        preload_content=False,
    )
    headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP]
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return Response(_pieces(upstream), upstream.status, headers)
    body = upstream.read()
    upstream.release_conn()
    return Response(body, upstream.status, headers)


def _pieces(upstream: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    try:
        while piece := upstream.read1(65536):
            yield piece
    finally:
        upstream.release_conn()
