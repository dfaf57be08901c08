"""The sync client: one object per process, shared by every thread.

A ``Client`` holds immutable settings and one ``Transport`` (the connection pool); each call
builds its own ``Deadline`` and never mutates the client, so any number of threads may share
it. Per-call overrides (``timeout=``) are new values, never edits of the client's.

A call runs: wait for a pooled connection, send, wait for the status; on a retryable
outcome sleep per ``RetryPolicy`` and try again, all inside the deadline. A stream is handed to
the caller as soon as its status is 200 and is never retried after that; it asks to be
resumable, and one the gateway made so reconnects after a drop (llmgate_client/resume.py).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

from .batch import Outcome, Progress, iter_map
from .config import parse_base_url, resolve_api_key, resolve_base_url
from .errors import (
    APIConnectionError,
    APIResponseError,
    APIStatusError,
    APITimeoutError,
    DeadlineExceeded,
    LLMGateError,
    from_response,
)
from .policy import Deadline, ResumePolicy, RetryPolicy, Timeout
from .result import Result
from .resume import ASK_HEADER, reconnector_for
from .stream import ChatStream
from .transport import AttemptTimeouts, Response, Transport

USER_AGENT = "llmgate-client/0.1"
DEFAULT_TIMEOUT = Timeout()
Messages = str | list[dict[str, Any]]


class Client:
    """A thread-safe client for an llmgate (or any OpenAI-compatible) server.

    ``timeout`` is a ``Timeout`` or a number of seconds for the total deadline; ``retries``
    is a count or a ``RetryPolicy``; ``pool_size`` is the most connections this client opens
    (size it like the thread pool that shares it). ``base_url`` and ``api_key`` default to
    ``LLMGATE_BASE_URL``/``LLMGATE_API_KEY``, then ``OPENAI_BASE_URL``/``OPENAI_API_KEY``.
    ``resume`` (``True``, ``False`` or a ``ResumePolicy``) makes ``chat_stream`` ask for
    resumable streams and reconnect after a drop.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | Timeout | None = DEFAULT_TIMEOUT,
        retries: int | RetryPolicy = 2,
        pool_size: int = 10,
        model: str | None = None,
        headers: Mapping[str, str] | None = None,
        ca_certs: str | None = None,
        environ: Mapping[str, str] | None = None,
        resume: bool | ResumePolicy = True,
    ) -> None:
        env = os.environ if environ is None else environ
        self.endpoint = parse_base_url(resolve_base_url(base_url, env))
        self.base_url = self.endpoint.base_url
        self.timeout = Timeout.from_value(timeout)
        self.retry = RetryPolicy.from_value(retries)
        self.pool_size = pool_size
        self.model = model
        self.resume = ResumePolicy.from_value(resume)
        self._headers = {"user-agent": USER_AGENT, "accept-encoding": "identity"}
        key = resolve_api_key(api_key, env)
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        self._headers.update({k.lower(): v for k, v in (headers or {}).items()})
        self._transport = Transport(self.endpoint.origin, pool_size=pool_size, ca_certs=ca_certs)
        self._rand: Callable[[], float] = random.random
        self._sleep: Callable[[float], None] = time.sleep

    # -- API ----------------------------------------------------------------------------

    def chat(
        self,
        messages: Messages | None = None,
        *,
        model: str | None = None,
        timeout: float | Timeout | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Result:
        """POST /chat/completions and return the parsed completion."""
        if params.get("stream"):
            raise ValueError("use chat_stream() for streaming")
        body = self._chat_body(messages, model, params)
        return self._json_call("POST", "chat/completions", body, timeout, extra_headers)

    def chat_stream(
        self,
        messages: Messages | None = None,
        *,
        model: str | None = None,
        timeout: float | Timeout | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatStream:
        """POST /chat/completions with ``stream: true``; returns once the stream has begun.

        Errors before the first byte (statuses, connect failures) raise here, after retries;
        errors after it raise from the iteration, without retry: a resumable stream that
        drops reconnects instead, within the same deadline.
        """
        body = self._chat_body(messages, model, params)
        body["stream"] = True
        spec = self._timeout(timeout)
        deadline = Deadline.after(spec.total, time.monotonic())
        asks = {ASK_HEADER: "true"} if self.resume else {}
        headers = {**asks, **(extra_headers or {})}
        response, attempts = self._send(
            "POST", "chat/completions", body, spec, deadline, headers, stream=True
        )
        error = response.not_an_event_stream(attempts)
        if error is not None:
            raise error
        # How it resumes, when resuming is on and the gateway made it resumable.
        headers = self._request_headers(False, True, extra_headers)  # the call's credentials
        resume = reconnector_for(response, self._transport, self.endpoint.url("streams"),
                                 headers, self.resume, spec, self._sleep, self._rand)  # fmt: skip
        return ChatStream(
            response, deadline=deadline, idle_timeout=spec.read, attempts=attempts, resume=resume
        )

    def embeddings(
        self,
        input: str | list[Any],
        *,
        model: str | None = None,
        timeout: float | Timeout | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Result:
        """POST /embeddings; ``result["data"][i]["embedding"]`` holds the vectors."""
        body: dict[str, Any] = {"input": input, **params}
        if model or self.model:
            body["model"] = model or self.model
        return self._json_call("POST", "embeddings", body, timeout, extra_headers)

    def models(self, *, timeout: float | Timeout | None = None) -> list[dict[str, Any]]:
        """GET /models and return its ``data`` list."""
        result = self._json_call("GET", "models", None, timeout, None)
        data = result.get("data")
        return list(data) if isinstance(data, list) else []

    def map(
        self,
        requests: Iterable[Mapping[str, Any] | Exception],
        *,
        max_workers: int | None = None,
        deadline: float | None = None,
        progress: Progress | None = None,
    ) -> list[Outcome[Result]]:
        """Run many chat request bodies concurrently; see ``imap``. Returns them all."""
        return list(
            self.imap(requests, max_workers=max_workers, deadline=deadline, progress=progress)
        )

    def imap(
        self,
        requests: Iterable[Mapping[str, Any] | Exception],
        *,
        max_workers: int | None = None,
        deadline: float | None = None,
        progress: Progress | None = None,
    ) -> Iterator[Outcome[Result]]:
        """Yield one ``Outcome`` per request body, in input order, as soon as it is known.

        An exception given in place of a body becomes that item's error (so a reader can
        report a bad input line in its place without breaking the order).

        At most ``max_workers`` (default: ``pool_size``) calls run at once; each call's error
        is captured in its outcome. ``deadline`` (seconds) bounds the batch: no call starts
        after it, calls in flight are cut at it, requests never started fail with
        ``DeadlineExceeded`` (``attempts == 0``).
        """
        return iter_map(
            self._chat_item,
            requests,
            max_workers=max_workers or self.pool_size,
            deadline=deadline,
            progress=progress,
        )

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r}, pool_size={self.pool_size}, timeout={self.timeout})"

    # -- calls --------------------------------------------------------------------------

    def _chat_body(
        self, messages: Messages | None, model: str | None, params: dict[str, Any]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if model or self.model:
            body["model"] = model or self.model
        if messages is not None:
            body["messages"] = (
                [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
            )
        body.update(params)
        return body

    def _chat_item(
        self, request: Mapping[str, Any] | Exception, batch_deadline: Deadline
    ) -> Result:
        if isinstance(request, Exception):
            raise request  # an input reader's verdict on a bad item, reported in its place
        if not isinstance(request, Mapping):
            raise TypeError(f"a request must be a JSON object, got {type(request).__name__}")
        body = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
        if "model" not in body and self.model:
            body["model"] = self.model
        return self._json_call("POST", "chat/completions", body, None, None, batch_deadline)

    def _timeout(self, override: float | Timeout | None) -> Timeout:
        return self.timeout if override is None else Timeout.from_value(override)

    def _json_call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout: float | Timeout | None,
        extra_headers: Mapping[str, str] | None,
        outer: Deadline | None = None,
    ) -> Result:
        spec = self._timeout(timeout)
        started = time.monotonic()
        deadline = Deadline.after(spec.total, started)
        if outer is not None:
            deadline = deadline.earliest(outer)
        response, attempts = self._send(method, path, body, spec, deadline, extra_headers)
        raw = self._read_body(response, spec, deadline, attempts)
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise APIResponseError(
                f"response body is not JSON: {raw[:100]!r}",
                status=response.status,
                request_id=response.headers.get("x-request-id"),
                attempts=attempts,
            ) from exc
        if not isinstance(payload, dict):
            payload = {"data": payload}
        return Result(
            payload,
            headers=response.headers,
            attempts=attempts,
            elapsed=time.monotonic() - started,
        )

    def _read_body(
        self, response: Response, spec: Timeout, deadline: Deadline, attempts: int
    ) -> bytes:
        try:
            return response.read_all(deadline, spec.read)
        except LLMGateError as exc:
            exc.request_id, exc.attempts = response.headers.get("x-request-id"), attempts
            raise

    # -- the retry loop -----------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        spec: Timeout,
        deadline: Deadline,
        extra_headers: Mapping[str, str] | None,
        *,
        stream: bool = False,
    ) -> tuple[Response, int]:
        """Send until a 2xx status (returned, body unread) or a final error (raised)."""
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = self._request_headers(data is not None, stream, extra_headers)
        url = self.endpoint.url(path)
        last: LLMGateError | None = None
        attempt = 0
        while True:
            attempt += 1
            outcome = self._attempt(method, url, data, headers, spec, deadline, attempt, last)
            if isinstance(outcome, Response):
                return outcome, attempt
            self._pause_or_raise(outcome, attempt, deadline)
            last = outcome

    def _attempt(
        self,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        spec: Timeout,
        deadline: Deadline,
        attempt: int,
        last: LLMGateError | None,
    ) -> Response | LLMGateError:
        """One attempt: a 2xx response, a retry candidate error, or a final error raised."""
        now = time.monotonic()
        if deadline.expired(now):
            if last is not None:
                # The backoff fitted when it began and overslept (a busy machine): the
                # deadline prevented this retry, it cut nothing off, so the caller gets
                # the last attempt's error, as when the backoff would not fit at all.
                raise last
            raise DeadlineExceeded("the total deadline expired before the call", attempts=0)
        left = deadline.remaining(now)
        timeouts = AttemptTimeouts(
            pool=None if left is None else max(left, 0.001),
            connect=deadline.cap(spec.connect, now),
            read=deadline.cap(spec.read, now),
        )
        try:
            response = self._transport.request(
                method, url, body=data, headers=headers, timeouts=timeouts
            )
        except APIConnectionError as exc:
            exc.attempts = attempt
            if isinstance(exc, APITimeoutError) and deadline.expired(time.monotonic()):
                raise DeadlineExceeded(
                    f"the total deadline expired during attempt {attempt}: {exc.message}",
                    last_error=last,
                    request_sent=exc.request_sent,
                    attempts=attempt,
                ) from exc
            if exc.request_sent:
                raise  # the server may be working on it: a retry could double-bill
            return exc
        if 200 <= response.status < 300:
            return response
        return self._error_from(response, spec, deadline, attempt)

    def _pause_or_raise(self, error: LLMGateError, attempt: int, deadline: Deadline) -> None:
        """Sleep before the next attempt, or raise ``error`` when the policy or the time left
        forbids one (a wait that would end past the deadline is not started)."""
        delay = self.retry.delay(
            attempt=attempt,
            status=error.status if isinstance(error, APIStatusError) else None,
            headers=error.headers if isinstance(error, APIStatusError) else {},
            rand=self._rand(),
            now_epoch=time.time(),
        )
        left = deadline.remaining(time.monotonic())
        if delay is None or (left is not None and delay >= left):
            raise error
        self._sleep(delay)

    def _error_from(
        self, response: Response, spec: Timeout, deadline: Deadline, attempt: int
    ) -> LLMGateError:
        try:
            raw = response.read_all(deadline, spec.read)
        except LLMGateError:
            raw = b""  # the status alone still says what happened
        return from_response(response.status, raw, response.headers, attempts=attempt)

    def _request_headers(
        self, has_body: bool, stream: bool, extra: Mapping[str, str] | None
    ) -> dict[str, str]:
        headers = dict(self._headers)
        headers["accept"] = "text/event-stream" if stream else "application/json"
        if has_body:
            headers["content-type"] = "application/json"
        headers.update({k.lower(): v for k, v in (extra or {}).items()})
        return headers
