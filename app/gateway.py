"""Orchestration of one API call: validate → upstream exchange → reply (JSON or live stream).

Knows nothing of Flask: the web layer hands in a ``Call`` and gets back a ``Reply`` whose body
is bytes or an iterator of bytes. Headers wait for the upstream's status where they can: a
stream waits up to one heartbeat interval for the upstream's headers before committing a 200,
so a failure in that window is a real HTTP error; after it, a failure is one SSE error event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import gevent

from app.cache import keys
from app.cache import policy as cache_policy
from app.cache.coalesce import Flights, lease_wait_producer, replay_producer
from app.cache.entry import Entry
from app.cache.policy import BYPASS, COALESCED, STATUS_HEADER, Directive
from app.cache.replay import reply_from_entry
from app.cache.store import AnswerCache, entry_from_flight
from app.core.config import Settings
from app.core.errors import GatewayError, ModelNotAllowed, wrap_upstream_body
from app.observe import tracing
from app.observe.metrics import Metrics
from app.observe.tracing import Tracer
from app.request import jsonedit, schema
from app.request.call import CLIENT_CLOSED, SSE_HEADERS, Call, Reply, Trace
from app.request.events import END_OF_STREAM
from app.request.headers import downstream_headers, upstream_request_headers, without_credentials
from app.request.metering import with_output_cap, with_usage_requested, without_usage_chunk
from app.streams.drain import Lifecycle
from app.streams.flight import ClientGone, Flight, Head, Listener, Producer
from app.streams.log_memory import LogBudget
from app.streams.relay import DisconnectWatcher, relay, upstream_producer
from app.tenancy.access import Access, Grant
from app.tenancy.keyring import GatewayKey
from app.tenancy.prices import PriceTable
from app.upstream import spans
from app.upstream.exchange import Upstream, UpstreamRequest
from app.upstream.retry import Deadline

# Routes whose streams end with a usage chunk when asked (stream_options.include_usage).
USAGE_ROUTES = frozenset({"chat", "completions"})
# Routes whose body we parse and check; everything else under /v1 is forwarded as is.
VALIDATED_ROUTES = frozenset({"chat", "completions", "embeddings", "responses"})
UPSTREAM_HEADER = "X-LLMGate-Upstream"


@dataclass(frozen=True)
class Caller:
    """Who is calling, as ``Gateway.identify`` found: its gateway key, or None when keys are
    off (callers pass through with credentials of their own)."""

    key: GatewayKey | None


class Gateway:
    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        answers: AnswerCache | None = None,
        metrics: Metrics | None = None,
        access: Access | None = None,
        tracer: Tracer | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.answers = answers
        self.metrics = metrics
        self.access = access  # gateway keys and their limits; None: callers pass through
        self.tracer = tracer  # None: tracing is off (LLMGATE_OTEL_ENDPOINT unset)
        self.prices = prices  # the config file's price table: each call's cost (edge/finish.py)
        self.flights = Flights()
        self.lifecycle = Lifecycle()
        # What this worker's kept event logs may hold together (app/streams/log_memory.py).
        observe = None if metrics is None else metrics.observe_log_memory
        self.log_budget = LogBudget(settings.log_memory_bytes, observe)

    def identify(self, call: Call) -> Caller:
        """Who is calling: with gateway keys, its key, or InvalidApiKey (401) for a missing,
        unknown, revoked or expired one. From the headers alone, so the web layer asks
        before it reads the body: a stranger's body is neither read nor looked at."""
        if self.tracer is not None:
            self._start_span(call)
        key = self.access.authenticate(call.headers) if self.access is not None else None
        if key is not None:
            call.trace.key = key.name
        return Caller(key)

    def handle(self, call: Call, caller: Caller | None = None) -> Reply:
        """The call's reply. ``caller``: what ``identify`` said of this call before its body
        was read; None to ask now."""
        body: dict[str, Any] | None = None
        stream = False
        forward = call.body
        gateway_key = (caller if caller is not None else self.identify(call)).key
        if call.route in VALIDATED_ROUTES:
            body = schema.parse_body(
                call.body,
                max_depth=self.settings.max_json_depth,
                max_array_items=self.settings.max_json_array_items,
                max_containers=self.settings.max_json_containers,
            )
            schema.validate(call.route, body)
            self.upstream.check_serves(_model(body))
            stream = schema.wants_stream(body)
            call.trace.model = str(body["model"])[:100] if "model" in body else None
            call.trace.stream = stream
            if call.trace.span is not None:
                call.trace.span.rename(
                    tracing.request_name(call.route, call.method, call.path, _model(body))
                )
                call.trace.span.set(tracing.body_attributes(body, stream))
            if "cache" in body:
                # Our control object, not the provider's: it never goes upstream.
                forward = _without_cache(call.body, body)
        # Admission control (app/core/admission.py): a slot, and a stream slot for a stream, or a
        # 429 now; routes.py gives them back when the response body is closed. Before the
        # key's grant: a call this worker cannot take costs its caller nothing.
        call.admission.admit(stream)
        grant = None
        if gateway_key is not None:
            forward, grant = self._grant(call, gateway_key, body, stream, forward)
        headers = upstream_request_headers(call.headers, stream=stream)
        req = UpstreamRequest(
            method=call.method,
            path=call.path.removeprefix("/v1"),
            query=call.query,
            # The upstream's own key (or the operator's fallback) is added per upstream; with
            # gateway keys the caller's credentials never leave (its key is ours, not theirs).
            headers=headers if grant is None else without_credentials(headers),
            body=forward if forward or call.method not in ("GET", "HEAD") else None,
            stream=stream,
            model=_model(body),
            upstreams=None if grant is None else grant.key.upstreams,
            route=call.route,
            span=call.trace.span,
        )
        deadline = Deadline.start(self.settings.deadline_s)
        compute = upstream_producer(
            self.upstream,
            req,
            deadline,
            max_body=self.settings.max_body_bytes,
            max_event_bytes=self.settings.max_event_bytes,
            route=call.route,
        )
        plan = self._plan(call, body, None if grant is None else grant.key.tenant)
        if plan is None:
            # Nobody else will read this answer: no log beyond what the caller has yet to read.
            alone = self._flight(compute, keep_log=False, request_id=call.trace.request_id)
            return _with_status(self.answer(call, alone.join(), stream), BYPASS)
        key, directive = plan
        assert body is not None
        if directive.lookup and self.answers is not None:
            looked = time.monotonic()
            found = self.answers.lookup(key, directive)
            call.trace.cache_s += time.monotonic() - looked
            if call.trace.span is not None:
                tracing.cache_lookup(call.trace.span, looked, found[1] if found else None)
            if found is not None:
                entry, level = found
                reply = self._replay(call, body, entry, f"HIT; level={level}")
                if reply is not None:
                    if self._due_for_refresh(entry):
                        self._refresh_in_background(key, directive, compute, deadline, stream)
                    return reply
        flight = self.flights.get(key)
        if flight is not None:
            if call.trace.span is not None and flight.span is not None:
                tracing.follow(call.trace.span, flight.span)
            return self._follow(call, body, flight, COALESCED, compute)
        flight = self._start_flight(
            key,
            directive,
            compute,
            deadline,
            stream,
            request_id=call.trace.request_id,
            route=call.route,
            include_usage=schema.wants_usage(body),
        )
        assert flight is not None  # only a background refresh gives up
        flight.span = call.trace.span  # followers link to it
        status = COALESCED if flight.source == "lease" else directive.status_on_miss
        return self._follow(call, body, flight, status, compute)

    def _start_span(self, call: Call) -> None:
        """The request's span (app/observe/tracing.py), from when the call arrived;
        app/edge/finish.py ends it when the last byte has left."""
        assert self.tracer is not None
        call.trace.span = self.tracer.request(
            tracing.request_name(call.route, call.method, call.path),
            call.headers,
            start=call.trace.started,
            attributes=tracing.request_attributes(
                call.route, call.method, call.path, call.trace.request_id
            ),
        )

    def _grant(
        self, call: Call, key: GatewayKey, body: dict[str, Any] | None, stream: bool, forward: bytes
    ) -> tuple[bytes, Grant]:
        """Take the call's share of its key's limits (app/tenancy/access.py); the body to
        forward."""
        assert self.access is not None
        model = _model(body)
        if model is not None and not self.upstream.serves_for(model, key.upstreams):
            raise ModelNotAllowed(
                f"No upstream the key {key.name!r} may use serves the model {model!r}.",
                param="model",
            )
        grant = self.access.admit(
            key, model, body, stream=stream, route=call.route, size=len(forward)
        )
        access, trace = self.access, call.trace
        trace.limit_headers = grant.headers
        trace.settle = lambda usage, billed, served: access.settle(
            grant, usage, billed, served=served
        )
        if grant.output_cap is not None and body is not None:
            # The key's max_tokens holds for a call that names none: it is sent one.
            forward = with_output_cap(forward, body, call.route, grant.output_cap)
        if stream and body is not None and call.route in USAGE_ROUTES:
            # The key's tokens are counted from the stream's usage chunk: asked for here,
            # and taken out again for a caller who did not ask (Gateway._stream).
            forward = with_usage_requested(forward, body)
            trace.hide_usage = not schema.wants_usage(body)
        return forward, grant

    def _plan(
        self, call: Call, body: dict[str, Any] | None, tenant: str | None = None
    ) -> tuple[str, Directive] | None:
        """The cache key and the caller's directive, or None when this call is not cached.
        ``tenant``: the gateway key's, when keys are on (else the caller's credentials)."""
        if body is None or self.answers is None:
            return None
        if not cache_policy.is_cacheable(call.route, body, self.settings.cache_mode):
            return None
        directive = cache_policy.parse_cache_control(
            v for k, v in call.headers if k.lower() == "cache-control"
        )
        directive = cache_policy.apply_body_controls(directive, body.get("cache"))
        directive = cache_policy.check_namespace(directive, self.settings.allowed_namespaces)
        if tenant is None or directive.namespace is not None:
            tenant = keys.tenant_of(call.headers, namespace=directive.namespace)
        key = keys.cache_key(
            upstream=self.upstream.route_id(_model(body)),
            route=call.route,
            tenant=tenant,
            body=body,
            query=call.query,
        )
        return key, directive

    def _due_for_refresh(self, entry: Entry) -> bool:
        return cache_policy.refresh_early(
            now=time.time(),
            expires=entry.created + entry.ttl,
            compute_s=entry.compute_s,
            beta=self.settings.cache_early_refresh_beta,
        )

    def _refresh_in_background(
        self, key: str, directive: Directive, compute: Producer, deadline: Deadline, stream: bool
    ) -> None:
        """Renew a hot entry before it expires, once per key across processes; nobody waits."""
        if self.flights.get(key) is not None:
            return
        flight = self._start_flight(key, directive, compute, deadline, stream, background=True)
        if flight is None:
            return  # another process holds the lease: it is refreshing already
        listener = flight.join()  # keeps the flight alive until it is complete

        def hold() -> None:
            try:
                listener.wait_complete()
            except (ClientGone, GatewayError):
                pass
            finally:
                listener.leave()

        gevent.spawn(hold)

    def _start_flight(
        self,
        key: str,
        directive: Directive,
        compute: Producer,
        deadline: Deadline,
        stream: bool,
        *,
        background: bool = False,
        request_id: str = "",
        route: str = "",
        include_usage: bool = False,
    ) -> Flight | None:
        """Lead the computation of ``key``: this worker's only flight for it, and across
        processes the lease holder (or a waiter for the holder's entry; a background
        refresh does not wait and returns None instead).

        An answer that will not be stored keeps no log and is shared with nobody: a
        ``no-store`` one, and a stream starting while the worker's log memory budget is full.
        It is the caller's own call, with no lease for other processes to wait on."""
        assert self.answers is not None
        if not directive.store or (stream and not self.log_budget.admit()):
            if background:
                return None
            alone = self._flight(compute, keep_log=False, request_id=request_id)
            alone.stream = stream
            return alone
        producer, lease_held, waiting = compute, False, False
        if self.answers.shared and self.settings.cache_lease_s > 0:
            if stream and not self.settings.cache_lease_streams and not background:
                pass  # first-token latency matters more than cost for these streams
            else:
                lease = self.answers.try_lease(key)
                if lease:
                    lease_held = True
                    # The previous holder stores its entry, then releases its lease: both
                    # may have landed since this caller's lookup missed. One more look.
                    looked = directive.lookup and not background
                    found = self.answers.lookup(key, directive) if looked else None
                    if found is not None:
                        waiting = True
                        producer = replay_producer(
                            found[0], compute, route=route, include_usage=include_usage
                        )
                elif lease is None:
                    pass  # no lease to be had (Memcached trouble): compute, do not wait
                elif background:
                    return None
                else:
                    waiting = True
                    producer = lease_wait_producer(
                        self.answers,
                        key,
                        deadline,
                        compute,
                        route=route,
                        include_usage=include_usage,
                    )

        def done(flight: Flight) -> None:
            self.flights.remove(key, flight)
            try:
                if directive.store and flight.source == "upstream":
                    self.answers.store(key, flight, directive)  # type: ignore[union-attr]
            finally:
                if flight.lease_held:
                    self.answers.release_lease(key)  # type: ignore[union-attr]

        # The log serves the cache entry and followers, up to the size an entry may have.
        flight = self._flight(
            producer,
            on_done=done,
            log_limit=self.settings.cache_max_entry_bytes,
            log_budget=self.log_budget,
            request_id=request_id,
        )
        flight.stream, flight.lease_held = stream, lease_held
        flight.source = "lease" if waiting else "upstream"
        self.flights.put(key, flight)
        return flight

    def _flight(self, producer: Producer, **kw: Any) -> Flight:
        """A flight with this gateway's per-stream memory bounds for slow callers."""
        flight = Flight(
            producer,
            buffer_limit=self.settings.stream_buffer_bytes,
            send_timeout=self.settings.send_timeout_s,
            **kw,
        )
        return self.lifecycle.track(flight)

    def _follow(
        self, call: Call, body: dict[str, Any], flight: Flight, status: str, compute: Producer
    ) -> Reply:
        """Answer from a flight: live when the shapes match, else once it is complete."""
        stream = schema.wants_stream(body)
        listener = flight.join()
        if flight.stream == stream:
            return _with_status(self.answer(call, listener, stream), status)
        watcher = self._watch(call, listener)
        try:
            listener.wait_complete()
        except ClientGone:
            return Reply(CLIENT_CLOSED, [], b"")
        finally:
            watcher.stop()
            listener.leave()
        head = flight.head
        assert head is not None
        entry = entry_from_flight(flight, now=time.time())
        reply = None if entry is None else self._replay(call, body, entry, status, age=False)
        if reply is None and (head.body is None or (stream and 200 <= head.status < 300)):
            # A stream too large to keep whole, or an answer with no conversion to this
            # caller's shape (a Responses object to typed events): its own upstream call.
            own = self._flight(compute, keep_log=False, request_id=call.trace.request_id)
            return _with_status(self.answer(call, own.join(), stream), BYPASS)
        # Not convertible (an error answer, say): the flight's answer as it is.
        return reply or _with_status(self._complete_reply(head), status)

    def _replay(
        self, call: Call, body: dict[str, Any], entry: Entry, status: str, *, age: bool = True
    ) -> Reply | None:
        return reply_from_entry(
            entry,
            route=call.route,
            stream=schema.wants_stream(body),
            include_usage=schema.wants_usage(body),
            status=status,
            age=int(entry.age(time.time())) if age else None,
        )

    def answer(self, call: Call, listener: Listener, stream: bool) -> Reply:
        """The caller's reply from a flight: a complete response, or a live stream."""
        watcher = self._watch(call, listener)
        try:
            head = self._await_first_byte(listener, stream)
        except ClientGone:
            watcher.stop()
            listener.leave()
            return Reply(CLIENT_CLOSED, [], b"")
        except BaseException:
            watcher.stop()
            listener.leave()
            raise
        flight = listener.flight
        if head is not None:
            call.trace.attempts = head.attempts
            call.trace.upstream = head.upstream or None
            if call.trace.span is not None:
                spans.answered_by(call.trace.span, self.upstream.specs, head.upstream)
        if flight.head_at is not None and flight.source == "upstream":
            call.trace.upstream_ttfb_s = flight.head_at - flight.started
        if head is None:
            # The upstream is slow to answer a stream: commit the 200 now, a ping with it,
            # and keep the line alive with pings; whatever the upstream says later travels
            # as SSE.
            body = self._stream(call.route, call.trace, listener, watcher, ping_first=True)
            return Reply(200, list(SSE_HEADERS), body)
        if head.body is None:
            headers = [
                (k, v)
                for k, v in downstream_headers(head.headers)
                if k.lower() not in ("content-type", "cache-control")
            ]
            headers += _upstream_header(head)
            return Reply(
                head.status,
                list(SSE_HEADERS) + headers,
                self._stream(call.route, call.trace, listener, watcher),
            )
        watcher.stop()
        listener.leave()
        return self._complete_reply(head)

    @staticmethod
    def _watch(call: Call, listener: Listener) -> DisconnectWatcher:
        # What lives as long as the stream takes the call's trace, not the call: the call
        # holds the caller's whole request body.
        trace = call.trace

        def gone() -> None:  # in the hub's loop: marks and wakes, never blocks
            trace.client_closed = True
            listener.lost()

        return DisconnectWatcher(call.client_socket, gone)

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
        return Reply(head.status, headers + _upstream_header(head), body)

    def _stream(
        self,
        route: str,
        trace: Trace,
        listener: Listener,
        watcher: DisconnectWatcher,
        *,
        ping_first: bool = False,
    ) -> Iterator[list[bytes]]:
        """The stream's body: the route and trace of its call, not the call (_watch)."""
        try:
            chunks = relay(
                listener,
                heartbeat=self.settings.heartbeat_s,
                # A stream cut before its route's end is reported as broken (app/request/events.py).
                end=END_OF_STREAM.get(route),
                on_error=partial(setattr, trace, "stream_error"),
                ping_first=ping_first,
            )
            if trace.hide_usage:
                chunks = without_usage_chunk(chunks, partial(setattr, trace, "usage"))
            yield from chunks
        finally:
            # Normal end, error, or the WSGI server closing us because the caller left.
            watcher.stop()
            listener.leave()


def _model(body: dict[str, Any] | None) -> str | None:
    """The requested model, whole (the trace keeps a shortened copy for logs)."""
    model = None if body is None else body.get("model")
    return model if isinstance(model, str) else None


def _without_cache(raw: bytes, body: dict[str, Any]) -> bytes:
    """The caller's bytes with only the ``cache`` member cut out (app/request/jsonedit.py): the
    provider's prompt cache keys on the exact prompt bytes, so nothing else may move."""
    try:
        return jsonedit.without_member(raw, "cache")
    except ValueError:
        # JSON that is not UTF-8 (json.loads also reads UTF-16 and UTF-32): re-encoded.
        return json.dumps({k: v for k, v in body.items() if k != "cache"}).encode()


def _upstream_header(head: Head) -> list[tuple[str, str]]:
    """Which upstream answered, by its configured name (never its URL or key)."""
    return [(UPSTREAM_HEADER, head.upstream)] if head.upstream else []


def _with_status(reply: Reply, status: str) -> Reply:
    if reply.status != CLIENT_CLOSED:
        reply.headers.append((STATUS_HEADER, status))
    return reply


def error_reply(exc: GatewayError) -> Reply:
    return Reply(exc.status, list(exc.response_headers().items()), exc.to_json())
