"""Orchestration of one API call: validate → upstream exchange → reply (JSON or live stream).

Knows nothing of Flask: the web layer hands in a ``Call`` and gets back a ``Reply`` whose body
is bytes or an iterator of bytes. Headers wait for the upstream's status where they can: a
stream waits up to one heartbeat interval for the upstream's headers before committing a 200,
so a failure in that window is a real HTTP error; after it, a failure is one SSE error event.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

from app import schema
from app.config import Settings
from app.errors import GatewayError, wrap_upstream_body
from app.headers import downstream_headers, upstream_request_headers
from app.policy import Deadline
from app.relay import (
    ClientGone,
    DisconnectWatcher,
    Flight,
    Head,
    Listener,
    relay,
    upstream_producer,
)
from app.upstream import Upstream, UpstreamRequest

# Routes whose body we parse and check; everything else under /v1 is forwarded as is.
VALIDATED_ROUTES = frozenset({"chat", "completions", "embeddings", "responses"})
# Routes whose streams end with `data: [DONE]`; one that does not is reported as broken.
DONE_ROUTES = frozenset({"chat", "completions"})

SSE_HEADERS = (
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)
CLIENT_CLOSED = 499  # nginx's code for "client closed request"; never reaches anyone


@dataclass(frozen=True)
class Call:
    route: str
    method: str
    path: str  # as received, e.g. "/v1/chat/completions"
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    client_socket: socket.socket | None = None


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes | Iterator[bytes]


class Gateway:
    def __init__(self, settings: Settings, upstream: Upstream) -> None:
        self.settings = settings
        self.upstream = upstream

    def handle(self, call: Call) -> Reply:
        stream = False
        if call.route in VALIDATED_ROUTES:
            body = schema.parse_body(call.body)
            schema.validate(call.route, body)
            stream = schema.wants_stream(body)
        req = UpstreamRequest(
            method=call.method,
            path=call.path.removeprefix("/v1"),
            query=call.query,
            headers=upstream_request_headers(
                call.headers, stream=stream, fallback_api_key=self.settings.upstream_api_key
            ),
            body=call.body if call.body or call.method not in ("GET", "HEAD") else None,
            stream=stream,
        )
        deadline = Deadline.start(self.settings.deadline_s)
        flight = Flight(
            upstream_producer(self.upstream, req, deadline, max_body=self.settings.max_body_bytes)
        )
        return self.answer(call, flight.join(), stream)

    def answer(self, call: Call, listener: Listener, stream: bool) -> Reply:
        """The caller's reply from a flight: a complete response, or a live stream."""
        watcher = DisconnectWatcher(call.client_socket, listener.leave)
        try:
            head = self._await_first_byte(listener, stream)
        except ClientGone:
            watcher.stop()
            return Reply(CLIENT_CLOSED, [], b"")
        except BaseException:
            watcher.stop()
            listener.leave()
            raise
        if head is None:
            # The upstream is slow to answer a stream: commit the 200 now and keep the line
            # alive with pings; whatever the upstream says later travels as SSE.
            return Reply(200, list(SSE_HEADERS), self._stream(call, listener, watcher))
        if head.body is None:
            headers = [
                (k, v)
                for k, v in downstream_headers(head.headers)
                if k.lower() not in ("content-type", "cache-control")
            ]
            return Reply(
                head.status, list(SSE_HEADERS) + headers, self._stream(call, listener, watcher)
            )
        watcher.stop()
        listener.leave()
        return self._complete_reply(head)

    def _await_first_byte(self, listener: Listener, stream: bool) -> Head | None:
        """The upstream's head once its first event (or whole body) is in; None when a
        stream should be committed before that, to send heartbeats.

        Waiting for the first event, not just the headers, lets a stream that fails before
        producing anything still answer with a proper HTTP error status.
        """
        heartbeat = self.settings.heartbeat_s
        window = None if not stream or heartbeat <= 0 else Deadline.start(heartbeat)
        head = listener.wait_head(window.remaining() if window else None)
        if head is None:
            return None
        if head.body is None and not listener.wait_first_event(
            window.remaining() if window else None
        ):
            return None
        return head

    def _complete_reply(self, head: Head) -> Reply:
        assert head.body is not None
        headers = downstream_headers(head.headers)
        body = head.body
        if head.status >= 400:
            wrapped = wrap_upstream_body(head.status, body)
            if wrapped is not body:
                headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
                headers.append(("Content-Type", "application/json"))
            body = wrapped
            if head.attempts > 1:
                # We already retried: the SDK must not multiply the calls again.
                headers.append(("x-should-retry", "false"))
        return Reply(head.status, headers, body)

    def _stream(
        self, call: Call, listener: Listener, watcher: DisconnectWatcher
    ) -> Iterator[bytes]:
        try:
            yield from relay(
                listener,
                heartbeat=self.settings.heartbeat_s,
                expect_done=call.route in DONE_ROUTES,
            )
        finally:
            # Normal end, error, or the WSGI server closing us because the caller left.
            watcher.stop()
            listener.leave()


def error_reply(exc: GatewayError) -> Reply:
    return Reply(exc.status, list(exc.response_headers().items()), exc.to_json())
