"""The memory budget of kept event logs (app/streams/log_memory.py), in one process: what an event
is
counted at against what tracemalloc sees, the budget's accounting, flights sharing it
(refused, given up midway with a follower reading, given back), and the gateway's use of it
(no-store and a full budget keep no log, take no followers and no lease)."""

from __future__ import annotations

import gc
import json
import tracemalloc

import gevent
import gevent.event
import pytest

from app.cache.coalesce import Coalescer, Flights
from app.cache.policy import Directive
from app.cache.store import AnswerCache, entry_from_flight
from app.cache.tiered import TieredCache
from app.core.config import Settings
from app.gateway import Gateway
from app.observe.metrics import Metrics
from app.store.memory import MemoryBackend
from app.streams.flight import Finished, Flight, Head
from app.streams.log_memory import REPORT_STEP, LogBudget, event_cost
from app.upstream.exchange import Upstream
from app.upstream.retry import Deadline
from llmgate_wire import sse
from tests.support.flights import script

HEAD = Head(200, [("Content-Type", "text/event-stream")], 1, None)
KEY = "llmgate:v1:" + "0" * 64


def _coalescer(gateway: Gateway) -> Coalescer:
    """The gateway's flights for cacheable calls (it has them: an answer cache is given)."""
    assert gateway.coalescer is not None
    return gateway.coalescer


def _chat_chunk(i: int) -> bytes:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
             "model": "sim-model", "choices": [{"index": 0, "delta": {"content": f" w{i}"},
                                                "finish_reason": None}]}  # fmt: skip
    return sse.encode(json.dumps(chunk, separators=(",", ":")))


def _typed_event(i: int) -> bytes:
    delta = {"type": "response.output_text.delta", "sequence_number": i, "delta": " w"}
    return sse.encode(json.dumps(delta), event="response.output_text.delta")


# -- what a kept event costs ---------------------------------------------------------------
@pytest.mark.parametrize("make", [_chat_chunk, _typed_event, lambda i: sse.encode("x" * 4000)])
def test_an_events_cost_is_what_tracemalloc_sees_it_hold(make) -> None:
    """The log of 5,000 decoded events, as a flight keeps it: the estimate within 10 % of the
    memory Python allocated for it (a chat chunk: ~3x its bytes)."""
    stream = b"".join(make(i) for i in range(5000))
    decoder = sse.Decoder()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log: list[sse.Event] = []
        for at in range(0, len(stream), 4096):
            log.extend(decoder.feed(stream[at : at + 4096]))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = sum(map(event_cost, log))
    assert len(log) == 5000
    assert 0.9 * held <= counted <= 1.1 * held, (counted / len(log), held / len(log))


# -- the budget ----------------------------------------------------------------------------
def test_the_budget_holds_what_fits_and_counts_each_refusal() -> None:
    told: list[tuple[str, int]] = []
    budget = LogBudget(1000, lambda what, held: told.append((what, held)))
    assert budget.admit() and budget.take(600) and budget.take(400)
    assert not budget.take(1)  # full to the byte
    assert not budget.admit()
    budget.give_back(400)
    assert budget.admit() and not budget.take(401) and budget.take(400)
    assert budget.held == 1000
    assert told == [("refused_running", 1000), ("refused_start", 1000), ("refused_running", 600)]
    with pytest.raises(ValueError):
        budget.give_back(1001)  # more than is held: a bookkeeping bug, never silent


def test_the_held_bytes_are_reported_in_steps_and_when_the_budget_is_empty() -> None:
    told: list[tuple[str, int]] = []
    budget = LogBudget(10 * REPORT_STEP, lambda what, held: told.append((what, held)))
    for _ in range(4):
        budget.take(REPORT_STEP // 4)
    assert told == [("held", REPORT_STEP)]
    budget.take(100)
    budget.give_back(REPORT_STEP + 100)
    assert told[-1] == ("held", 0)
    # Less than a step was held when last told (at a refusal): emptied, it is told too.
    told.clear()
    small = LogBudget(1000, lambda what, held: told.append((what, held)))
    small.take(500)
    small.take(600)
    small.give_back(500)
    assert told == [("refused_running", 500), ("held", 0)]


def test_a_zero_budget_keeps_no_log() -> None:
    budget = LogBudget(0)
    assert not budget.admit() and not budget.take(1)


# -- flights sharing a budget --------------------------------------------------------------
def _events(count: int, pad: int = 100) -> list[sse.Event]:
    return sse.Decoder().feed(b"".join(sse.encode(f"{i} " + "x" * pad) for i in range(count)))


def _drain(listener) -> list:
    out = []
    while isinstance(item := listener.next_item(5), sse.Event):
        out.append(item)
    return [*out, item]


def test_a_flight_gives_its_log_up_midway_and_a_follower_still_reads_every_event() -> None:
    """The budget fills while a follower lags behind the leader: the flight stops logging (not
    stored, no new followers), yet both listeners read every event, in order, with no gap."""
    events = _events(60)
    budget = LogBudget(sum(map(event_cost, events[:30])))
    flights = Flights()
    flight = Flight(script(HEAD, *[x for e in events for x in (e, "sleep")], Finished(b"")),
                    log_budget=budget, buffer_limit=1 << 20, send_timeout=5)  # fmt: skip
    flights.put(KEY, flight)
    leader, follower = flight.join(), flight.join()
    got = [leader.next_item(5) for _ in range(10)]
    assert flights.get(KEY) is flight  # room so far: identical requests may join
    got += [leader.next_item(5) for _ in range(30)]
    assert flight.log_given_up == "log_memory" and not flight.log_whole
    assert flights.get(KEY) is None
    assert budget.held > 0  # the follower has yet to read the first 40 events: still held
    assert got + _drain(leader)[:-1] == events
    assert _drain(follower)[:-1] == events
    assert entry_from_flight(flight, now=0.0) is None
    leader.leave()
    follower.leave()
    assert budget.held == 0


def test_a_flight_starting_on_a_full_budget_logs_nothing_and_the_first_gets_it_back() -> None:
    events = _events(20)
    budget = LogBudget(sum(map(event_cost, events)) + 100)
    hold = gevent.event.Event()
    first = Flight(script(HEAD, *events, hold, Finished(b"")), log_budget=budget)
    second = Flight(script(HEAD, *events, Finished(b"")), log_budget=budget)
    reading = [first.join(), second.join()]
    assert len(_drain(reading[1])) == 21  # the first filled the budget
    assert first.log_whole and not second.log_whole and second.log_given_up == "log_memory"
    held = budget.held
    assert held == sum(map(event_cost, events))
    hold.set()
    assert len(_drain(reading[0])) == 21
    assert budget.held == held  # ended, but its listener has not left: the log is still read
    reading[0].leave()
    reading[1].leave()
    assert budget.held == 0
    assert first.events == events  # its log was whole to the end


def test_a_flight_left_while_it_stores_gives_its_share_back_once_stored() -> None:
    """The last caller leaves once the answer is in but before it is stored (a Memcached
    write yields): the store still reads the whole log, and the share comes back after."""
    events = _events(5)
    budget = LogBudget(1 << 20)
    stored: list[int] = []

    def store(flight: Flight) -> None:
        gevent.sleep(0.05)
        stored.append(len(flight.events))

    flight = Flight(script(HEAD, *events, Finished(b"")), on_done=store, log_budget=budget)
    listener = flight.join()
    assert [listener.next_item(5) for _ in events] == events
    listener.leave()
    assert not flight.cancelled and budget.held > 0  # the answer is being stored
    gevent.sleep(0.1)
    assert stored == [5] and budget.held == 0


def test_a_cancelled_flight_gives_its_share_back() -> None:
    events = _events(5)
    budget = LogBudget(1 << 20)
    flight = Flight(script(HEAD, *events, *["sleep"] * 1000), log_budget=budget)
    listener = flight.join()
    assert listener.next_item(5) == events[0]
    assert budget.held > 0
    listener.leave()  # the only caller leaves mid-stream: the upstream call is cancelled
    assert flight.cancelled and budget.held == 0


def test_a_flight_whose_listener_never_left_gives_its_share_back_when_collected() -> None:
    budget = LogBudget(1 << 20)
    flight = Flight(script(HEAD, *_events(5), Finished(b"")), log_budget=budget)
    listener = flight.join()
    listener.wait_complete(5)  # a caller that is dropped without leave()
    assert budget.held > 0
    del flight, listener
    gc.collect()
    assert budget.held == 0


# -- the gateway: no-store and a full budget -----------------------------------------------
class Leases(AnswerCache):
    """The in-process cache as a shared one, counting lease attempts."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        super().__init__(TieredCache(MemoryBackend(1 << 20), None, l1_ttl=60), settings,
                         shared=True, metrics=metrics)  # fmt: skip
        self.leases = 0

    def try_lease(self, key: str) -> bool | None:
        self.leases += 1
        return super().try_lease(key)


def _gateway(**settings) -> tuple[Gateway, Leases, Metrics]:
    config = Settings(upstream_url="http://127.0.0.1:9/v1", cache_lease_s=5, **settings)
    metrics = Metrics(multiproc_dir="")
    answers = Leases(config, metrics)
    return Gateway(config, Upstream(config), answers, metrics), answers, metrics


def _chat_stream(flight: Flight) -> None:
    flight.publish_head(HEAD)
    for event in sse.Decoder().feed(_chat_chunk(0) + b"data: [DONE]\n\n"):
        flight.publish(event)
    flight.finish()


def _start(gateway: Gateway, directive: Directive, stream: bool = True, **kw) -> Flight | None:
    return _coalescer(gateway).lead(KEY, directive, _chat_stream, Deadline.start(10), stream, **kw)


def _answer(flight: Flight) -> None:
    listener = flight.join()
    listener.wait_complete(5)
    listener.leave()
    gevent.sleep(0)


def test_a_no_store_call_keeps_no_log_takes_no_followers_and_no_lease() -> None:
    gateway, answers, _ = _gateway()
    flight = _start(gateway, Directive(store=False))
    assert flight is not None and not flight.keep_log
    assert _coalescer(gateway).flights.get(KEY) is None  # an identical request starts its own
    assert answers.leases == 0  # nobody elsewhere waits for an entry that will never come
    _answer(flight)
    assert answers.lookup(KEY, Directive()) is None
    assert _start(gateway, Directive(store=False), background=True) is None  # no refresh
    # The control: the same call without no-store is shared, leased and stored.
    shared = _start(gateway, Directive())
    assert (
        shared is not None
        and _coalescer(gateway).flights.get(KEY) is shared
        and answers.leases == 1
    )
    _answer(shared)
    assert answers.lookup(KEY, Directive()) is not None


def test_a_stream_starting_on_a_full_budget_is_its_callers_alone_and_counted() -> None:
    gateway, answers, metrics = _gateway(log_memory_bytes=0)
    flight = _start(gateway, Directive())
    assert (
        flight is not None and not flight.keep_log and _coalescer(gateway).flights.get(KEY) is None
    )
    assert answers.leases == 0
    _answer(flight)
    assert answers.lookup(KEY, Directive()) is None
    refused = metrics.registry.get_sample_value
    assert refused("llmgate_event_logs_refused_total", {"when": "start"}) == 1
    # A non-stream answer holds its body whatever the budget: it is still shared.
    whole = _start(gateway, Directive(), stream=False)
    assert whole is not None and _coalescer(gateway).flights.get(KEY) is whole


def test_a_stream_that_runs_out_of_budget_is_counted_and_not_stored() -> None:
    gateway, answers, metrics = _gateway(log_memory_bytes=200)  # under one chat chunk
    flight = _start(gateway, Directive())
    assert flight is not None and flight.keep_log  # room at its start
    _answer(flight)
    assert flight.log_given_up == "log_memory" and answers.lookup(KEY, Directive()) is None
    sample = metrics.registry.get_sample_value
    assert sample("llmgate_event_logs_refused_total", {"when": "running"}) == 1
    assert sample("llmgate_cache_not_stored_total", {"reason": "log_memory"}) == 1
    assert gateway.log_budget.held == 0


def test_the_metrics_show_the_bytes_held_and_count_the_refusals() -> None:
    metrics = Metrics(multiproc_dir="")
    sample = metrics.registry.get_sample_value
    budget = LogBudget(2 * REPORT_STEP, metrics.observe_log_memory)
    budget.take(REPORT_STEP)
    assert sample("llmgate_event_log_bytes") == REPORT_STEP
    assert not budget.take(REPORT_STEP + 1) and not budget.take(REPORT_STEP + 1)
    assert sample("llmgate_event_logs_refused_total", {"when": "running"}) == 2
    assert sample("llmgate_event_logs_refused_total", {"when": "start"}) == 0
    budget.give_back(REPORT_STEP)
    assert sample("llmgate_event_log_bytes") == 0
