"""The orchestrator: one API call, from its plan to its reply (JSON or a live stream).

Knows nothing of Flask: the web layer (app/edge/routes.py) hands in a ``Call`` and gets back
a ``Reply`` whose body is bytes or an iterator of bytes. ``Gateway.handle`` makes the call's
``Plan`` once — who is calling, what it asks, where it goes, whether and how it is cached —
and then tries the stages in turn, the first with an answer replying:

    from_cache    a stored answer, in the shape the caller asked for
    from_flight   a flight already reading the same answer in this worker: follow it
    from_upstream lead a new flight (under the cache's lease across processes)

An uncached call goes straight to its own flight. Each stage is a few lines over the package
that does the work (app/cache/, app/streams/); what they learn goes to the call's ``Trace``,
the one place tracing is attached (app/request/call.py). Resumable streams are app/resume/'s:
a reconnect is answered there, and a stream that asks is logged as its reply begins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

from app.cache.coalesce import Coalescer
from app.cache.entry import Entry
from app.cache.plan import CachePlan, cache_plan
from app.cache.policy import BYPASS, COALESCED, is_cacheable, refresh_early
from app.cache.replay import reply_from_entry
from app.cache.store import AnswerCache, entry_from_flight
from app.core.config import Settings
from app.core.errors import ModelNotAllowed
from app.core.frozen import quick_init
from app.observe.metrics import Metrics
from app.observe.tracing import Tracer, Value
from app.observe.unobserved import UNOBSERVED
from app.request import schema
from app.request.body_readings import BodyReading, BodyReadings, read_body
from app.request.call import CLIENT_CLOSED, Call, Reply
from app.request.headers import check_header_values
from app.resume.service import Resumes, owner_of
from app.resume.writer import Store
from app.streams.alone import answer_alone, answer_stream_alone
from app.streams.drain import Lifecycle
from app.streams.flight import LEASE, Flight
from app.streams.log_memory import LogBudget
from app.streams.reply import Replies, complete_reply, wait_whole
from app.streams.upstream_call import UpstreamCall
from app.tenancy.access import Access, Grant
from app.tenancy.call_grant import KeySettlement, granted_body
from app.tenancy.keyring import GatewayKey
from app.tenancy.prices import PriceTable
from app.upstream import spans
from app.upstream.call_request import request_for
from app.upstream.exchange import Upstream
from app.upstream.retry import Deadline


@quick_init
@dataclass(frozen=True)
class Caller:
    """Who is calling, as ``Gateway.identify`` found: its gateway key, or None when keys are
    off (callers pass through with credentials of their own)."""

    key: GatewayKey | None


@quick_init
@dataclass(frozen=True)
class Plan:
    """One call, decided once: what it asks (``body``: the validated body, None for a
    forwarded route), where it goes (``compute``, made by ``made`` when first asked, so a hit
    makes none: its upstream exchange as a flight's producer, within ``deadline``) and how it
    is cached (``cache``: None when it is not)."""

    call: Call
    body: dict[str, Any] | None
    stream: bool
    deadline: Deadline
    made: partial[UpstreamCall]
    cache: CachePlan | None

    @cached_property
    def compute(self) -> UpstreamCall:
        return self.made()


class Gateway:
    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        answers: AnswerCache | None = None,
        metrics: Metrics = UNOBSERVED,
        access: Access | None = None,
        tracer: Tracer | None = None,
        prices: PriceTable | None = None,
        resume_store: Store | None = None,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.answers = answers
        self.metrics = metrics
        self.access = access  # gateway keys and their limits; None: callers pass through
        self.tracer = tracer  # None: tracing is off (LLMGATE_OTEL_ENDPOINT unset)
        self.prices = prices  # the config file's price table: each call's cost (edge/finish.py)
        self.lifecycle = Lifecycle(settings.stream_buffer_bytes, settings.send_timeout_s)
        # What this worker's kept event logs may hold together (app/streams/log_memory.py).
        self.log_budget = LogBudget(settings.log_memory_bytes, metrics.observe_log_memory)
        # Resumable streams: off without a store (LLMGATE_RESUME_WINDOW_S 0); a stream that
        # asks is logged as its reply begins (app/resume/service.py, Resumes.attach).
        self.resumes = Resumes(settings, resume_store, self.log_budget, metrics)
        self.replies = Replies(settings, self._whereabouts, self.resumes.attach)
        # The last bodies read, and what they decided (app/request/body_readings.py).
        self.readings = BodyReadings()
        self.coalescer = (
            None
            if answers is None
            else Coalescer(settings, answers, self.lifecycle, self.log_budget)
        )

    def identify(self, call: Call) -> Caller:
        """Who is calling: with gateway keys, its key, or InvalidApiKey (401) for a missing,
        unknown, revoked or expired one. From the headers alone, so the web layer asks
        before it reads the body: a stranger's body is neither read nor looked at."""
        if self.tracer is not None:
            call.trace.arrived(self.tracer, call.route, call.method, call.path, call.headers)
        if self.access is None:
            return Caller(None)
        began = time.monotonic()
        key = self.access.authenticate(call.headers)
        call.trace.authorized(began)
        if key is not None:
            call.trace.identified(key.name)
        return Caller(key)

    def handle(self, call: Call, caller: Caller | None = None) -> Reply:
        """The call's reply. ``caller``: what ``identify`` said of this call before its body
        was read; None to ask now."""
        caller = caller if caller is not None else self.identify(call)
        if self.resumes.is_resume(call):  # a reconnect to a resumable stream (docs/streams.md)
            return self.resumes.reply(call, owner_of(call))
        plan = self.plan(call, caller)
        if plan.cache is None:
            return _with_status(self.own_flight(plan), BYPASS)
        return self.from_cache(plan) or self.from_flight(plan) or self.from_upstream(plan)

    # -- the plan ---------------------------------------------------------------------------
    def plan(self, call: Call, caller: Caller) -> Plan:
        """Validate, admit, take the key's grant, and decide where and how the call goes."""
        reading, body, forward, stream = None, None, call.body, False
        if call.route.validated:  # else its body is forwarded as it came
            reading = self._read_body(call)
            body, forward, stream = reading.body, reading.forward, reading.stream
        # Admission control (app/core/admission.py): a slot, and a stream slot for a stream,
        # or a 429 now; routes.py gives them back when the response body is closed. Before
        # the key's grant: a call this worker cannot take costs its caller nothing.
        call.admission.admit(stream)
        grant = None
        if caller.key is not None:
            forward, grant = self._grant(call, caller.key, body, stream, forward)
        # A header no upstream request could carry is refused now, even when the answer is
        # stored; the request itself is built only when the call goes upstream (a miss, a
        # bypass, a refresh: app/upstream/call_request.py).
        check_header_values(call.headers)
        request = partial(
            request_for,
            call,
            forward,
            body=body,
            stream=stream,
            key=None if grant is None else grant.key,
        )
        deadline = Deadline.start(self.settings.deadline_s)
        compute = partial(
            UpstreamCall,
            self.upstream,
            request,
            deadline,
            max_body=self.settings.max_body_bytes,
            max_event_bytes=self.settings.max_event_bytes,
            route=call.route,
            hooks=call.trace,
        )
        cached = None
        if reading is not None and self.answers is not None:
            cached = cache_plan(
                self.settings,
                route=call.route,
                headers=call.headers,
                query=call.query,
                reading=reading,
                upstream=self.upstream.serving_id,
                tenant=None if grant is None else grant.key.tenant,
            )
        return Plan(call, body, stream, deadline, compute, cached)

    def _read_body(self, call: Call) -> BodyReading:
        """The body's reading: the validated document, the bytes to forward, whether it
        streams. Kept while the same bytes keep coming when the cache may serve the call (a
        repeat is what a hit is made of; app/request/body_readings.py), else read each time."""
        reading = self.readings.get(call.route, call.path, call.body)
        if reading is None:
            serves = partial(
                self.upstream.check_serves, route=call.route, path=call.path.removeprefix("/v1")
            )
            reading = read_body(call.body, call.route, self.settings, serves)
            if self.answers is not None and is_cacheable(
                call.route, reading.body, self.settings.cache_mode
            ):
                reading = self.readings.keep(call.route, call.path, call.body, reading)
        call.trace.asked(call.route, call.method, call.path, reading.body, reading.stream)
        return reading

    def _grant(
        self, call: Call, key: GatewayKey, body: dict[str, Any] | None, stream: bool, forward: bytes
    ) -> tuple[bytes, Grant]:
        """Take the call's share of its key's limits (app/tenancy/access.py); the body to
        forward."""
        assert self.access is not None
        model = schema.model_of(body)
        if model is not None and not self.upstream.serves_for(model, key.upstreams):
            raise ModelNotAllowed(
                f"No upstream the key {key.name!r} may use serves the model {model!r}.",
                param="model",
            )
        began = time.monotonic()
        grant = self.access.admit(
            key, model, body, stream=stream, route=call.route, size=len(forward), raw=call.body
        )
        call.trace.authorized(began)
        forward, hide_usage = granted_body(grant, forward, body, call.route, stream)
        call.trace.granted(KeySettlement(self.access, grant, call.trace), hide_usage=hide_usage)
        return forward, grant

    # -- the stages -------------------------------------------------------------------------
    def own_flight(self, plan: Plan) -> Reply:
        """The call's own upstream exchange, shared with nobody: no log beyond what the
        caller has yet to read; made in the caller's own greenlet (app/streams/alone.py)
        but for a stream that asks to be resumable."""
        call = plan.call
        if not plan.stream:
            return answer_alone(call, plan.compute, self.lifecycle, self.replies)
        if not self.resumes.asked(call):  # a resumable stream's log is a flight's listener
            return answer_stream_alone(call, plan.compute, self.lifecycle, self.replies)
        alone = self.lifecycle.flight(
            plan.compute, keep_log=False, request_id=call.trace.request_id
        )
        return self.replies.answer(call, alone.join(), plan.stream)

    def from_cache(self, plan: Plan) -> Reply | None:
        """A stored answer, replayed; a hot entry is renewed in the background."""
        assert plan.cache is not None and self.answers is not None and self.coalescer
        if not plan.cache.directive.lookup:
            return None
        looked = time.monotonic()
        found = self.answers.lookup(plan.cache.key, plan.cache.directive)
        plan.call.trace.looked_up(looked, None if found is None else found[1])
        if found is None:
            return None
        entry, level = found
        reply = self._replay(plan, entry, f"HIT; level={level}")
        if reply is not None and refresh_early(
            now=time.time(),
            expires=entry.created + entry.ttl,
            compute_s=entry.compute_s,
            beta=self.settings.cache_early_refresh_beta,
        ):
            key, directive = plan.cache.key, plan.cache.directive
            self.coalescer.refresh(key, directive, plan.compute, plan.deadline, plan.stream)
        return reply

    def from_flight(self, plan: Plan) -> Reply | None:
        """Follow the flight of an identical call already running in this worker."""
        assert plan.cache is not None and self.coalescer is not None
        flight = self.coalescer.flights.get(plan.cache.key)
        if flight is None:
            return None
        plan.call.trace.followed(flight.span)
        return self._follow(plan, flight, COALESCED)

    def from_upstream(self, plan: Plan) -> Reply:
        """Lead a new flight for the call's key, and follow it."""
        assert plan.cache is not None and plan.body is not None and self.coalescer
        call = plan.call
        flight = self.coalescer.lead(
            plan.cache.key,
            plan.cache.directive,
            plan.compute,
            plan.deadline,
            plan.stream,
            request_id=call.trace.request_id,
            route=call.route,
            include_usage=schema.wants_usage(plan.body),
            span=call.trace.span,
        )
        assert flight is not None  # only a background refresh gives up
        status = COALESCED if flight.source == LEASE else plan.cache.directive.status_on_miss
        return self._follow(plan, flight, status)

    def _follow(self, plan: Plan, flight: Flight, status: str) -> Reply:
        """Answer from a flight: live when the shapes match, else once it is complete."""
        call, listener = plan.call, flight.join()
        if flight.stream == plan.stream:
            return _with_status(self.replies.answer(call, listener, plan.stream), status)
        if not wait_whole(call, listener):
            return Reply(CLIENT_CLOSED, [], b"")
        head = flight.head
        assert head is not None
        entry = entry_from_flight(flight, now=time.time())
        reply = None if entry is None else self._replay(plan, entry, status, age=False)
        if reply is None and (head.body is None or (plan.stream and 200 <= head.status < 300)):
            # A stream too large to keep whole, or an answer with no conversion to this
            # caller's shape (a Responses object to typed events): its own upstream call.
            return _with_status(self.own_flight(plan), BYPASS)
        # Not convertible (an error answer, say): the flight's answer as it is.
        return reply or _with_status(complete_reply(head, call.route), status)

    def _replay(self, plan: Plan, entry: Entry, status: str, *, age: bool = True) -> Reply | None:
        assert plan.body is not None
        reply = reply_from_entry(
            entry,
            route=plan.call.route,
            stream=plan.stream,
            include_usage=schema.wants_usage(plan.body),
            status=status,
            age=int(entry.age(time.time())) if age else None,
        )
        return self.resumes.replayed(plan.call, reply)  # a stored answer is not resumable

    def _whereabouts(self, name: str) -> dict[str, Value]:
        return spans.whereabouts(self.upstream.specs, name)


def _with_status(reply: Reply, status: str) -> Reply:
    """The reply with where its answer came from (the cache's status), for the end of the
    call to bill, count and say (app/edge/finish.py); none for a caller who left."""
    if reply.status != CLIENT_CLOSED:
        reply.cache = status
    return reply
