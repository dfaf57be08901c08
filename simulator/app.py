"""Routing: one parsed request in, one response written, keep-alive decided.

Order of work for an OpenAI route: log the request, check the key, parse the JSON body,
resolve the behaviour, build the reply (validation errors win over faults), decide whether
the fault fires (``fail_times``/``fail_key``), then hand timing to ``playback``. The /sim/*
control routes and /healthz bypass the key, the log and the counters, so polling them never
disturbs what a test measures.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from . import endpoints
from .behaviour import ERROR_FAULTS, Behaviour, BehaviourError, resolve
from .http11 import Request
from .playback import play_full, play_stream
from .responses import ApiError, api_headers, dumps, model_list
from .stats import Stats
from .wire import Peer, base_headers, send_full

Builder = Callable[[dict[str, Any], Behaviour, endpoints.NewId, int], endpoints.Reply]
_GENERATORS: dict[str, Builder] = {
    "/v1/chat/completions": endpoints.chat,
    "/v1/completions": endpoints.completions,
    "/v1/responses": endpoints.responses,
}
_NO_BODY = object()
_MODEL_PREFIX = "/v1/models/"


@dataclass(frozen=True)
class Config:
    """Process-wide settings from the command line; per-request controls start from these."""

    defaults: Behaviour = field(default_factory=Behaviour)
    require_key: str | None = None


@dataclass
class Exchange:
    """One request on one connection: what answering it needs to know."""

    request: Request
    peer: Peer
    served_on_connection: int
    request_id: str = field(default_factory=lambda: new_id("req_"))
    started: float = field(default_factory=time.monotonic)
    api_headers: list[tuple[str, str]] = field(default_factory=list)  # version, rate limits

    def headers(self, close: bool = False) -> list[tuple[str, str]]:
        close = close or not self.request.keep_alive
        headers = base_headers(self.request_id, close)
        if not close and self.request.version == "HTTP/1.0":
            headers.append(("connection", "keep-alive"))  # 1.0 closes unless told otherwise
        return headers + self.api_headers


def is_control(path: str) -> bool:
    """Control routes: no API key, no request log, no counters."""
    return path == "/healthz" or path.startswith("/sim/")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class App:
    def __init__(self, config: Config, stats: Stats) -> None:
        self.config = config
        self.stats = stats

    def handle(self, ex: Exchange) -> bool:
        """Answer one request; True when the connection may serve another."""
        path = ex.request.path
        if is_control(path):
            return self._control(ex)
        body = _parse_json(ex.request.body)
        req = ex.request
        headers: dict[str, str] = {}
        for name, value in req.headers:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        parsed = None if body is _NO_BODY else body
        self.stats.record(req.method, path, req.query, headers, parsed, req.body)
        ex.api_headers = api_headers(self.stats.requests, self.stats.tokens)
        try:
            self._authorise(req)
            return self._route(ex, body)
        except ApiError as err:
            return self.send_error(ex, err)

    def send_error(self, ex: Exchange, err: ApiError) -> bool:
        send_full(ex.peer, err.status, dumps(err.to_body()), [*ex.headers(), *err.headers])
        return ex.request.keep_alive

    def _authorise(self, req: Request) -> None:
        key = self.config.require_key
        if key is not None and req.header("authorization") != f"Bearer {key}":
            raise ApiError(
                401,
                "Incorrect API key provided (simulator --require-key).",
                code="invalid_api_key",
            )

    def _route(self, ex: Exchange, body: Any) -> bool:
        method, path = ex.request.method, ex.request.path
        if method == "GET" and path == "/v1/models":
            return self._answer(ex, None, model_list())
        if method == "GET" and path.startswith(_MODEL_PREFIX) and len(path) > len(_MODEL_PREFIX):
            return self._answer(ex, None, endpoints.model_by_id(path[len(_MODEL_PREFIX) :]))
        if method == "POST" and path == "/v1/embeddings":
            body = _require_body(body)
            return self._answer(ex, body, endpoints.embeddings(body), think=True)
        if method == "POST" and path in _GENERATORS:
            return self._generate(ex, _require_body(body))
        raise ApiError(404, f"Invalid URL ({method} {path})", code="unknown_url")

    def _behaviour(self, ex: Exchange, body: dict[str, Any] | None) -> Behaviour:
        model = body.get("model") if body is not None else None
        if not isinstance(model, str):
            model = None  # a missing or malformed model is the endpoint's error to report
        try:
            return resolve(ex.request.headers, model, self.config.defaults)
        except BehaviourError as err:
            raise ApiError(400, str(err), param=err.param) from None

    def _answer(
        self,
        ex: Exchange,
        body: dict[str, Any] | None,
        payload: dict[str, Any],
        *,
        think: bool = False,
    ) -> bool:
        """A JSON reply under the request's behaviour; ``think`` applies ttft_ms to it."""
        behaviour = self._behaviour(ex, body)
        if not think:
            behaviour = replace(behaviour, ttft_ms=0.0)
        return self._play_full(ex, payload, behaviour)

    def _play_full(self, ex: Exchange, payload: dict[str, Any], behaviour: Behaviour) -> bool:
        fault = self._fault(behaviour)
        if fault == "error-after":
            raise _fault_error("500", behaviour)  # a whole answer cannot fail part-way
        headers = ex.headers(close=fault == "close-delimited")
        kept = play_full(
            ex.peer,
            200,
            dumps(payload),
            behaviour,
            fault,
            headers,
            stats=self.stats,
            started=ex.started,
        )
        return kept and ex.request.keep_alive

    def _generate(self, ex: Exchange, body: dict[str, Any]) -> bool:
        req = ex.request
        behaviour = self._behaviour(ex, body)
        reply = _GENERATORS[req.path](body, behaviour, new_id, int(time.time()))
        self.stats.tokens += reply.completion.prompt_tokens + len(reply.completion.tokens)
        if reply.framer is None:
            return self._play_full(ex, reply.body, behaviour)
        fault = self._fault(behaviour)
        chunked = req.version == "HTTP/1.1"  # RFC 9112 section 7.1: 1.0 has no chunked coding
        headers = ex.headers(close=fault == "close-delimited" or not chunked)
        kept = play_stream(
            ex.peer,
            reply.framer,
            behaviour,
            fault,
            headers,
            chunked=chunked,
            stats=self.stats,
            started=ex.started,
        )
        return kept and req.keep_alive

    def _fault(self, behaviour: Behaviour) -> str | None:
        """The fault that fires for this request; an error fault raises its ApiError."""
        fault = behaviour.fault
        if fault is None:
            return None
        if behaviour.fail_times is not None and not self.stats.take_failure(
            behaviour.fail_key, behaviour.fail_times
        ):
            return None
        self.stats.faults_injected += 1
        if fault in ERROR_FAULTS:
            raise _fault_error(fault, behaviour)
        return fault

    def _json(self, ex: Exchange, value: Any) -> bool:
        send_full(ex.peer, 200, dumps(value), ex.headers())
        return ex.request.keep_alive

    def _control(self, ex: Exchange) -> bool:
        method, path = ex.request.method, ex.request.path
        if path == "/healthz":
            return self._json(ex, {"ok": True})
        if method == "GET" and path == "/sim/stats":
            return self._json(ex, self.stats.snapshot())
        if method == "POST" and path == "/sim/reset":
            self.stats.reset()
            return self._json(ex, {"ok": True})
        if method == "GET" and path == "/sim/requests":
            return self._json(ex, self.stats.requests_log())
        if method == "GET" and path == "/sim/connection":
            info = {
                "tcp_nodelay": ex.peer.nodelay(),
                "requests_on_connection": ex.served_on_connection,
            }
            return self._json(ex, info)
        err = ApiError(404, f"Invalid URL ({method} {path})", code="unknown_url")
        return self.send_error(ex, err)


def _require_body(body: Any) -> dict[str, Any]:
    if body is _NO_BODY:
        raise ApiError(400, "We could not parse the JSON body of your request.")
    return endpoints.require_object(body)


def _parse_json(raw: bytes) -> Any:
    if not raw:
        return _NO_BODY
    try:
        return json.loads(raw)
    except ValueError:
        return _NO_BODY


def _fault_error(fault: str, b: Behaviour) -> ApiError:
    retry = (
        # delta-seconds is an integer (RFC 9110 10.2.3); the -ms header keeps the precision.
        ("retry-after", str(math.ceil(b.retry_after))),
        ("retry-after-ms", str(round(b.retry_after * 1000))),
    )
    if fault == "429":
        return ApiError(
            429,
            "Rate limit reached (simulated). Please try again later.",
            "requests",
            code="rate_limit_exceeded",
            headers=retry,
        )
    if fault == "503":
        message = "The server is overloaded (simulated). Please try again later."
        return ApiError(503, message, "server_error", headers=retry)
    if fault == "401":
        return ApiError(401, "Incorrect API key provided (simulated).", code="invalid_api_key")
    if fault == "redirect":
        moved = (("location", "http://elsewhere.invalid/v1/chat/completions"),)
        return ApiError(307, "Moved (simulated).", code="moved", headers=moved)
    return ApiError(
        500, "The server had an error processing your request (simulated).", "server_error"
    )
