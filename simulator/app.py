"""Routing: one parsed request in, one response written, keep-alive decided.

Order of work for an API route: find its dialect (dialects.py: OpenAI, Anthropic Messages or
Gemini), log and count the request, check the key as that dialect carries it, parse the JSON
body, resolve the behaviour, build the reply (validation errors win over faults), decide
whether the fault fires (``fail_times``/``fail_key``), then hand timing to ``playback``. Every
error is written in the request's dialect. The /sim/* control routes and /healthz bypass the
key, the log and the counters, so polling them never disturbs what a test measures.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs

from . import anthropic, dialects, endpoints, prompt_cache, provider_endpoints, text
from .behaviour import ERROR_FAULTS, Behaviour, BehaviourError, resolve
from .dialects import ANTHROPIC, GEMINI, Route
from .faults import fault_error
from .http11 import Request
from .playback import play_full, play_stream
from .prompt_cache import Prompt, PromptCache, Use
from .responses import ApiError, dumps, model_list
from .stats import Stats, group_of
from .wire import Peer, base_headers, send_full

Builder = Callable[[dict[str, Any], Behaviour, endpoints.NewId, int], endpoints.Reply]
Build = Callable[[Behaviour], endpoints.Reply]
# A prompt token read from the simulated prompt cache costs this share of an uncached one's
# prefill time: almost nothing (docs/simulator.md).
CACHED_SHARE = 0.02
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
    route: Route = field(init=False)

    def __post_init__(self) -> None:
        self.route = dialects.classify(self.request.path)

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
        self.cache = PromptCache()  # every account's prompt cache (prompt_cache.py)

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
        route = ex.route
        self.stats.record(req.method, path, req.query, headers, parsed, req.body, route=route)
        ex.api_headers = dialects.headers(
            route.dialect, ex.request_id, self.stats.requests, self.stats.tokens
        )
        try:
            dialects.authorise(req, route.dialect, self.config.require_key)
            if route.dialect == ANTHROPIC:
                return self._anthropic(ex, body)
            if route.dialect == GEMINI:
                return self._gemini(ex, body)
            return self._route(ex, body)
        except ApiError as err:
            return self.send_error(ex, err)

    def send_error(self, ex: Exchange, err: ApiError) -> bool:
        status, body = dialects.render_error(ex.route.dialect, err, ex.request_id)
        send_full(ex.peer, status, dumps(body), [*ex.headers(), *err.headers])
        return ex.request.keep_alive

    def _anthropic(self, ex: Exchange, body: Any) -> bool:
        req, name = ex.request, ex.route.name
        if req.method != "POST" or name == dialects.OTHER:
            raise ApiError(404, f"Not found: {req.method} {req.path}")
        if req.header("anthropic-version") is None:
            raise ApiError(400, "anthropic-version: header is required")
        body = _require_body(body)
        if name == dialects.COUNT_TOKENS:
            return self._answer(ex, body, provider_endpoints.count_tokens(body))
        behaviour = self._behaviour(ex, body.get("model"))
        messages = body.get("messages")
        return self._generated(
            ex,
            lambda b: provider_endpoints.messages(body, b, new_id),
            behaviour,
            lambda: prompt_cache.anthropic(
                body.get("system"), messages if isinstance(messages, list) else []
            ),
        )

    def _gemini(self, ex: Exchange, body: Any) -> bool:
        req, route = ex.request, ex.route
        if req.method != "POST" or route.model is None:
            raise ApiError(404, f"Method not found: {req.method} {req.path}")
        stream = route.method == "streamGenerateContent"
        if stream and parse_qs(req.query).get("alt") != ["sse"]:
            raise ApiError(400, "the simulator streams Gemini answers as SSE only: add ?alt=sse")
        body = _require_body(body)
        behaviour = self._behaviour(ex, route.model)
        model, contents = route.model, body.get("contents")
        return self._generated(
            ex,
            lambda b: provider_endpoints.generate(body, model, stream, b, new_id),
            behaviour,
            lambda: prompt_cache.automatic(
                text.gemini_prompt(
                    body.get("systemInstruction"), contents if isinstance(contents, list) else []
                )
            ),
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

    def _behaviour(self, ex: Exchange, model: Any) -> Behaviour:
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
        behaviour = self._behaviour(ex, body.get("model") if body is not None else None)
        if not think:
            behaviour = replace(behaviour, ttft_ms=0.0)
        return self._play_full(ex, payload, behaviour, self._fault(behaviour))

    def _play_full(
        self, ex: Exchange, payload: dict[str, Any], behaviour: Behaviour, fault: str | None
    ) -> bool:
        if fault == "error-after":
            raise fault_error("500", behaviour)  # a whole answer cannot fail part-way
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
        behaviour = self._behaviour(ex, body.get("model"))
        builder, now, path = _GENERATORS[ex.request.path], int(time.time()), ex.request.path
        return self._generated(
            ex,
            lambda b: builder(body, b, new_id, now),
            behaviour,
            lambda: prompt_cache.automatic(_openai_prompt(path, body)),
        )

    def _generated(
        self, ex: Exchange, build: Build, behaviour: Behaviour, prompt: Callable[[], Prompt]
    ) -> bool:
        """A generated answer: built (a request's own errors come first), its fault decided,
        then, when its prompt costs prefill time or meets the prompt cache, built again with
        what the cache did (``_prefilled``)."""
        reply = build(behaviour)
        self.stats.tokens += reply.tokens  # the prompt's and the answer's, whatever follows
        fault = self._fault(behaviour)
        b = behaviour
        if b.script is None and b.cached_tokens is None and (b.prompt_cache or b.prefill_us):
            behaviour = self._prefilled(ex, behaviour, prompt())
            reply = build(behaviour)
        return self._play_reply(ex, reply, behaviour, fault)

    def _prefilled(self, ex: Exchange, behaviour: Behaviour, prompt: Prompt) -> Behaviour:
        """``behaviour`` once the prompt was read: what the account's prompt cache did with it
        (when the control is on; else every word is computed), counted, and the prefill time
        of the words computed added to the time to first token."""
        if behaviour.prompt_cache:
            group = group_of(dialects.credential(ex.request))
            use = self.cache.use(
                group, prompt, time.monotonic(), behaviour.cache_min_tokens, behaviour.cache_ttl_s
            )
            self.stats.cache_used(group, use)
            behaviour = replace(
                behaviour,
                cached_tokens=use.read,
                cache_written=use.written,
                cache_written_1h=use.written_1h,
            )
        else:
            use = Use(0, 0, 0, len(prompt.words))
        prefill_ms = (use.computed + use.read * CACHED_SHARE) * behaviour.prefill_us / 1000
        return replace(behaviour, ttft_ms=behaviour.ttft_ms + prefill_ms)

    def _play_reply(
        self, ex: Exchange, reply: endpoints.Reply, behaviour: Behaviour, fault: str | None
    ) -> bool:
        req = ex.request
        if reply.framer is None:
            return self._play_full(ex, reply.body, behaviour, fault)
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
            ping=anthropic.PING if ex.route.dialect == ANTHROPIC else None,
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
            raise fault_error(fault, behaviour)
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
            self.cache.clear()
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


def _openai_prompt(path: str, body: dict[str, Any]) -> str:
    """The prompt an OpenAI route's answer is generated from (endpoints.py's own reading)."""
    if path == "/v1/completions":
        return text.completion_prompt(body.get("prompt", ""))
    if path == "/v1/responses":
        parts = (text.responses_prompt(body.get(k)) for k in ("instructions", "input"))
        return "\n".join(part for part in parts if part)
    messages = body.get("messages")
    return text.chat_prompt(messages if isinstance(messages, list) else [])


def _parse_json(raw: bytes) -> Any:
    if not raw:
        return _NO_BODY
    try:
        return json.loads(raw)
    except ValueError:
        return _NO_BODY
