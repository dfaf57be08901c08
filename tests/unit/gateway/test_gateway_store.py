"""Gateway planning, coalescing and storing, in one process with the in-process cache.

The answers come from scripted producers (no sockets); what was stored is read from the L1
backend itself, never through the gateway's own lookup.
"""

from __future__ import annotations

import contextlib
import json
import time

import gevent
import gevent.event
import pytest

from app import gateway as gateway_module
from app.cache.coalesce import Coalescer
from app.cache.policy import Directive
from app.cache.store import AnswerCache, entry_from_flight
from app.cache.tiered import TieredCache
from app.core.config import Settings
from app.core.errors import BadRequest, UpstreamReset
from app.gateway import Caller, Gateway
from app.request import routes
from app.request.call import Call
from app.store.memory import MemoryBackend
from app.streams.flight import ClientGone, Finished, Flight, Head
from app.streams.upstream_call import UpstreamCall
from app.upstream.exchange import Upstream
from app.upstream.retry import Deadline
from llmgate_wire import sse

SETTINGS = Settings(upstream_url="http://127.0.0.1:9/v1", cache_lease_s=0)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
STREAM_HEAD = Head(200, [("Content-Type", "text/event-stream")], 1, None)


def _coalescer(gateway: Gateway) -> Coalescer:
    """The gateway's flights for cacheable calls (it has them: an answer cache is given)."""
    assert gateway.coalescer is not None
    return gateway.coalescer


def _gateway() -> tuple[Gateway, MemoryBackend]:
    l1 = MemoryBackend(1 << 20)
    answers = AnswerCache(TieredCache(l1, None, l1_ttl=60), SETTINGS, shared=False)
    return Gateway(SETTINGS, Upstream(SETTINGS), answers), l1


def _call(headers=(), query: str = "", body: dict | None = None, route: str = "chat") -> Call:
    raw = json.dumps(body or BODY).encode()
    return Call(routes.of_name(route), "POST", "/v1/chat/completions", query, list(headers), raw)


def _plan(gateway: Gateway, **kw):
    """The cache key and directive of the call's plan (Gateway.plan), or None: not cached."""
    cached = gateway.plan(_call(**kw), Caller(None)).cache
    return None if cached is None else (cached.key, cached.directive)


# -- planning ------------------------------------------------------------------------------
def test_plan_keys_by_tenant_query_and_body() -> None:
    gateway, _ = _gateway()
    base = _plan(gateway, headers=[("api-key", "a")])
    assert base is not None
    key, directive = base
    assert directive == Directive()
    assert _plan(gateway, headers=[("api-key", "a")]) == base
    assert _plan(gateway, headers=[("api-key", "b")])[0] != key
    assert _plan(gateway, headers=[("x-api-key", "a")])[0] != key
    assert _plan(gateway, headers=[("api-key", "a")], query="v=2")[0] != key
    other = {**BODY, "messages": [{"role": "user", "content": "bye"}]}
    assert _plan(gateway, headers=[("api-key", "a")], body=other)[0] != key


def test_plan_skips_what_is_not_cacheable() -> None:
    gateway, _ = _gateway()
    assert _plan(gateway, body={**BODY, "temperature": 1}) is None
    assert _plan(gateway, route="passthrough") is None
    no_cache = Gateway(SETTINGS, Upstream(SETTINGS), None)
    assert _plan(no_cache) is None


def test_plan_reads_cache_control() -> None:
    gateway, _ = _gateway()
    _, directive = _plan(gateway, headers=[("Cache-Control", "no-store")])
    assert directive.store is False and directive.lookup is True


def test_a_header_no_request_could_carry_is_refused_even_when_the_answer_is_stored() -> None:
    """A hit builds no upstream request (its headers are built only when the call goes
    upstream), yet a header value with a CR, LF or NUL is still a 400 before any answer."""
    gateway, l1 = _gateway()
    sent = [("api-key", "a"), ("X-Custom", "fine")]
    plan = gateway.plan(_call(headers=sent), Caller(None))
    assert plan.cache is not None
    answer = Head(200, [("Content-Type", "application/json")], 1, json.dumps(COMPLETION).encode())
    _run(gateway, plan.cache.key, answer, stream=False)
    assert l1.get(plan.cache.key) is not None
    hit = gateway.handle(_call(headers=sent))
    assert hit.status == 200 and hit.cache is not None and hit.cache.startswith("HIT")
    for value in ("a\rb", "a\nb", "a\x00b"):
        with pytest.raises(BadRequest) as refused:
            gateway.handle(_call(headers=[("api-key", "a"), ("X-Custom", value)]))
        assert (refused.value.status, refused.value.code) == (400, "invalid_header_value")
    # A header that never goes upstream is not judged: still the stored answer.
    again = gateway.handle(_call(headers=[*sent, ("X-Forwarded-For", "a\rb")]))
    assert again.cache is not None and again.cache.startswith("HIT")


# -- storing: only complete, successful answers --------------------------------------------
def _run(gateway: Gateway, key: str, *steps, stream: bool = True) -> Flight:
    def produce(flight: Flight) -> None:
        for step in steps:
            if isinstance(step, Head):
                flight.publish_head(step)
            elif isinstance(step, bytes):
                for event in sse.Decoder().feed(step):
                    flight.publish(event)
            elif isinstance(step, Finished):
                flight.finish(step.leftover)
            elif isinstance(step, BaseException):
                raise step

    flight = _coalescer(gateway).lead(key, Directive(), produce, Deadline.start(10), stream)
    assert flight is not None
    listener = flight.join()
    with contextlib.suppress(Exception):  # failures are what some cases are about
        listener.wait_complete(5)
    listener.leave()
    gevent.sleep(0)  # on_done runs in the flight's greenlet as it ends
    return flight


KEY = "llmgate:v1:" + "0" * 64
GOOD = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


def test_a_complete_stream_is_stored_and_leaves_the_flight_map() -> None:
    gateway, l1 = _gateway()
    flight = _run(gateway, KEY, STREAM_HEAD, GOOD, Finished(b""))
    assert l1.get(KEY) is not None
    assert _coalescer(gateway).flights.get(KEY) is None
    entry = entry_from_flight(flight, now=0)
    assert entry is not None
    assert entry.events == tuple(e.raw for e in sse.Decoder().feed(GOOD))


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param((STREAM_HEAD, GOOD[:48], Finished(b"")), id="no-done"),
        pytest.param((STREAM_HEAD, GOOD[:48], UpstreamReset("cut")), id="reset-mid-stream"),
        pytest.param((STREAM_HEAD, GOOD[:48], ValueError("bug")), id="exception-mid-stream"),
        pytest.param(
            (STREAM_HEAD, b'data: {"error":{"message":"x"}}\n\n' + GOOD[48:], Finished(b"")),
            id="error-event",
        ),
        pytest.param((STREAM_HEAD, GOOD, Finished(b"data: tail")), id="leftover"),
        pytest.param((Head(429, [], 1, b'{"error":{}}'),), id="429"),
        pytest.param((Head(500, [], 1, b'{"error":{}}'),), id="500"),
        pytest.param((Head(200, [], 1, b"\xff\xfe"),), id="not-utf8"),
    ],
)
def test_partial_or_failed_answers_are_never_stored(steps) -> None:
    gateway, l1 = _gateway()
    _run(gateway, KEY, *steps, stream=steps[0].body is None)
    assert l1.get(KEY) is None
    assert l1.stats()["sets"] == 0


def test_a_flight_abandoned_by_its_caller_is_not_stored() -> None:
    gateway, l1 = _gateway()

    def produce(flight: Flight) -> None:
        flight.publish_head(STREAM_HEAD)
        for event in sse.Decoder().feed(GOOD[:48]):
            flight.publish(event)
        gevent.sleep(30)

    flight = _coalescer(gateway).lead(KEY, Directive(), produce, Deadline.start(60), True)
    assert flight is not None
    listener = flight.join()
    assert listener.wait_first_event(5)
    listener.leave()
    gevent.sleep(0)
    assert flight.cancelled
    assert l1.get(KEY) is None and l1.stats()["sets"] == 0


def test_a_stream_larger_than_an_entry_is_not_stored_and_takes_no_followers() -> None:
    settings = Settings(upstream_url="http://127.0.0.1:9/v1", cache_lease_s=0,
                        cache_max_entry_bytes=1024)  # fmt: skip
    l1 = MemoryBackend(1 << 20)
    answers = AnswerCache(TieredCache(l1, None, l1_ttl=60), settings, shared=False)
    gateway = Gateway(settings, Upstream(settings), answers)
    big = b"".join(sse.encode(json.dumps({"i": i, "pad": "x" * 40})) for i in range(100))
    flight = _run(gateway, KEY, STREAM_HEAD, big, GOOD, Finished(b""))
    assert flight.complete and not flight.log_whole
    assert l1.get(KEY) is None


# -- coalescing ----------------------------------------------------------------------------
def test_followers_of_a_flight_share_it_and_each_read_every_event() -> None:
    gateway, l1 = _gateway()
    events = sse.Decoder().feed(GOOD)
    release = gevent.event.Event()

    def produce(flight: Flight) -> None:
        flight.publish_head(STREAM_HEAD)
        flight.publish(events[0])
        release.wait(5)
        flight.publish(events[1])
        flight.finish()

    leader = _coalescer(gateway).lead(KEY, Directive(), produce, Deadline.start(10), True)
    assert leader is not None
    listeners = [leader.join()]
    listeners[0].wait_first_event(5)
    for _ in range(3):
        found = _coalescer(gateway).flights.get(KEY)
        assert found is leader  # identical requests join, nobody starts a second call
        listeners.append(found.join())
    release.set()
    for listener in listeners:
        got = []
        while not isinstance(item := listener.next_item(5), Finished):
            got.append(item)
        assert got == events
        listener.leave()
    gevent.sleep(0)
    assert _coalescer(gateway).flights.get(KEY) is None and l1.get(KEY) is not None


@pytest.mark.parametrize("stream", [True, False])
def test_the_entry_is_stored_before_any_listener_learns_the_answer_is_complete(stream) -> None:
    """Read your own write: a caller that repeats its request as soon as it has the whole
    answer finds the entry, not the finished flight still registered (COALESCED)."""

    class YieldingStore(MemoryBackend):
        def set(self, key: str, value: bytes, ttl: int) -> bool:
            gevent.sleep(0.01)  # as a Memcached write does: other greenlets run meanwhile
            return super().set(key, value, ttl)

    l1 = YieldingStore(1 << 20)
    answers = AnswerCache(TieredCache(l1, None, l1_ttl=60), SETTINGS, shared=False)
    gateway = Gateway(SETTINGS, Upstream(SETTINGS), answers)
    head = STREAM_HEAD if stream else Head(200, [("Content-Type", "application/json")], 1, b"{}")

    def produce(flight: Flight) -> None:
        flight.publish_head(head)
        if stream:
            for event in sse.Decoder().feed(GOOD):
                flight.publish(event)
            flight.finish()

    flight = _coalescer(gateway).lead(KEY, Directive(), produce, Deadline.start(10), stream)
    assert flight is not None
    listener = flight.join()
    listener.wait_complete(5)  # no yield after this: what the caller sees, it sees now
    assert l1.get(KEY) is not None
    assert _coalescer(gateway).flights.get(KEY) is None


# -- a lease waiter replays another process's entry in its own caller's shape --------------
COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"},
                 "finish_reason": "stop"}],
}  # fmt: skip


def _published(stream: bool, entry) -> tuple[bool, Flight]:
    from app.cache.coalesce import publish_entry

    result: list[bool] = []

    def produce(flight: Flight) -> None:
        result.append(publish_entry(flight, entry, route=routes.CHAT))

    flight = Flight(produce)
    flight.stream = stream
    listener = flight.join()
    with contextlib.suppress(Exception):
        listener.wait_complete(5)
    return result[0], flight


def test_a_stored_completion_reaches_a_stream_waiter_as_events() -> None:
    from app.cache.entry import Entry

    body = json.dumps(COMPLETION).encode()
    ok, flight = _published(True, Entry(0, 0, 60, 200, "application/json", body=body))
    assert ok and flight.head is not None and flight.head.body is None
    assert flight.head.headers == [("Content-Type", "text/event-stream")]
    events = flight.events
    assert events[-1].is_done
    text = "".join(
        (e.json()["choices"][0]["delta"].get("content") or "")
        for e in events[:-1]
        if e.json()["choices"]
    )
    assert text == "hi there"


def test_a_stored_stream_reaches_a_json_waiter_as_a_completion() -> None:
    from app.cache.chunks import chat_to_events
    from app.cache.entry import Entry

    events = tuple(chat_to_events(COMPLETION, include_usage=False))
    ok, flight = _published(False, Entry(0, 0, 60, 200, "text/event-stream", events=events))
    assert ok and flight.head is not None and flight.head.body is not None
    assert json.loads(flight.head.body)["choices"][0]["message"]["content"] == "hi there"
    assert flight.head.headers == [("Content-Type", "application/json")]


def test_an_entry_that_cannot_take_the_waiters_shape_is_not_published() -> None:
    from app.cache.entry import Entry

    embedding = json.dumps({"object": "list", "data": []}).encode()
    from app.cache.coalesce import publish_entry

    flight = Flight(lambda f: None)
    flight.stream = True
    entry = Entry(0, 0, 60, 200, "application/json", body=embedding)
    assert publish_entry(flight, entry, route=routes.EMBEDDINGS) is False
    assert flight.head is None


def _holder_finishes_in_between(*, add_then_gone: bool = False):
    """An in-process shared cache whose key's lease holder stores its entry and releases its
    lease just before a caller's lease attempt (the caller's lookup came before the store).
    ``add_then_gone``: the release lands between the caller's `add` and its `get`, which
    try_lease then answers with None. The settings, the L1, the holder's entry, the cache."""
    from app.cache.entry import Entry
    from app.cache.keys import lease_key

    settings = Settings(upstream_url="http://127.0.0.1:9/v1", cache_lease_s=5)
    l1 = MemoryBackend(1 << 20)
    entry = Entry(
        time.time(), 0.5, 60, 200, "application/json", body=json.dumps(COMPLETION).encode()
    )

    class HolderFinishesInBetween(AnswerCache):
        def try_lease(self, key: str) -> bool | None:
            if l1.get(key) is None:
                l1.set(key, entry.to_bytes(), 60)  # the holder stores ...
                l1.delete(lease_key(key))  # ... then releases its lease
                if add_then_gone:
                    return None  # what try_lease answers then: `add` failed, `get` found none
            return super().try_lease(key)

    answers = HolderFinishesInBetween(TieredCache(l1, None, l1_ttl=60), settings, shared=True)
    assert l1.add(lease_key(KEY), b"1", 5)  # the holder's lease
    return settings, l1, entry, answers


@pytest.mark.parametrize("released", ["before the add", "between the add and the get"])
def test_a_waiter_that_finds_the_lease_gone_just_after_the_holder_stored_replays_the_entry(
    released: str,
) -> None:
    """The holder stores its entry and then releases its lease. A waiter whose lookup came
    just before the store and whose lease attempt just after the release either won the free
    lease, or (released between its `add` and its `get`) saw no lease at all, which reads as
    Memcached trouble: either way it called the upstream a second time (CI: 2 upstream calls
    for 200 identical streams over three instances). It looks once more before computing."""
    from app.cache.coalesce import lease_wait_producer

    _, _, entry, answers = _holder_finishes_in_between(
        add_then_gone=released == "between the add and the get"
    )
    computed: list[Flight] = []
    producer = lease_wait_producer(answers, KEY, Deadline.start(10), computed.append)
    flight = Flight(producer)
    listener = flight.join()
    with contextlib.suppress(ClientGone):  # what a compute that publishes nothing ends in
        listener.wait_complete(5)
    assert computed == []  # no second upstream call
    assert flight.source == "cache" and flight.head is not None and flight.head.body == entry.body
    # A lease it took is released when its flight is done.
    assert flight.lease_held == (released == "before the add")


def test_a_new_leader_that_wins_the_lease_just_after_the_holder_stored_replays_the_entry() -> None:
    """A request whose lookup missed just before the holder stored its entry, and whose
    lease attempt came just after the holder released: it holds the lease, and would call
    the upstream a second time. It looks once more."""
    from app.cache.keys import lease_key

    settings, l1, entry, answers = _holder_finishes_in_between()
    gateway = Gateway(settings, Upstream(settings), answers)
    computed: list[Flight] = []
    flight = _coalescer(gateway).lead(KEY, Directive(), computed.append, Deadline.start(10), False)
    assert flight is not None and flight.source == "lease"  # the caller's status: COALESCED
    listener = flight.join()
    with contextlib.suppress(ClientGone):  # what a compute that publishes nothing ends in
        listener.wait_complete(5)
    listener.leave()
    gevent.sleep(0)  # on_done runs in the flight's greenlet as it ends
    assert computed == []  # no second upstream call
    assert flight.source == "cache" and flight.head is not None and flight.head.body == entry.body
    assert l1.get(lease_key(KEY)) is None  # the lease it took is released


def test_a_plans_upstream_call_is_made_only_when_asked(monkeypatch) -> None:
    # A hit that renews nothing never goes upstream: its plan makes no UpstreamCall. One that
    # does gets one, the same each time asked, within the deadline the plan started.
    made: list[UpstreamCall] = []

    class Counted(UpstreamCall):
        def __init__(self, *args, **kwargs) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gateway_module, "UpstreamCall", Counted)
    gateway, _ = _gateway()
    plan = gateway.plan(_call(), Caller(None))
    assert made == []
    compute = plan.compute
    assert made == [compute] and plan.compute is compute
    assert compute._deadline is plan.deadline
