"""map/imap: input order, per-item errors, bounded concurrency, deadline, progress."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from llmgate_client import BadRequestError, Client, DeadlineExceeded, Outcome
from llmgate_client.batch import iter_map
from llmgate_client.policy import Deadline
from tests.support.scripted_server import Exchange, Request, completion, error_body, serve


class Recorder:
    """A fake call that sleeps, tracks concurrency and fails on request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.calls = 0
        self.deadlines: list[Deadline] = []

    def __call__(self, item: tuple[float, bool], deadline: Deadline) -> str:
        delay, fail = item
        with self.lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)
            self.deadlines.append(deadline)
        try:
            time.sleep(delay)
            if fail:
                raise ValueError(f"boom {delay}")
            return f"done {delay}"
        finally:
            with self.lock:
                self.active -= 1


def test_order_errors_and_bounded_concurrency() -> None:
    items = [(0.001 * (20 - i), i % 5 == 0) for i in range(20)]  # later items finish first
    call = Recorder()
    outcomes = list(iter_map(call, items, max_workers=4))
    assert [o.index for o in outcomes] == list(range(20))
    for o, (delay, fail) in zip(outcomes, items, strict=True):
        if fail:
            assert not o.ok and isinstance(o.error, ValueError) and o.result is None
        else:
            assert o.ok and o.result == f"done {delay}"
    assert call.calls == 20 and call.peak <= 4


def test_deadline_stops_submission_and_marks_the_rest() -> None:
    call = Recorder()
    items = [(0.1, False)] * 50
    started = time.monotonic()
    outcomes = list(iter_map(call, items, max_workers=2, deadline=0.35))
    assert time.monotonic() - started < 0.35 + 0.5
    assert len(outcomes) == 50 and [o.index for o in outcomes] == list(range(50))
    ran = [o for o in outcomes if o.ok]
    skipped = [o for o in outcomes if not o.ok]
    assert 2 <= len(ran) == call.calls < 50
    assert all(isinstance(o.error, DeadlineExceeded) and o.attempts == 0 for o in skipped)
    assert all(d.at is not None for d in call.deadlines)  # each call got the batch deadline


def test_lazy_input_and_progress_on_the_callers_thread() -> None:
    pulled: list[int] = []

    def source() -> Any:
        for i in range(10):
            pulled.append(i)
            yield (0.01, False)

    seen: list[tuple[int, int | None, bool]] = []
    threads: set[str] = set()

    def progress(done: int, total: int | None, outcome: Outcome[Any]) -> None:
        seen.append((done, total, outcome.ok))
        threads.add(threading.current_thread().name)

    gen = iter_map(Recorder(), source(), max_workers=3, progress=progress)
    first = next(gen)
    assert first.index == 0 and len(pulled) <= 3 + 1  # input read only as workers free up
    rest = list(gen)
    assert len(rest) == 9
    assert [d for d, _, _ in seen] == list(range(1, 11)) and {t for _, t, _ in seen} == {None}
    assert threads == {threading.current_thread().name}


def test_sized_input_reports_total() -> None:
    totals: set[int | None] = set()
    list(
        iter_map(
            Recorder(), [(0, False)] * 3, max_workers=2, progress=lambda d, t, o: totals.add(t)
        )
    )
    assert totals == {3}


def test_rejects_zero_workers() -> None:
    with pytest.raises(ValueError):
        list(iter_map(Recorder(), [], max_workers=0))


def test_client_map_against_a_server() -> None:
    def app(request: Request, ex: Exchange) -> None:
        body = request.json()
        n = int(body["messages"][0]["content"])
        time.sleep(0.002 * (30 - n))
        if n % 7 == 3:
            ex.respond(400, error_body(f"bad {n}", "invalid_request_error"))
        else:
            ex.respond(200, completion(f"answer {n}"))

    requests = [
        {"model": "m", "messages": [{"role": "user", "content": str(n)}], "stream": True}
        for n in range(30)
    ]
    with serve(app) as srv, Client(srv.url, "k", pool_size=8) as client:
        outcomes = client.map(requests, max_workers=5)
        assert srv.stats.max_in_flight <= 5 and srv.stats.connections <= 5
        assert srv.stats.requests == 30
    assert [o.index for o in outcomes] == list(range(30))
    for n, o in enumerate(outcomes):
        if n % 7 == 3:
            assert isinstance(o.error, BadRequestError) and o.error.message == f"bad {n}"
        else:
            assert o.ok and o.result is not None and o.result.text == f"answer {n}"


def test_client_map_workers_beyond_the_pool_wait_for_connections() -> None:
    def app(request: Request, ex: Exchange) -> None:
        time.sleep(0.01)
        ex.respond(200, completion("x"))

    with serve(app) as srv, Client(srv.url, "k", pool_size=2) as client:
        outcomes = client.map([{"model": "m", "messages": []}] * 20, max_workers=6)
        assert all(o.ok for o in outcomes)
        assert srv.stats.connections <= 2


def test_client_map_deadline_cuts_calls_in_flight() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.wait_gone(10)

    with serve(app) as srv, Client(srv.url, "k", pool_size=3) as client:
        started = time.monotonic()
        outcomes = client.map([{"model": "m", "messages": []}] * 10, deadline=0.4)
        assert time.monotonic() - started < 0.4 + 1.0
        assert srv.stats.requests == 3
    assert all(isinstance(o.error, DeadlineExceeded) for o in outcomes)
    assert [o.attempts for o in outcomes] == [1, 1, 1] + [0] * 7


def test_bad_items_are_reported_in_place() -> None:
    def app(request: Request, ex: Exchange) -> None:
        ex.respond(200, completion("x"))

    items: list[Any] = [{"model": "m", "messages": []}, ValueError("line 2 is not JSON"), "nope"]
    with serve(app) as srv, Client(srv.url, "k") as client:
        outcomes = client.map(items)
    assert outcomes[0].ok
    assert isinstance(outcomes[1].error, ValueError) and "line 2" in str(outcomes[1].error)
    assert isinstance(outcomes[2].error, TypeError)
    # Neither bad item was sent: no attempt (the good one made one).
    assert [o.attempts for o in outcomes] == [1, 0, 0]
    assert srv.stats.requests == 1
